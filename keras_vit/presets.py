"""The presets table: every ViT variant of the paper and of the official release."""

import difflib

from keras_vit.config import CLIP_MEAN, CLIP_STD, IMAGENET_MEAN, IMAGENET_STD, ViTConfig, check_fields

_TI = dict(hidden_size=192, num_layers=12, num_heads=3, mlp_dim=768)
_S = dict(hidden_size=384, num_layers=12, num_heads=6, mlp_dim=1536)
_B = dict(hidden_size=768, num_layers=12, num_heads=12, mlp_dim=3072)
_L = dict(hidden_size=1024, num_layers=24, num_heads=16, mlp_dim=4096)
_H = dict(hidden_size=1280, num_layers=32, num_heads=16, mlp_dim=5120)
_G = dict(hidden_size=1408, num_layers=40, num_heads=16, mlp_dim=6144)  # Zhai et al. 2022, "Scaling ViTs"
_G_DINOV2 = dict(hidden_size=1536, num_layers=40, num_heads=24, mlp_dim=4096, mlp_type="swiglu")  # DINOv2's g
_SO400M = dict(hidden_size=1152, num_layers=27, num_heads=16, mlp_dim=4304)  # SigLIP's shape-optimised ViT

# DINOv2 (Oquab et al. 2023): self-supervised backbones, published without a head, at 518 pixels
# (a 37x37 grid of 14-pixel patches), with LayerScale and ImageNet statistics; their position
# embeddings resample as timm's do (antialiased bicubic). `_reg4`: four register tokens, and the
# class token's position folded into the token, as timm stores them.
_DINOV2 = dict(
    patch_size=14,
    image_size=518,
    num_classes=0,
    layer_scale_init=1e-5,
    input_mean=IMAGENET_MEAN,
    input_std=IMAGENET_STD,
    crop_fraction=1.0,
    posemb_interpolation="bicubic_antialias",
)
# DINOv3 (Simeoni et al. 2025): patch 16, no learned position embedding but rotary ones (theta
# 100, patch centres in [-1, 1]), 4 registers, LayerScale, no q/k/v biases, LayerNorm epsilon
# 1e-5, the class token read as in the original; S+ has a SwiGLU MLP. Any multiple of 16 pixels
# serves the same weights.
_DINOV3 = dict(
    patch_size=16,
    image_size=224,
    num_classes=0,
    position_embedding=False,
    rope="dinov3",
    num_register_tokens=4,
    layer_scale_init=1e-5,
    qkv_bias=False,
    layer_norm_epsilon=1e-5,
    input_mean=IMAGENET_MEAN,
    input_std=IMAGENET_STD,
    crop_fraction=1.0,
)
# EVA-02 (Fang et al. 2024), the masked-image-modelling backbones at 224: rotary embeddings
# (interleaved, theta 1e4, on the 16x16 grid of 224 pixels) beside the learned position embedding,
# SwiGLU MLPs of width 4D*2/3 (B and L with a LayerNorm inside), query and value biases only, the
# mean of the patches normalised after pooling, CLIP statistics.
_EVA02 = dict(
    patch_size=14,
    image_size=224,
    num_classes=0,
    classifier="gap",
    class_token=True,
    fc_norm=True,
    mlp_type="swiglu",
    key_bias=False,
    rope="eva02",
    rope_reference_grid=(16, 16),
    input_mean=CLIP_MEAN,
    input_std=CLIP_STD,
    crop_fraction=1.0,
)
# SigLIP (Zhai et al. 2023) and the fixed-resolution SigLIP 2 image towers: no class token, the
# attention-pool head, tanh-approximated GELU, pixels mapped to [-1, 1], resized without a crop.
_SIGLIP = dict(
    classifier="map", num_classes=0, gelu_approximate=True, crop_fraction=1.0, posemb_interpolation="bicubic_antialias"
)

# name -> (description, ViTConfig fields). Parameter counts are at 224x224 with 1000 classes.
PRESETS = {
    "vit_ti16": ("ViT-Ti/16 (DeiT/AugReg), 5.7M parameters", dict(_TI, patch_size=16)),
    "vit_ti32": ("ViT-Ti/32 (AugReg), 6.1M parameters", dict(_TI, patch_size=32)),
    "vit_s16": ("ViT-S/16 (DeiT/AugReg), 22.1M parameters", dict(_S, patch_size=16)),
    "vit_s32": ("ViT-S/32 (AugReg), 22.9M parameters", dict(_S, patch_size=32)),
    "vit_b8": ("ViT-B/8 (AugReg), 86.6M parameters", dict(_B, patch_size=8)),
    "vit_b16": ("ViT-B/16 (paper Table 1), 86.6M parameters", dict(_B, patch_size=16)),
    "vit_b32": ("ViT-B/32 (paper Table 1), 88.2M parameters", dict(_B, patch_size=32)),
    "vit_l16": ("ViT-L/16 (paper Table 1), 304.3M parameters", dict(_L, patch_size=16)),
    "vit_l32": ("ViT-L/32 (paper Table 1), 306.5M parameters", dict(_L, patch_size=32)),
    "vit_h14": ("ViT-H/14 (paper Table 1), 632.0M parameters", dict(_H, patch_size=14)),
    "vit_g14": (
        "ViT-g/14 (Zhai et al. 2022, timm's vit_giant_patch14_224), 1012.6M parameters",
        dict(_G, patch_size=14),
    ),
    "vit_r50_b16": (
        "R50+ViT-B/16 hybrid (paper section 3.1): BiT ResNet-50 stages (3, 4, 9), "
        "1x1 patches on its stride-16 map, 98.7M parameters",
        dict(_B, patch_size=1, resnet_layers=(3, 4, 9), resnet_width=64),
    ),
    "vit_r_ti16": (
        "R+ViT-Ti/16 hybrid (AugReg): the ResNet root alone (stride 4), 8x8 patches on its map, 6.3M parameters",
        dict(_TI, patch_size=8, resnet_layers=(), resnet_width=64),
    ),
    "vit_r26_s32": (
        "R26+ViT-S/32 hybrid (AugReg): BiT ResNet-26 stages (2, 2, 2, 2), 1x1 patches on its stride-32 map, "
        "36.4M parameters",
        dict(_S, patch_size=1, resnet_layers=(2, 2, 2, 2), resnet_width=64),
    ),
    "vit_r50_l32": (
        "R50+ViT-L/32 hybrid (paper Table 5, AugReg): BiT ResNet-50 stages (3, 4, 6, 3), 1x1 patches on its "
        "stride-32 map, 329.0M parameters",
        dict(_L, patch_size=1, resnet_layers=(3, 4, 6, 3), resnet_width=64),
    ),
    "dinov2_s14": ("DINOv2 ViT-S/14 backbone at 518, 22.1M parameters", dict(_S, **_DINOV2)),
    "dinov2_b14": ("DINOv2 ViT-B/14 backbone at 518, 86.6M parameters", dict(_B, **_DINOV2)),
    "dinov2_l14": ("DINOv2 ViT-L/14 backbone at 518, 304.4M parameters", dict(_L, **_DINOV2)),
    "dinov2_s14_reg4": (
        "DINOv2 ViT-S/14 with 4 register tokens, backbone at 518, 22.1M parameters",
        dict(_S, **_DINOV2, num_register_tokens=4, no_embed_class=True),
    ),
    "dinov2_b14_reg4": (
        "DINOv2 ViT-B/14 with 4 register tokens, backbone at 518, 86.6M parameters",
        dict(_B, **_DINOV2, num_register_tokens=4, no_embed_class=True),
    ),
    "dinov2_l14_reg4": (
        "DINOv2 ViT-L/14 with 4 register tokens, backbone at 518, 304.4M parameters",
        dict(_L, **_DINOV2, num_register_tokens=4, no_embed_class=True),
    ),
    "dinov2_g14": ("DINOv2 ViT-g/14 backbone at 518 (SwiGLU MLP), 1136.5M parameters", dict(_G_DINOV2, **_DINOV2)),
    "dinov2_g14_reg4": (
        "DINOv2 ViT-g/14 with 4 register tokens, backbone at 518 (SwiGLU MLP), 1136.5M parameters",
        dict(_G_DINOV2, **_DINOV2, num_register_tokens=4, no_embed_class=True),
    ),
    "siglip_b16_224": (
        "SigLIP / SigLIP 2 B/16 image tower at 224, 92.9M parameters",
        dict(_B, **_SIGLIP, patch_size=16, image_size=224),
    ),
    "siglip_b16_256": (
        "SigLIP / SigLIP 2 B/16 image tower at 256, 92.9M parameters",
        dict(_B, **_SIGLIP, patch_size=16, image_size=256),
    ),
    "siglip_b16_384": (
        "SigLIP / SigLIP 2 B/16 image tower at 384, 93.2M parameters",
        dict(_B, **_SIGLIP, patch_size=16, image_size=384),
    ),
    "siglip_so400m14_224": (
        "SigLIP So400m/14 image tower at 224, 427.7M parameters",
        dict(_SO400M, **_SIGLIP, patch_size=14, image_size=224),
    ),
    "dinov3_s16": ("DINOv3 ViT-S/16 backbone, 21.6M parameters", dict(_S, **_DINOV3)),
    "dinov3_sp16": (
        "DINOv3 ViT-S+/16 backbone (SwiGLU MLP), 28.7M parameters",
        dict(_S, **_DINOV3, mlp_type="swiglu"),
    ),
    "dinov3_b16": ("DINOv3 ViT-B/16 backbone, 85.6M parameters", dict(_B, **_DINOV3)),
    "dinov3_l16": ("DINOv3 ViT-L/16 backbone, 303.1M parameters", dict(_L, **_DINOV3)),
    "eva02_ti14": ("EVA-02 Ti/14 backbone at 224, 5.5M parameters", dict(_TI, **_EVA02, mlp_dim=512)),
    "eva02_s14": ("EVA-02 S/14 backbone at 224, 21.6M parameters", dict(_S, **_EVA02, mlp_dim=1024)),
    "eva02_b14": ("EVA-02 B/14 backbone at 224, 85.8M parameters", dict(_B, **_EVA02, mlp_dim=2048, mlp_norm=True)),
    "eva02_l14": ("EVA-02 L/14 backbone at 224, 303.3M parameters", dict(_L, **_EVA02, mlp_dim=2730, mlp_norm=True)),
    # Published "384": the reference's 14-pixel patches leave 6 of 384 pixels out; the same
    # 27x27 grid is 378 pixels.
    "siglip_so400m14_384": (
        "SigLIP / SigLIP 2 So400m/14 image tower at 378 (the published 384 model's 27x27 grid), 428.2M parameters",
        dict(_SO400M, **_SIGLIP, patch_size=14, image_size=378),
    ),
}


def list_presets():
    """Names of all presets, in table order."""
    return list(PRESETS)


def describe_preset(name):
    """One-line description of a preset."""
    return PRESETS[_check_name(name)][0]


def get_config(name, **overrides):
    """The `ViTConfig` of preset `name`, with any config field overridden."""
    check_fields(ViTConfig, overrides, "ViTConfig field")
    return ViTConfig(**{**PRESETS[_check_name(name)][1], **overrides})


def _check_name(name):
    if name in PRESETS:
        return name
    # Case and dashes aside first: `VIT_B16` and `vit-b16` are `vit_b16`.
    folded = str(name).lower().replace("-", "_")
    close = [folded] if folded in PRESETS else difflib.get_close_matches(folded, PRESETS, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise ValueError(f"unknown preset {name!r}; {hint}known presets: {', '.join(PRESETS)}.")
