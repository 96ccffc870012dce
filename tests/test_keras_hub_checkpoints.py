"""keras-hub's ViT presets and `.keras` files load into keras_vit and compute what keras-hub
computes: random-initialised keras-hub models, every weight perturbed, written by keras-hub
itself, compared in float32 on keras-hub's own normalised input."""

import json
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
pytestmark = pytest.mark.tensorflow_only  # keras-hub needs tensorflow-text; the reader is NumPy
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
