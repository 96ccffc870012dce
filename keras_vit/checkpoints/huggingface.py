"""Hugging Face `ViTModel` / `ViTForImageClassification` checkpoints (PyTorch layouts).

Query, key and value are separate `(D, D)` Linear layers, concatenated into keras_vit's fused
kernel; `pooler.dense` (Dense + tanh on the class token) is the pre-logits layer. The image
processor's statistics (`preprocessor_config.json` beside `config.json`) become the model's
`input_mean` and `input_std`.
"""

import re
from pathlib import Path

import numpy as np

from keras_vit.checkpoints.files import CheckpointError, read_json
from keras_vit.checkpoints.remap import Remap


def is_huggingface(tensors):
    return any(k.endswith("embeddings.patch_embeddings.projection.weight") for k in tensors)


def to_keras(tensors):
    """HF state dict -> {keras_vit variable path: array}."""
    r = Remap({k[len("vit.") :] if k.startswith("vit.") else k: v for k, v in tensors.items()})
    r.move("embeddings.cls_token", "class_token/token")
    r.move("embeddings.position_embeddings", "position_embedding/embedding")
    r.move(
        "embeddings.patch_embeddings.projection.weight",
        "patch_embedding/projection/kernel",
        lambda w: w.transpose(2, 3, 1, 0),
    )
    r.move("embeddings.patch_embeddings.projection.bias", "patch_embedding/projection/bias")
    for i in sorted({int(m.group(1)) for k in r.source if (m := re.match(r"encoder\.layer\.(\d+)\.", k))}):
        src, dst = f"encoder.layer.{i}.", f"block_{i}/"
        r.move(f"{src}layernorm_before.weight", f"{dst}norm1/gamma")
        r.move(f"{src}layernorm_before.bias", f"{dst}norm1/beta")
        qkv = [f"{src}attention.attention.{n}" for n in ("query", "key", "value")]
        if r.has(*(f"{n}.weight" for n in qkv)):
            r.out[f"{dst}attention/qkv/kernel"] = np.concatenate([r.pop(f"{n}.weight").T for n in qkv], axis=1)
        if r.has(*(f"{n}.bias" for n in qkv)):
            r.out[f"{dst}attention/qkv/bias"] = np.concatenate([r.pop(f"{n}.bias") for n in qkv])
        r.move(f"{src}attention.output.dense.weight", f"{dst}attention/out/kernel", np.transpose)
        r.move(f"{src}attention.output.dense.bias", f"{dst}attention/out/bias")
        r.move(f"{src}layernorm_after.weight", f"{dst}norm2/gamma")
        r.move(f"{src}layernorm_after.bias", f"{dst}norm2/beta")
        r.move(f"{src}intermediate.dense.weight", f"{dst}mlp/fc1/kernel", np.transpose)
        r.move(f"{src}intermediate.dense.bias", f"{dst}mlp/fc1/bias")
        r.move(f"{src}output.dense.weight", f"{dst}mlp/fc2/kernel", np.transpose)
        r.move(f"{src}output.dense.bias", f"{dst}mlp/fc2/bias")
    r.move("layernorm.weight", "encoder_norm/gamma")
    r.move("layernorm.bias", "encoder_norm/beta")
    r.move("pooler.dense.weight", "pre_logits/kernel", np.transpose)
    r.move("pooler.dense.bias", "pre_logits/bias")
    r.move("classifier.weight", "head/kernel", np.transpose)
    r.move("classifier.bias", "head/bias")
    return r.result()


def class_names(hf_config):
    """The class names of a `config.json`'s `id2label`, in index order; None when it has none or
    only Transformers' placeholders (`LABEL_0`, ...)."""
    id2label = (hf_config or {}).get("id2label") or {}
    try:
        names = [str(id2label[key]) for key in sorted(id2label, key=int)]
    except (TypeError, ValueError):
        return None
    if not names or [int(key) for key in sorted(id2label, key=int)] != list(range(len(names))):
        return None
    if all(name == f"LABEL_{i}" for i, name in enumerate(names)):
        return None
    return tuple(names)


PROCESSOR_FILE = "preprocessor_config.json"
# Transformers' defaults for a ViT image processor without these keys.
_RESCALE, _MEAN, _STD = 1 / 255, 0.5, 0.5
_PIL_INTERPOLATIONS = {0: "nearest", 2: "bilinear"}  # PIL resample codes keras_vit's transform has


def read_processor(path):
    """The image processor config (`preprocessor_config.json`) beside a Hugging Face checkpoint
    folder or weights file; None when there is none."""
    path = Path(path)
    return read_json((path if path.is_dir() else path.parent) / PROCESSOR_FILE)


def input_statistics(processor):
    """`input_mean` and `input_std` (pixel units) of an image processor config: Transformers feeds
    `(x * rescale_factor - image_mean) / image_std` of pixels x in [0, 255]; {} without one."""
    if not processor:
        return {}
    scale = processor.get("rescale_factor", _RESCALE) if processor.get("do_rescale", True) else 1.0
    mean, std = (processor.get("image_mean", _MEAN), processor.get("image_std", _STD))
    if not processor.get("do_normalize", True):
        mean, std = 0.0, 1.0
    mean, std = np.atleast_1d(np.asarray(mean, float)), np.atleast_1d(np.asarray(std, float))
    if not scale > 0 or not min(std) > 0:
        raise CheckpointError(f"{PROCESSOR_FILE}: rescale_factor and image_std must be positive; got {scale}, {std}.")
    return dict(input_mean=tuple(float(m / scale) for m in mean), input_std=tuple(float(s / scale) for s in std))


def input_transform(processor):
    """`crop_fraction` (and `interpolation` where keras_vit has the processor's) of an image
    processor config that resizes: Transformers' ViT processor resizes to `size` (crop 1), DeiT's
    resizes to 256 and centre-crops 224 (crop 0.875); {} without one, or when it does not resize."""
    if not processor or not processor.get("do_resize", True):
        return {}
    fields = {}
    resample = processor.get("resample")
    if resample in _PIL_INTERPOLATIONS:  # others (bicubic, Lanczos) keep keras_vit's bilinear
        fields["interpolation"] = _PIL_INTERPOLATIONS[resample]
    resized = _side(processor.get("size"))
    cropped = _side(processor.get("crop_size")) if processor.get("do_center_crop", False) else None
    if resized:
        fields["crop_fraction"] = min(1.0, cropped / resized) if cropped else 1.0
    return fields


def _side(size):
    """The height of a processor's `size` or `crop_size` (an int, {"height", "width"} or
    {"shortest_edge"}); None when it gives none."""
    if isinstance(size, dict):
        size = size.get("height", size.get("shortest_edge"))
    return size if isinstance(size, (int, float)) and not isinstance(size, bool) and size > 0 else None


def config_fields(hf_config, tensors, processor=None):
    """ViTConfig fields from a Hugging Face `config.json` (and the tensors, for the heads; and
    the image processor config, for the input statistics and transform)."""
    if hf_config is None:
        raise CheckpointError("a Hugging Face checkpoint needs its config.json beside the weights.")
    if hf_config.get("model_type", "vit") != "vit":
        raise CheckpointError(f"unsupported Hugging Face model_type {hf_config.get('model_type')!r}; expected 'vit'.")
    activation = hf_config.get("hidden_act", "gelu")
    if activation not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
        raise CheckpointError(f"unsupported hidden_act {activation!r}; keras_vit's MLP uses GELU.")
    heads = {k for k in tensors if k.endswith("classifier.bias")}
    num_classes = tensors[heads.pop()].shape[0] if heads else 0
    pooler = [k for k in tensors if k.endswith("pooler.dense.bias")]
    return dict(
        hidden_size=hf_config["hidden_size"],
        num_layers=hf_config["num_hidden_layers"],
        num_heads=hf_config["num_attention_heads"],
        mlp_dim=hf_config["intermediate_size"],
        image_size=hf_config.get("image_size", 224),
        patch_size=hf_config.get("patch_size", 16),
        channels=hf_config.get("num_channels", 3),
        layer_norm_epsilon=hf_config.get("layer_norm_eps", 1e-12),
        gelu_approximate=activation != "gelu",
        qkv_bias=hf_config.get("qkv_bias", True),
        num_classes=num_classes,
        representation_size=tensors[pooler[0]].shape[0] if pooler else None,
        **input_statistics(processor),
        **input_transform(processor),
    )
