"""What `keras-vit checkpoints` lists: the known names (`known.KNOWN_CHECKPOINTS`) and the usual
Hugging Face Hub names of the family presets, with what their publishers and timm's evaluation
say of them. A fact not known for certain is None (printed "—").

Sources of the published ImageNet-1k top-1 (`SOURCES`): the vision_transformer README's expected
accuracies of its 224-pixel fine-tunes, and timm's `results/results-imagenet.csv` (its own
evaluation, bicubic resize and its crop) for the timm ports of the same files: the AugReg ones
are timm's checkpoints with the very URLs of `known.py` (`tests/test_catalog.py` checks them).
"""

import typing

from keras_vit.checkpoints import hub, known
from keras_vit.names import cache_home
from keras_vit.presets import get_config

SOURCES = {
    "vit-readme": "google-research/vision_transformer README (expected top-1 of the -224 fine-tunes)",
    "timm": "timm results/results-imagenet.csv (timm's evaluation of its port: bicubic, its crop)",
}
# Published ImageNet-1k top-1 (%) of the known names with an ImageNet-1k head, by the tag after
# the preset in the name: tag -> (source, {preset: top-1}).
TOP1 = {
    "imagenet21k_ft_imagenet1k": ("vit-readme", {"vit_b16": 81.2, "vit_l16": 82.7}),
    "imagenet21k_ft_imagenet1k_384": ("timm", {"vit_b16": 84.200, "vit_l32": 81.510, "vit_r50_b16": 84.976}),
    "augreg_in21k_ft_in1k": (
        "timm",
        {
            "vit_ti16": 75.454,
            "vit_s16": 81.384,
            "vit_s32": 75.994,
            "vit_b16": 84.532,
            "vit_l16": 85.834,
            "vit_b32": 80.716,
            "vit_b8": 85.798,
            "vit_r_ti16": 71.798,
            "vit_r26_s32": 81.864,
            "vit_r50_l32": 84.422,
        },
    ),
    "augreg_in21k_ft_in1k_384": (
        "timm",
        {
            "vit_ti16": 78.424,
            "vit_s16": 83.802,
            "vit_s32": 80.486,
            "vit_b16": 85.996,
            "vit_l16": 87.084,
            "vit_r_ti16": 75.962,
            "vit_r26_s32": 84.048,
            "vit_r50_l32": 86.182,
        },
    ),
}
# The family presets' checkpoints on the Hub (timm's repositories; headless backbones).
HUB_NAMES = {
    **{
        f"dinov2_{size}14{reg}": f"hf://timm/vit_{name}_patch14{reg}_dinov2.lvd142m"
        for size, name in (("s", "small"), ("b", "base"), ("l", "large"))
        for reg in ("", "_reg4")
    },
    **{f"siglip_b16_{res}": f"hf://timm/vit_base_patch16_siglip_{res}.webli" for res in (224, 256, 384)},
    "siglip_so400m14_224": "hf://timm/vit_so400m_patch14_siglip_224.webli",
    "siglip_so400m14_384": "hf://timm/vit_so400m_patch14_siglip_384.webli",
}
# Preset prefix -> family (`names.CHECKPOINT_FAMILIES`), the hybrids' before the other ViTs'.
FAMILIES = {"vit_r": "vit-hybrid", "vit_": "vit", "dinov2_": "dinov2", "siglip_": "siglip"}
_DATA = {"dinov2_": "LVD-142M (self-supervised)", "siglip_": "WebLI (image-text pairs)"}
LICENCE = "Apache-2.0"  # the official, AugReg, DINOv2 and SigLIP releases alike


class Entry(typing.NamedTuple):
    name: str
    preset: str
    family: str
    resolution: int
    data: str
    top1: float | None
    source: str | None
    licence: str
    parameters: int | None
    cached: bool


def entries():
    """Every name `--weights` accepts by name, known names first, in table order."""
    rows = []
    for name, (preset, overrides, url) in known.KNOWN_CHECKPOINTS.items():
        tag = name.split(".", 1)[1]
        data = "ImageNet-21k" + (", fine-tuned on ImageNet-1k" if "_ft_" in tag else "")
        source, published = TOP1.get(tag, (None, {}))
        top1 = published.get(preset)
        source = source if top1 is not None else None
        cached = (cache_home() / url.rsplit("/", 1)[-1]).is_file()
        rows.append(_entry(name, preset, get_config(preset, **overrides), data, top1, source, cached))
    for preset, name in HUB_NAMES.items():
        data = next(text for prefix, text in _DATA.items() if preset.startswith(prefix))
        rows.append(_entry(name, preset, get_config(preset), data, None, None, hub.cached(name)))
    return rows


def _entry(name, preset, config, data, top1, source, cached):
    family = next(family for prefix, family in FAMILIES.items() if preset.startswith(prefix))
    count = parameter_count(config)
    return Entry(name, preset, family, config.image_size[0], data, top1, source, LICENCE, count, cached)


def parameter_count(config):
    """The parameters of a model of `config` (a ViTConfig), counted off the config; None for a
    hybrid, whose ResNet it does not count."""
    if config.resnet_layers is not None:
        return None
    d, m = config.hidden_size, config.mlp_dim
    rows, columns = config.patch_size
    count = rows * columns * config.channels * d + d  # the patch embedding
    count += (config.num_class_tokens + config.num_register_tokens) * d
    if config.position_embedding:
        count += (config.num_patches + config.num_position_prefix_tokens) * d
    biases = 0 if not config.qkv_bias else 3 * d if config.key_bias else 2 * d
    fc1 = 2 * m if config.mlp_type == "swiglu" else m
    block = 4 * d + 3 * d * d + biases + d * d + d + d * fc1 + fc1 + m * d + d
    block += 2 * m * config.mlp_norm + 2 * d * (config.layer_scale_init is not None)
    count += config.num_layers * block + 2 * d  # the blocks, the final LayerNorm
    if config.classifier == "map":  # probe, query, key/value, out, LayerNorm, MLP
        count += d + (d * d + d) + (2 * d * d + 2 * d) + (d * d + d) + 2 * d + (d * m + m + m * d + d)
    features = config.representation_size or d
    if config.representation_size:
        count += d * features + features
    if config.num_classes:
        count += features * config.num_classes + config.num_classes
    return count


def describe(entry):
    """The cells of one row, "—" where a fact is not known."""
    top1 = "—" if entry.top1 is None else f"{entry.top1:g} ({entry.source})"
    size = "—" if entry.parameters is None else f"{entry.parameters / 1e6:.1f}M"
    return (entry.name, entry.family, str(entry.resolution), entry.data, top1, entry.licence, size)
