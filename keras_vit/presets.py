"""The presets table: every ViT variant of the paper and of the official release."""

import difflib

from keras_vit.config import IMAGENET_MEAN, IMAGENET_STD, ViTConfig, check_fields

_TI = dict(hidden_size=192, num_layers=12, num_heads=3, mlp_dim=768)
_S = dict(hidden_size=384, num_layers=12, num_heads=6, mlp_dim=1536)
_B = dict(hidden_size=768, num_layers=12, num_heads=12, mlp_dim=3072)
_L = dict(hidden_size=1024, num_layers=24, num_heads=16, mlp_dim=4096)
_H = dict(hidden_size=1280, num_layers=32, num_heads=16, mlp_dim=5120)
_G = dict(hidden_size=1408, num_layers=40, num_heads=16, mlp_dim=6144)  # Zhai et al. 2022, "Scaling ViTs"
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
