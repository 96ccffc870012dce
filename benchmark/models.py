"""The models compared: keras_vit, keras-hub's ViT and timm's VisionTransformer, each built
from the same `ViTConfig` with random weights, and their forward FLOPs."""

import logging
import sys

from keras_vit.benchmark import torchvision_stub
from keras_vit.config import ViTConfig

logger = logging.getLogger("keras_vit")

IMPLEMENTATIONS = ("keras_vit", "keras-hub", "timm")


def config_for(model):
    """The `ViTConfig` of a case's model: a preset name, or a dict of config fields (with
    `preset`: that preset's, overridden)."""
    from keras_vit import presets

    if isinstance(model, str):
        return presets.get_config(model)
    fields = dict(model)
    if "preset" in fields:
        return presets.get_config(fields.pop("preset"), **fields)
    return ViTConfig.from_dict(fields)


def forward_flops(config):
    """FLOPs (2 per multiply-add) of one image's forward pass: patch projection, the
    blocks' matmuls (q/k/v/out, attention scores and mixing, MLP: three matrices when gated)
    over the patches and the class and register tokens, the attention-pool head ("map": one
    query over every token, its MLP) and the classifier."""
    rows, cols = (i // p for i, p in zip(config.image_size, config.patch_size))
    patches = rows * cols
    tokens = patches + config.num_prefix_tokens
    d, m = config.hidden_size, config.mlp_dim
    mlp = (3 if config.mlp_type == "swiglu" else 2) * d * m
    patch = patches * config.patch_size[0] * config.patch_size[1] * config.channels * d
    block = tokens * (4 * d * d + mlp) + 2 * tokens * tokens * d
    pool = 2 * d * d + tokens * (2 * d * d + 2 * d) + 2 * d * m if config.classifier == "map" else 0
    return 2 * (patch + config.num_layers * block + pool + d * max(config.num_classes, 0))


def build_keras_vit(config, dtype="float32"):
    import keras_vit

    return keras_vit.ViT(config, dtype=dtype)


def build_keras_hub(config, dtype="float32"):
    """keras-hub's ViTImageClassifier of the same architecture (pip install keras-hub)."""
    try:
        import keras_hub
    except ImportError:
        raise ValueError("--against keras-hub needs keras-hub: pip install --no-deps keras-hub==0.32.0") from None
    backbone = keras_hub.models.ViTBackbone(
        image_shape=tuple(config.image_size) + (config.channels,),
        patch_size=tuple(config.patch_size),
        num_layers=config.num_layers,
        num_heads=config.num_heads,
        hidden_dim=config.hidden_size,
        mlp_dim=config.mlp_dim,
        layer_norm_epsilon=config.layer_norm_epsilon,
        dtype=dtype,
    )
    return keras_hub.models.ViTImageClassifier(backbone, num_classes=config.num_classes, dtype=dtype)


def import_timm():
    """timm, imported. Where torchvision's compiled ops do not load beside this torch (the CUDA
    wheel PyPI serves next to a CPU torch), timm is imported again over `torchvision_stub`, with a
    note: its ViT never calls torchvision."""
    try:
        import timm.models.vision_transformer  # noqa: F401
    except ImportError:
        raise ValueError("--against timm needs timm and torch: pip install timm torch") from None
    except RuntimeError as error:
        if "torchvision" not in str(error):
            raise ValueError(f"timm failed to import ({error})") from None
        for name in [n for n in sys.modules if n.split(".")[0] in ("timm", "torchvision")]:
            del sys.modules[name]
        torchvision_stub.install()
        import timm.models.vision_transformer  # noqa: F401

        logger.warning("keras_vit: torchvision does not load beside this torch (%s); timm runs without it", error)
    import timm

    return timm


def build_timm(config):
    """timm's VisionTransformer of the same architecture (a torch module, float32): the paper's
    ViT, DINOv2 with and without registers, SigLIP's attention-pool head. Options it lacks
    (rotary embeddings, SwiGLU, hybrids) are a ValueError."""
    lacking = [
        name
        for name, lacks in (
            ("rotary embeddings", config.rope is not None),
            ("a SwiGLU MLP", config.mlp_type != "gelu" or config.mlp_norm),
            ("query and value biases only", not config.key_bias),
            ("a ResNet stem", config.resnet_layers is not None),
            ("no position embedding", not config.position_embedding),
        )
        if lacks
    ]
    if lacking:
        raise ValueError(f"--against timm builds timm's VisionTransformer, which has no {', '.join(lacking)}.")
    VisionTransformer = import_timm().models.vision_transformer.VisionTransformer
    return VisionTransformer(
        img_size=tuple(config.image_size),
        patch_size=tuple(config.patch_size),
        in_chans=config.channels,
        num_classes=config.num_classes,
        embed_dim=config.hidden_size,
        depth=config.num_layers,
        num_heads=config.num_heads,
        mlp_ratio=config.mlp_dim / config.hidden_size,
        qkv_bias=config.qkv_bias,
        class_token=bool(config.num_class_tokens),
        no_embed_class=config.no_embed_class,
        reg_tokens=config.num_register_tokens,
        global_pool={"token": "token", "gap": "avg", "map": "map"}[config.classifier],
        fc_norm=config.fc_norm,
        init_values=config.layer_scale_init,
        act_layer="gelu_tanh" if config.gelu_approximate else "gelu",
    )
