import json

import numpy as np
import pytest

import keras_vit
from keras_vit.config import ViTConfig

OFFICIAL_PARAMETER_COUNTS = {
    "vit_ti16": 5_717_416,
    "vit_ti32": 6_131_560,  # Ti/16's less 147 position embeddings, plus 2,304 inputs per patch filter
    "vit_s32": 22_878_952,  # timm's vit_small_patch32_224
    "vit_b8": 86_576_872,  # timm's vit_base_patch8_224
    "vit_s16": 22_050_664,
    "vit_b16": 86_567_656,
    "vit_b32": 88_224_232,
    "vit_l16": 304_326_632,
    "vit_l32": 306_535_400,
    "vit_h14": 632_045_800,
    "vit_g14": 1_012_611_432,  # timm's vit_giant_patch14_224 (5.3 GB to build under TensorFlow, 20 s)
    "vit_r50_b16": 98_659_112,
    # AugReg's hybrids: timm's vit_tiny_r_s16_p8_224, vit_small_r26_s32_224, vit_large_r50_s32_224
    "vit_r_ti16": 6_337_704,
    "vit_r26_s32": 36_431_912,
    "vit_r50_l32": 328_994_856,
}
# timm's counts of the same architectures built without a head (num_classes=0), at the presets' sizes:
# vit_{small,base,large}_patch14[_reg4]_dinov2 (518), vit_base_patch16_siglip_{224,256,384},
# vit_so400m_patch14_siglip_{224,384} (the 384 model's 27x27 grid).
FAMILY_PARAMETER_COUNTS = {
    "dinov2_s14": 22_056_192,
    "dinov2_b14": 86_579_712,
    "dinov2_l14": 304_367_616,
    "dinov2_s14_reg4": 22_057_344,
    "dinov2_b14_reg4": 86_582_016,
    "dinov2_l14_reg4": 304_370_688,
    "siglip_b16_224": 92_884_224,
    "siglip_b16_256": 92_930_304,
    "siglip_b16_384": 93_176_064,
    "siglip_so400m14_224": 427_680_704,
    "siglip_so400m14_384": 428_225_600,
    "dinov3_s16": 21_586_944,  # timm's vit_{small,small_plus,base,large}_patch16_dinov3
    "dinov3_sp16": 28_683_264,
    "dinov3_b16": 85_641_216,
    "dinov3_l16": 303_079_424,
    "eva02_ti14": 5_502_144,  # timm's eva02_{tiny,small,base,large}_patch14_224
    "eva02_s14": 21_621_120,
    "eva02_b14": 85_758_720,
    "eva02_l14": 303_268_800,
    "dinov2_g14": 1_136_479_232,  # vit_giant_patch14[_reg4]_dinov2; over 250M parameters: behind the slow marker
    "dinov2_g14_reg4": 1_136_483_840,
}


@pytest.mark.tensorflow_only  # the same layer code on every backend; TensorFlow builds these fastest
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=[pytest.mark.slow] if count > 250_000_000 else [])
        for name, count in sorted(FAMILY_PARAMETER_COUNTS.items())
    ],
)
def test_family_parameter_counts_equal_timms(name):
    model = keras_vit.ViT.from_preset(name)  # at the preset's own size, headless as published
    assert keras_vit.count_params(model) == FAMILY_PARAMETER_COUNTS[name]


# The layers' weights are the same code on every backend: the presets over 95M parameters (10-15 s
# each to initialise under JAX or PyTorch on 2 cores) are built in the TensorFlow pass only, and
# those over 250M (L, H, g: 6-31 s each there) by the slow tests, as the families' are.
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            name,
            marks=[pytest.mark.tensorflow_only] * (count > 95_000_000) + [pytest.mark.slow] * (count > 250_000_000),
        )
        for name, count in OFFICIAL_PARAMETER_COUNTS.items()
    ],
)
def test_official_parameter_counts(name):
    model = keras_vit.ViT.from_preset(name)  # built for real at 224x224, 1000 classes
    assert keras_vit.count_params(model) == OFFICIAL_PARAMETER_COUNTS[name]
    assert model.count_params() == OFFICIAL_PARAMETER_COUNTS[name]


def test_every_preset_is_listed_and_described():
    names = keras_vit.list_presets()
    assert set(OFFICIAL_PARAMETER_COUNTS) <= set(names)
    assert {"vit_b8", "vit_s32", "vit_ti32"} <= set(names)
    for name in names:
        assert keras_vit.describe_preset(name)
        assert isinstance(keras_vit.get_config(name), ViTConfig)


def test_paper_table1_shapes():
    for name, (layers, width, mlp, heads) in {
        "vit_b16": (12, 768, 3072, 12),
        "vit_l16": (24, 1024, 4096, 16),
        "vit_h14": (32, 1280, 5120, 16),
        "vit_ti16": (12, 192, 768, 3),
        "vit_s16": (12, 384, 1536, 6),
    }.items():
        c = keras_vit.get_config(name)
        assert (c.num_layers, c.hidden_size, c.mlp_dim, c.num_heads) == (layers, width, mlp, heads)


def test_unknown_preset_lists_close_names():
    with pytest.raises(ValueError, match=r"unknown preset 'vit_b61'.*did you mean vit_b16"):
        keras_vit.ViT.from_preset("vit_b61")
    for name in ("VIT_B16", "ViT-B16"):  # case and dashes: no suggestion at all before
        with pytest.raises(ValueError, match=rf"unknown preset '{name}'; did you mean vit_b16\? known"):
            keras_vit.get_config(name)
    with pytest.raises(ValueError, match=r"ViTConfig field\(s\): num_class; num_class: did you mean num_classes"):
        keras_vit.ViT.from_preset("vit_ti16", num_class=10)
    with pytest.raises(ValueError, match=r"unknown dtype policy 'float8'; use float32, mixed_bfloat16"):
        keras_vit.ViT(keras_vit.get_config("vit_ti16", num_layers=1), dtype="float8")


def test_overrides_and_grid():
    c = keras_vit.get_config("vit_b16", num_classes=10, image_size=384)
    assert c.image_size == (384, 384) and c.grid_size == (24, 24) and c.num_classes == 10
    c = keras_vit.get_config("vit_b16", image_size=(224, 320))
    assert c.grid_size == (14, 20) and c.num_patches == 280
    hybrid = keras_vit.get_config("vit_r50_b16", image_size=384)
    assert hybrid.backbone_stride == 16 and hybrid.grid_size == (24, 24)
    root_only = keras_vit.get_config("vit_r_ti16", image_size=384)  # stride 4, 8x8 patches
    assert root_only.resnet_layers == () and root_only.backbone_stride == 4 and root_only.grid_size == (12, 12)
    four_stages = keras_vit.get_config("vit_r50_l32")
    assert four_stages.backbone_stride == 32 and four_stages.grid_size == (7, 7)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(image_size=230), r"image height 230 is not divisible by patch size 16.*multiple of 16"),
        (dict(image_size=(224, 100)), r"image width 100 is not divisible by patch size 16"),
        (dict(num_heads=7), r"hidden size 768 is not divisible by 7 attention heads; .* heads that divides 768"),
        (dict(classifier="cls"), r"`classifier` must be one of"),
        (dict(dropout_rate=1.0), r"`dropout_rate` must be in \[0, 1\)"),
        (dict(num_classes=-1), r"num_classes"),
        (
            dict(channels=1, input_mean=(123.7, 116.3, 103.5)),
            r"one value per channel \(1\); got 3 and 1 \(grayscale: input_mean=\(127.5,\)",
        ),
        # each built a model whose logits were NaN or constant
        (dict(layer_norm_epsilon=-1.0), r"`layer_norm_epsilon` must be finite and positive; got -1\.0"),
        (dict(layer_norm_epsilon=0.0), r"`layer_norm_epsilon` must be finite and positive"),
        (dict(input_std=(127.5, -1.0, 127.5)), r"`input_std` finite and positive"),
        (dict(input_mean=(float("nan"),) * 3), r"`input_mean` must be finite"),
        (dict(representation_size=0), r"`representation_size` \(the pre-logits width\) must be a positive integer"),
        (dict(image_size=(224, 224, 3)), r"pair of ints"),
        (dict(image_size=0), r"`image_size` must be positive; got 0\."),  # 0 % 16 == 0 passed before
        (dict(image_size=(224, -32)), r"`image_size` must be positive; got \(224, -32\)"),
        (dict(patch_size=0), r"`patch_size` must be positive; got 0\."),
        # a GroupNorm of 32 groups on 16 channels failed deep inside the layer's build
        (
            dict(resnet_layers=(1, 1), resnet_width=16, patch_size=1),
            r"`resnet_width` must be a positive multiple of 32",
        ),
        (
            dict(resnet_layers=(0, 2), patch_size=1),
            r"`resnet_layers` must list stages of >= 1 units \(\(\) for the root",
        ),
        # types, as a YAML file gets them wrong (not int() errors that name no field)
        (dict(hidden_size="x"), r"field `hidden_size` must be an integer; got 'x'\."),
        (dict(hidden_size=96.0), r"field `hidden_size` must be an integer; got 96\.0\."),
        (dict(representation_size="8"), r"`representation_size` must be an integer or null; got '8'"),
        (dict(qkv_bias="no"), r"`qkv_bias` must be true or false"),
        (dict(num_classes=True), r"`num_classes` must be an integer; got True"),
        (dict(image_size="224"), r"`image_size` must be an integer or a list; got '224'"),
    ],
)
def test_bad_config_values(fields, message):
    with pytest.raises(ValueError, match=message):
        ViTConfig(**fields)


def test_config_takes_numpy_numbers_as_python_ones():
    # image_size=np.int64(...) was "'numpy.int64' object is not iterable"; a NumPy width broke JSON
    c = ViTConfig(image_size=np.int64(64), hidden_size=np.int32(96), num_heads=3, dropout_rate=np.float32(0.25))
    assert c.image_size == (64, 64) and type(c.image_size[0]) is int
    assert type(c.hidden_size) is int and type(c.dropout_rate) is float and c.dropout_rate == 0.25
    assert json.loads(json.dumps(c.to_dict()))["hidden_size"] == 96
    with pytest.raises(ValueError, match="pair of ints"):
        ViTConfig(image_size=(True, 64))


def test_config_dict_round_trip_and_replace():
    c = ViTConfig(image_size=(64, 96), patch_size=1, resnet_layers=[3, 4], layer_scale_init=1e-5)
    assert ViTConfig.from_dict(c.to_dict()) == c
    assert c.replace(num_classes=3).num_classes == 3
    with pytest.raises(ValueError, match=r"unknown ViTConfig field\(s\): widht\.$"):  # nothing close
        c.replace(widht=3)
    with pytest.raises(ValueError, match=r"field\(s\): num_clases, patch; num_clases: did you mean num_classes\?"):
        c.replace(num_clases=3, patch=2)


def test_uniform_input_statistics_serve_any_channel_count():
    # ViTConfig(channels=1) was refused for its default (127.5,) * 3 statistics
    gray = ViTConfig(channels=1)
    assert gray.input_mean == (127.5,) and gray.input_std == (127.5,)
    assert gray.replace(channels=3).input_mean == (127.5,) * 3
    assert ViTConfig(input_mean=(0.0,), input_std=(255.0,)).input_std == (255.0,) * 3
    assert ViTConfig.from_dict(gray.to_dict()) == gray
