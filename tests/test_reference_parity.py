"""keras_vit computes what timm and Hugging Face compute, from their own checkpoint files.

Reference models are random-initialised, every tensor perturbed off its init (so a dropped or
swapped tensor shows), written to disk in their native formats, and compared on real photos
(scikit-learn's bundled china.jpg and flower.jpg) in float32.
"""

import numpy as np
import pytest
from helpers import hf_vit_config, max_diff, perturb, perturbed_torch, sample_photos

import keras_vit
from keras_vit.benchmark import torchvision_stub

torch = pytest.importorskip("torch")
torchvision_stub.install()  # before timm: see torchvision_stub.py
timm = pytest.importorskip("timm")
TOLERANCE = 1e-4


def to_torch(pixels):
    """[0, 255] NHWC -> the references' normalised NCHW input ((x / 255 - 0.5) / 0.5)."""
    return torch.from_numpy((pixels / 127.5 - 1.0).transpose(0, 3, 1, 2).copy())


# The mapping of a checkpoint's keys is the same NumPy code on every backend, and each backend's
# forward of a plain ViT and a hybrid is checked on the two tiny and the small model: the larger
# ones (B/32; R50+B/16's, R26's and L/32's ResNets, whose keys map differently from the AugReg
# hybrids' root alone) run in the TensorFlow pass. Blocks map one like another, so B/32, R50+B/16
# and R50+L/32 keep 2 of them (at full width, their ResNets whole).
@pytest.mark.parametrize(
    "name, preset, depth",
    [
        ("vit_tiny_patch16_224", "vit_ti16", None),
        ("vit_small_patch16_224", "vit_s16", None),
        pytest.param("vit_base_patch32_224", "vit_b32", 2, marks=pytest.mark.tensorflow_only),
        pytest.param("vit_base_r50_s16_224", "vit_r50_b16", 2, marks=pytest.mark.tensorflow_only),
        ("vit_tiny_r_s16_p8_224", "vit_r_ti16", None),
        pytest.param("vit_small_r26_s32_224", "vit_r26_s32", None, marks=pytest.mark.tensorflow_only),
        pytest.param("vit_large_r50_s32_224", "vit_r50_l32", 2, marks=pytest.mark.tensorflow_only),
    ],
)
def test_timm_state_dicts(tmp_path, name, preset, depth):
    from safetensors.torch import save_file

    shallower = {} if depth is None else {"depth": depth}
    reference = perturbed_torch(timm.create_model(name, pretrained=False, num_classes=1000, **shallower))
    pixels = sample_photos(224)
    with torch.no_grad():
        expected = reference(to_torch(pixels)).numpy()
    save_file(reference.state_dict(), tmp_path / "model.safetensors")
    torch.save(reference.state_dict(), tmp_path / "model.pth")
    from_safetensors = keras_vit.ViT.from_checkpoint(tmp_path / "model.safetensors")  # config read off the file
    assert from_safetensors.config.resnet_layers == keras_vit.get_config(preset).resnet_layers
    assert max_diff(from_safetensors, expected, pixels) <= TOLERANCE
    overrides = {} if depth is None else {"num_layers": depth}
    if keras_vit.get_config(preset).resnet_layers is not None:
        overrides["resnet_numerics"] = "timm"  # timm's epsilons
    from_pth = keras_vit.ViT.from_preset(preset, weights=tmp_path / "model.pth", **overrides)
    assert max_diff(from_pth, expected, pixels) <= TOLERANCE


def test_huggingface_vit_for_image_classification(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = hf_vit_config(hidden_size=192, num_hidden_layers=4, intermediate_size=768, image_size=224, num_labels=10)
    reference = perturbed_torch(transformers.ViTForImageClassification(config))
    reference.save_pretrained(tmp_path / "hf")
    pixels = sample_photos(224)
    with torch.no_grad():
        expected = reference(pixel_values=to_torch(pixels)).logits.numpy()
    model = keras_vit.ViT.from_checkpoint(tmp_path / "hf")
    assert model.config.num_classes == 10 and model.config.layer_norm_epsilon == config.layer_norm_eps
    assert max_diff(model, expected, pixels) <= TOLERANCE
    assert model.class_names is None  # Transformers' placeholder names LABEL_0.. are no names


def test_huggingface_image_processor_statistics_become_the_models(tmp_path):
    # DeiT-style checkpoints normalise with ImageNet's statistics: they were ignored (logits off by
    # ~0.05 on logits of ~0.1), the official 127.5 taken instead.
    transformers = pytest.importorskip("transformers")
    config = hf_vit_config(num_hidden_layers=2, num_labels=3)
    reference = perturbed_torch(transformers.ViTForImageClassification(config))
    reference.save_pretrained(tmp_path / "hf")
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    transformers.ViTImageProcessor(image_mean=mean, image_std=std).save_pretrained(tmp_path / "hf")
    pixels = sample_photos(32)
    normalised = (pixels / 255.0 - np.asarray(mean)) / np.asarray(std)
    with torch.no_grad():
        expected = reference(pixel_values=torch.from_numpy(normalised.transpose(0, 3, 1, 2).copy()).float()).logits
    for source in (tmp_path / "hf", tmp_path / "hf" / "model.safetensors"):
        model = keras_vit.ViT.from_checkpoint(source)
        np.testing.assert_allclose(model.config.input_mean, np.asarray(mean) * 255, rtol=1e-6)
        assert max_diff(model, expected.numpy(), pixels) <= TOLERANCE


def test_huggingface_label_names_travel_with_the_model(tmp_path):
    transformers = pytest.importorskip("transformers")
    names = ["tabby cat", "dog", "owl"]
    config = hf_vit_config(id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)})
    transformers.ViTForImageClassification(config).save_pretrained(tmp_path / "hf")
    model = keras_vit.ViT.from_checkpoint(tmp_path / "hf")
    assert model.class_names == tuple(names)
    keras_vit.saving.save_model(model, tmp_path / "converted.keras")
    restored = keras_vit.saving.load_model(tmp_path / "converted.keras")
    assert keras_vit.saving.label_names(tmp_path / "converted.keras", restored) == names
    assert keras_vit.ViT.from_checkpoint(tmp_path / "converted.keras").resized(48).class_names == tuple(names)
    # the same head loaded into a preset-built model brings its names; a new head does not
    same_head = keras_vit.ViT(model.config)
    keras_vit.load_weights(same_head, tmp_path / "hf")
    assert same_head.class_names == tuple(names)
    assert keras_vit.ViT.from_checkpoint(tmp_path / "hf", num_classes=2).class_names is None


def test_huggingface_vit_model_pooler_is_pre_logits(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = hf_vit_config(hidden_size=192, num_hidden_layers=2, intermediate_size=768, image_size=64)
    reference = perturbed_torch(transformers.ViTModel(config))
    reference.save_pretrained(tmp_path / "hf")
    pixels = sample_photos(64)
    with torch.no_grad():
        expected = reference(pixel_values=to_torch(pixels)).pooler_output.numpy()
    model = keras_vit.ViT.from_checkpoint(tmp_path / "hf")
    assert model.config.num_classes == 0 and model.config.representation_size == 192
    assert max_diff(model, expected, pixels) <= TOLERANCE


@pytest.mark.parametrize(
    "preset, name",
    [
        ("vit_ti16", "vit_tiny_patch16_224"),
        ("vit_r_ti16", "vit_tiny_r_s16_p8_224"),
        pytest.param("vit_r26_s32", "vit_small_r26_s32_224", marks=pytest.mark.tensorflow_only),
    ],
)
def test_npz_from_save_npz_is_read_by_timms_official_loader(tmp_path, preset, name):
    """Pins our .npz key layout to the official one (AugReg's for the hybrids): timm's own loader
    reads it."""
    from timm.models.vision_transformer import _load_weights

    numerics = {} if preset == "vit_ti16" else {"resnet_numerics": "timm"}  # the epsilons timm computes with
    model = perturb(keras_vit.ViT.from_preset(preset, **numerics))
    keras_vit.save_npz(model, tmp_path / "ours.npz")
    reference = timm.create_model(name, pretrained=False).eval()
    _load_weights(reference, str(tmp_path / "ours.npz"))
    pixels = sample_photos(224)
    with torch.no_grad():
        expected = reference(to_torch(pixels)).numpy()
    assert max_diff(model, expected, pixels) <= TOLERANCE


def test_224_checkpoint_at_384_matches_timm_resampling(tmp_path):
    from timm.models.vision_transformer import _load_weights

    source = perturbed_torch(timm.create_model("vit_tiny_patch16_224", pretrained=False))
    keras_224 = keras_vit.ViT.from_preset("vit_ti16")
    keras_vit.checkpoints.assign(
        keras_224, keras_vit.checkpoints.timm.to_keras({k: v.numpy() for k, v in source.state_dict().items()}), "timm"
    )
    keras_vit.save_npz(keras_224, tmp_path / "ti16_224.npz")
    reference = timm.create_model("vit_tiny_patch16_384", pretrained=False).eval()
    _load_weights(reference, str(tmp_path / "ti16_224.npz"))  # bilinear, no antialias
    model = keras_vit.ViT.from_preset("vit_ti16", image_size=384, weights=tmp_path / "ti16_224.npz")
    pixels = sample_photos(384)
    with torch.no_grad():
        expected = reference(to_torch(pixels)).numpy()
    assert max_diff(model, expected, pixels) <= TOLERANCE


def test_timm_no_embed_class_model(tmp_path):
    """DeiT-3 (`no_embed_class`: no position embedding on the class token, LayerScale): the
    class slot loads as zero and the logits are timm's."""
    from safetensors.torch import save_file

    reference = perturbed_torch(timm.create_model("deit3_small_patch16_224", pretrained=False, num_classes=10))
    assert reference.no_embed_class and reference.pos_embed.shape[1] == 196
    pixels = sample_photos(224)
    with torch.no_grad():
        expected = reference(to_torch(pixels)).numpy()
    save_file(reference.state_dict(), tmp_path / "deit3.safetensors")
    model = keras_vit.ViT.from_checkpoint(tmp_path / "deit3.safetensors")
    assert model.config.layer_scale_init is not None
    assert max_diff(model, expected, pixels) <= TOLERANCE


def test_224_checkpoint_at_384_with_bicubic_matches_timms_own_loader(tmp_path):
    """`posemb_interpolation="bicubic_antialias"`: a 224 timm state dict at 384 computes what
    timm's own checkpoint filter (its default, antialiased bicubic) makes of it."""
    from safetensors.torch import save_file
    from timm.models.vision_transformer import checkpoint_filter_fn

    source = perturbed_torch(timm.create_model("vit_tiny_patch16_224", pretrained=False))
    save_file(source.state_dict(), tmp_path / "ti16_224.safetensors")
    reference = timm.create_model("vit_tiny_patch16_384", pretrained=False).eval()
    reference.load_state_dict(checkpoint_filter_fn(source.state_dict(), reference))
    model = keras_vit.ViT.from_preset(
        "vit_ti16", image_size=384, posemb_interpolation="bicubic_antialias", weights=tmp_path / "ti16_224.safetensors"
    )
    pixels = sample_photos(384)
    with torch.no_grad():
        expected = reference(to_torch(pixels)).numpy()
    assert max_diff(model, expected, pixels) <= TOLERANCE
