"""keras-hub's ViT, DINOv2, DINOv3 and SigLIP presets and `.keras` files load into keras_vit and
compute what keras-hub computes: random-initialised keras-hub models, every weight perturbed,
written by keras-hub itself, compared in float32 on keras-hub's own normalised input."""

import json
import re
import sys
import types
import zipfile

import keras
import numpy as np
import pytest
from helpers import images, perturb, sample_photos

import keras_vit
from keras_vit.checkpoints import CheckpointError

keras_hub = pytest.importorskip("keras_hub")
# The ViT tests run on TensorFlow only (the reader is NumPy); the later families' on every backend.
tensorflow_only = pytest.mark.tensorflow_only
TOLERANCE = 1e-4


def classifier(
    image_shape=(32, 32, 3),
    scale=1 / 127.5,
    offset=-1.0,
    pooling="token",
    intermediate_dim=None,
    biases=True,
    num_classes=5,
):
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.ViTBackbone(
        image_shape=image_shape,
        patch_size=8,
        num_layers=2,
        num_heads=4,
        hidden_dim=64,
        mlp_dim=128,
        use_class_token=pooling == "token",
        use_mha_bias=biases,
        use_mlp_bias=biases,
        use_patch_bias=biases,
    )
    converter = keras_hub.layers.ViTImageConverter(image_size=image_shape[:2], scale=scale, offset=offset)
    model = keras_hub.models.ViTImageClassifier(
        backbone,
        num_classes=num_classes,
        pooling=pooling,
        intermediate_dim=intermediate_dim,
        preprocessor=keras_hub.models.ViTImageClassifierPreprocessor(image_converter=converter),
    )
    return perturb(model)


def reference_logits(model, pixels, scale, offset):
    normalised = pixels * np.asarray(scale, "float32") + np.asarray(offset, "float32")
    return keras.ops.convert_to_numpy(model(normalised))


@tensorflow_only
def test_a_classifier_preset_and_its_keras_file_give_keras_hub_logits(tmp_path):
    model = classifier()
    model.save_to_preset(tmp_path / "preset")
    model.save(tmp_path / "classifier.keras")
    pixels = sample_photos(32)
    expected = reference_logits(model, pixels, 1 / 127.5, -1.0)
    with zipfile.ZipFile(tmp_path / "classifier.keras") as archive:
        archive.extractall(tmp_path / "unzipped")
    for source in (tmp_path / "preset", tmp_path / "classifier.keras", tmp_path / "unzipped"):
        ours = keras_vit.saving.load_model(source)  # what every command that takes a MODEL calls
        c = ours.config
        assert (c.image_size, c.patch_size, c.hidden_size, c.num_layers, c.num_heads) == ((32, 32), (8, 8), 64, 2, 4)
        assert (c.num_classes, c.classifier, c.input_mean, c.input_std) == (5, "token", (127.5,) * 3, (127.5,) * 3)
        np.testing.assert_allclose(keras.ops.convert_to_numpy(ours(pixels)), expected, atol=TOLERANCE)


@tensorflow_only
def test_gap_pre_logits_no_biases_a_wide_image_and_channel_normalisation(tmp_path):
    """No class token (the mean of the patch tokens), a tanh pre-logits layer, no biases, a
    32x48 image and ImageNet's per-channel mean and standard deviation."""
    mean, std = np.array([0.485, 0.456, 0.406]) * 255, np.array([0.229, 0.224, 0.225]) * 255
    scale, offset = (1 / std).tolist(), (-mean / std).tolist()
    model = classifier((32, 48, 3), scale, offset, pooling="gap", intermediate_dim=48, biases=False)
    model.save(tmp_path / "classifier.keras")
    ours = keras_vit.ViT.from_checkpoint(tmp_path / "classifier.keras")
    c = ours.config
    assert (c.image_size, c.classifier, c.representation_size, c.qkv_bias) == ((32, 48), "gap", 48, False)
    np.testing.assert_allclose(c.input_mean, mean, rtol=1e-6)
    np.testing.assert_allclose(c.input_std, std, rtol=1e-6)
    pixels = images(2, (32, 48))
    expected = reference_logits(model, pixels, scale, offset)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(ours(pixels)), expected, atol=TOLERANCE)


@tensorflow_only
def test_the_mean_and_variance_of_early_kaggle_converters(tmp_path):
    """Early keras-hub presets wrote `mean` and `variance` beside `scale`: keras-hub computes
    (pixels * scale - mean) / sqrt(variance)."""
    classifier().save_to_preset(tmp_path / "preset")
    path = tmp_path / "preset" / "image_converter.json"
    converter = json.loads(path.read_text())
    converter["config"].update(scale=1 / 255, offset=None, mean=[0.485, 0.456, 0.406], variance=[0.0625] * 3)
    path.write_text(json.dumps(converter))
    config = keras_vit.ViT.from_checkpoint(tmp_path / "preset").config
    np.testing.assert_allclose(config.input_mean, [0.485 * 255, 0.456 * 255, 0.406 * 255], rtol=1e-6)
    np.testing.assert_allclose(config.input_std, [0.25 * 255] * 3, rtol=1e-6)


@tensorflow_only
def test_a_backbone_preset_fine_tunes_at_a_larger_resolution(tmp_path):
    """A backbone alone (what most Kaggle presets hold besides the task): a preset architecture
    with a new head takes its weights, the position embeddings resampled to a 6x6 grid."""
    model = classifier()
    model.backbone.save_to_preset(tmp_path / "backbone")
    assert not (tmp_path / "backbone" / "task.json").exists()
    ours = keras_vit.ViT.from_checkpoint(tmp_path / "backbone", num_classes=3, image_size=48)
    assert ours.config.num_classes == 3 and ours.config.grid_size == (6, 6)
    theirs = next(layer for layer in model.backbone.layers if hasattr(layer, "encoder_layers"))
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(ours.get_layer("block_1").mlp.fc2.kernel),
        keras.ops.convert_to_numpy(theirs.encoder_layers[1].mlp.dense_2.kernel),
    )
    assert np.all(keras.ops.convert_to_numpy(ours.get_layer("head").kernel) == 0)


@tensorflow_only
def test_a_bfloat16_model_loads_its_weights(tmp_path):
    model = classifier()
    backbone = keras_hub.models.ViTBackbone.from_config({**model.backbone.get_config(), "dtype": "bfloat16"})
    backbone.set_weights(model.backbone.get_weights())
    backbone.save(tmp_path / "bf16.keras")
    ours = keras_vit.ViT.from_checkpoint(tmp_path / "bf16.keras")
    token = next(w for w in backbone.weights if w.path.endswith("class_token"))
    assert token.dtype == "bfloat16"
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(ours.get_layer("class_token").token),
        keras.ops.convert_to_numpy(keras.ops.cast(token, "float32")),
    )


@tensorflow_only
def test_keras_hub_files_keras_vit_cannot_read_say_why(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"class_name": "X", "registered_name": "keras_hub>ResNetBackbone"}))
    (other / "model.weights.h5").write_bytes(b"")
    with pytest.raises(CheckpointError, match="keras_hub>ResNetBackbone; keras_vit reads keras-hub.s ViT"):
        keras_vit.ViT.from_checkpoint(other)
    (other / "config.json").write_text(json.dumps({"registered_name": "keras_hub>ViTBackbone", "config": {}}))
    (other / "model.weights.h5").unlink()
    with pytest.raises(CheckpointError, match="a keras-hub model without model.weights.h5"):
        keras_vit.ViT.from_checkpoint(other)
    (other / "model.weights.h5").write_bytes(b"\x89HDF\r\n\x1a\n truncated")
    with pytest.raises(CheckpointError, match=r"model.weights.h5: not a readable Keras weights file"):
        keras_vit.ViT.from_checkpoint(other)
    # the mean of the class token and the patch tokens: no keras_vit head reads that
    mixed = keras_hub.models.ViTImageClassifier(classifier().backbone, num_classes=5, pooling="gap")
    mixed.save(tmp_path / "mixed.keras")
    with pytest.raises(CheckpointError, match="pooling 'gap' with use_class_token=True"):
        keras_vit.ViT.from_checkpoint(tmp_path / "mixed.keras")


@tensorflow_only
def test_a_kaggle_handle_is_downloaded_by_kagglehub(tmp_path, monkeypatch):
    """keras-hub's presets are Kaggle models: the handle goes to kagglehub, whose folder loads
    (kagglehub itself cannot reach Kaggle here: a stand-in returns a folder keras-hub wrote)."""
    classifier().save_to_preset(tmp_path / "preset")
    asked = []
    kagglehub = types.SimpleNamespace(model_download=lambda handle: asked.append(handle) or str(tmp_path / "preset"))
    monkeypatch.setitem(sys.modules, "kagglehub", kagglehub)
    model = keras_vit.saving.load_model("kaggle://keras/vit/keras/vit_tiny_test/2")
    assert asked == ["keras/vit/keras/vit_tiny_test/2"] and model.config.num_classes == 5

    def offline(handle):
        raise ConnectionError("no route to www.kaggle.com")

    monkeypatch.setitem(sys.modules, "kagglehub", types.SimpleNamespace(model_download=offline))
    with pytest.raises(CheckpointError, match="download failed .ConnectionError: no route.*pass the preset folder"):
        keras_vit.ViT.from_checkpoint("kaggle://keras/vit/keras/vit_tiny_test/2")
    monkeypatch.setitem(sys.modules, "kagglehub", None)  # not installed
    with pytest.raises(CheckpointError, match=r"need kagglehub \(pip install kagglehub\)"):
        keras_vit.ViT.from_checkpoint("kaggle://keras/vit/keras/vit_tiny_test/2")


IMAGENET = (np.array([0.485, 0.456, 0.406]) * 255, np.array([0.229, 0.224, 0.225]) * 255)  # mean, std in pixels
TINY = dict(patch_size=8, num_layers=2, hidden_dim=64, num_heads=4, intermediate_dim=128, image_shape=(32, 32, 3))


def preset(folder, backbone, converter, statistics=IMAGENET):
    """Writes `backbone`, every weight perturbed, and its image `converter` class for the mean and
    std `statistics` (pixels) as a keras-hub preset; returns keras-hub's own model of it (from_preset),
    its scale and its offset."""
    mean, std = statistics
    scale, offset = (1 / std).tolist(), (-mean / std).tolist()
    perturb(backbone).save_to_preset(folder)
    converter(image_size=backbone.image_shape[:2], scale=scale, offset=offset).save_to_preset(folder)
    return keras_hub.models.Backbone.from_preset(str(folder)), scale, offset


def features(reference, pixels, scale, offset):
    """keras-hub's output for `pixels` normalised as its converter does: the first (class) token
    of DINOv2's and DINOv3's sequence, SigLIP's pooled vector."""
    normalised = pixels * np.asarray(scale, "float32") + np.asarray(offset, "float32")
    out = keras.ops.convert_to_numpy(reference({reference.layers[0].name: normalised}))
    return out[:, 0] if out.ndim == 3 else out


@pytest.mark.parametrize(
    "options",
    [
        dict(position_embedding_shape=(32, 32, 3)),
        # stored at a 6x6 grid, resampled to the image's 4x4 (antialiased, as keras-hub's presets of
        # DINOv2 with registers are)
        dict(
            position_embedding_shape=(48, 48),
            num_register_tokens=2,
            use_swiglu_ffn=True,
            antialias_in_interpolation=True,
        ),
    ],
    ids=["dinov2", "registers-swiglu-resampled"],
)
def test_a_dinov2_preset_gives_keras_hubs_class_token(tmp_path, options):
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.DINOV2Backbone(**TINY, **options)
    reference, scale, offset = preset(tmp_path / "dinov2", backbone, keras_hub.layers.DINOV2ImageConverter)
    ours = keras_vit.ViT.from_checkpoint(tmp_path / "dinov2")
    c = ours.config
    assert (c.classifier, c.num_classes, c.layer_scale_init) == ("token", 0, 1.0)
    assert c.num_register_tokens == options.get("num_register_tokens", 0)
    assert c.mlp_type == ("swiglu" if options.get("use_swiglu_ffn") else "gelu")
    assert c.posemb_interpolation == ("bicubic_antialias" if options.get("antialias_in_interpolation") else "bicubic")
    np.testing.assert_allclose(c.input_mean, IMAGENET[0], rtol=1e-6)
    pixels = sample_photos(32)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(ours(pixels)), features(reference, pixels, scale, offset), atol=TOLERANCE
    )


def test_dinov2_resampled_without_antialiasing_is_torchs_bicubic_and_says_so(tmp_path, caplog):
    """keras-hub resamples with its backend's bicubic resize: keras_vit's `bicubic` is torch's
    (a = -0.75), TensorFlow's and JAX's kernels differ, which one warning line says."""
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.DINOV2Backbone(**TINY, position_embedding_shape=(48, 48))
    reference, scale, offset = preset(tmp_path / "dinov2", backbone, keras_hub.layers.DINOV2ImageConverter)
    with caplog.at_level("WARNING", logger="keras_vit"):
        ours = keras_vit.ViT.from_checkpoint(tmp_path / "dinov2")
    assert "6x6 position embedding to its 4x4 image grid" in caplog.text and "under PyTorch only" in caplog.text
    if keras.backend.backend() == "torch":
        pixels = sample_photos(32)
        expected = features(reference, pixels, scale, offset)
        np.testing.assert_allclose(keras.ops.convert_to_numpy(ours(pixels)), expected, atol=TOLERANCE)


@pytest.mark.parametrize(
    "options",
    [
        dict(),  # keras-hub's defaults: a GELU MLP, query, key and value biases
        dict(
            num_register_tokens=2,
            use_key_bias=False,  # as the published DINOv3 models
            use_gated_mlp=True,
            hidden_activation="silu",
            use_mlp_bias=False,
            use_proj_bias=False,
            layer_norm_eps=1e-6,
            rope_theta=50.0,
        ),
    ],
    ids=["dinov3", "registers-gated-no-key-bias"],
)
def test_a_dinov3_preset_gives_keras_hubs_class_token(tmp_path, options):
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.DINOV3Backbone(**TINY, **options)
    reference, scale, offset = preset(tmp_path / "dinov3", backbone, keras_hub.layers.DINOV3ImageConverter)
    ours = keras_vit.ViT.from_checkpoint(tmp_path / "dinov3")
    c = ours.config
    assert (c.rope, c.position_embedding, c.classifier) == ("dinov3", False, "token")
    assert c.key_bias == options.get("use_key_bias", True) and c.rope_theta == options.get("rope_theta", 100.0)
    assert c.layer_norm_epsilon == options.get("layer_norm_eps", 1e-5)
    pixels = sample_photos(32)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(ours(pixels)), features(reference, pixels, scale, offset), atol=TOLERANCE
    )


def test_siglips_vision_tower_gives_keras_hubs_pooled_features(tmp_path):
    """A SigLIPVisionEncoder preset (exact GELU), and a SigLIPBackbone's preset and `.keras` file
    (tanh GELU, keras-hub's default), whose text tower and logit scale are left out."""
    keras.utils.set_random_seed(0)
    encoder = keras_hub.models.SigLIPVisionEncoder(**TINY, intermediate_activation="gelu")
    inception = (np.full(3, 127.5), np.full(3, 127.5))
    reference, scale, offset = preset(tmp_path / "encoder", encoder, keras_hub.layers.SigLIPImageConverter, inception)
    ours = keras_vit.ViT.from_checkpoint(tmp_path / "encoder")
    c = ours.config
    assert (c.classifier, c.num_class_tokens, c.gelu_approximate, c.input_mean) == ("map", 0, False, (127.5,) * 3)
    pixels = sample_photos(32)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(ours(pixels)), features(reference, pixels, scale, offset), atol=TOLERANCE
    )
    text = keras_hub.models.SigLIPTextEncoder(
        vocabulary_size=50, embedding_dim=64, hidden_dim=64, num_layers=1, num_heads=4, intermediate_dim=128
    )
    both = perturb(keras_hub.models.SigLIPBackbone(keras_hub.models.SigLIPVisionEncoder(**TINY), text))
    both.save_to_preset(tmp_path / "siglip")
    both.save(tmp_path / "siglip.keras")
    expected = keras.ops.convert_to_numpy(both.get_vision_embeddings(pixels / 127.5 - 1))
    for source in (tmp_path / "siglip", tmp_path / "siglip.keras"):
        ours = keras_vit.ViT.from_checkpoint(source, normalization="inception")
        assert ours.config.gelu_approximate
        np.testing.assert_allclose(keras.ops.convert_to_numpy(ours(pixels)), expected, atol=TOLERANCE)


def test_keras_hub_families_keras_vit_cannot_compute_are_refused_in_one_line(tmp_path):
    keras.utils.set_random_seed(0)
    keras_hub.models.DINOV3Backbone(**TINY).save_to_preset(tmp_path / "dinov3")
    keras_hub.models.SigLIPVisionEncoder(**TINY).save_to_preset(tmp_path / "siglip")
    refused = {
        "dinov3": [
            (dict(use_value_bias=False), "use_query_bias=True, use_key_bias=True, use_value_bias=False"),
            (dict(hidden_activation="relu"), "hidden_activation 'relu' and use_gated_mlp=False"),
            (dict(use_gated_mlp=True, hidden_activation="gelu"), "hidden_activation 'gelu' and use_gated_mlp=True"),
        ],
        "siglip": [
            (dict(intermediate_activation="relu"), "intermediate_activation 'relu'; keras_vit's MLP is GELU"),
            (dict(layer_norm_epsilon=1e-5), "layer_norm_epsilon 1e-05 beside its final LayerNorm's fixed 1e-6"),
        ],
    }
    for name, cases in refused.items():
        path = tmp_path / name / "config.json"
        saved = json.loads(path.read_text())
        for change, message in cases:
            path.write_text(json.dumps({**saved, "config": {**saved["config"], **change}}))
            with pytest.raises(CheckpointError, match=re.escape(message)) as error:
                keras_vit.ViT.from_checkpoint(tmp_path / name)
            assert "\n" not in str(error.value)
    text = tmp_path / "text"
    keras_hub.models.SigLIPTextEncoder(
        vocabulary_size=50, embedding_dim=64, hidden_dim=64, num_layers=1, num_heads=4, intermediate_dim=128
    ).save_to_preset(text)
    with pytest.raises(CheckpointError, match=r"keras_hub>SigLIPTextEncoder; keras_vit reads keras-hub's ViT \("):
        keras_vit.ViT.from_checkpoint(text)
