"""Hugging Face checkpoints (PyTorch layouts): `ViTModel` / `ViTForImageClassification`,
`Dinov2Model` and `Dinov2WithRegistersModel`, and SigLIP's vision tower (`SiglipVisionModel`,
the `vision_model` of `SiglipModel`, `SiglipForImageClassification`).

Query, key and value are separate `(D, D)` Linear layers, concatenated into keras_vit's fused
kernel; `pooler.dense` (Dense + tanh on the class token) is the pre-logits layer. SigLIP's
attention-pool head keeps q, k and v in one `in_proj_weight`, split into the probe's query and
the fused key/value. The image processor's statistics (`preprocessor_config.json` beside
`config.json`) become the model's `input_mean` and `input_std`.
"""

import logging
import re
from pathlib import Path

import numpy as np

from keras_vit.checkpoints.files import CheckpointError, read_json
from keras_vit.checkpoints.remap import Remap

logger = logging.getLogger("keras_vit")


# model_type of config.json -> the family's name in messages. SigLIP's full model (`siglip`)
# holds the vision tower's settings under `vision_config`.
MODEL_TYPES = {
    "vit": "ViT",
    "dinov2": "DINOv2",
    "dinov2_with_registers": "DINOv2 with registers",
    "siglip_vision_model": "SigLIP",
    "siglip": "SigLIP",
    "dinov3_vit": "DINOv3",
}
_SIGLIP_PATCHES = "embeddings.patch_embedding.weight"
# SigLIP's text tower and contrastive scale: not part of a vision model.
_SIGLIP_TEXT = ("text_model.", "logit_scale", "logit_bias")


_DINOV3_PATCHES = "embeddings.patch_embeddings.weight"


def is_huggingface(tensors):
    return any(
        k.endswith(("embeddings.patch_embeddings.projection.weight", _SIGLIP_PATCHES, _DINOV3_PATCHES)) for k in tensors
    )


def to_keras(tensors):
    """HF state dict -> {keras_vit variable path: array}."""
    if any(k.endswith(_SIGLIP_PATCHES) for k in tensors):
        return _siglip_to_keras(tensors)
    if any(k.endswith(_DINOV3_PATCHES) for k in tensors):
        return _dinov3_to_keras(tensors)
    prefixes = ("vit.", "dinov2.")
    r = Remap({next((k[len(p) :] for p in prefixes if k.startswith(p)), k): v for k, v in tensors.items()})
    r.move("embeddings.cls_token", "class_token/token")
    r.move("embeddings.register_tokens", "register_tokens/tokens")
    if r.has("embeddings.mask_token"):  # DINOv2's masked-image training: no part of the model
        r.pop("embeddings.mask_token")
    r.move("embeddings.position_embeddings", "position_embedding/embedding")
    r.move(
        "embeddings.patch_embeddings.projection.weight",
        "patch_embedding/projection/kernel",
        lambda w: w.transpose(2, 3, 1, 0),
    )
    r.move("embeddings.patch_embeddings.projection.bias", "patch_embedding/projection/bias")
    for i in sorted({int(m.group(1)) for k in r.source if (m := re.match(r"encoder\.layer\.(\d+)\.", k))}):
        src, dst = f"encoder.layer.{i}.", f"block_{i}/"
        for norm, names in (("norm1", ("layernorm_before", "norm1")), ("norm2", ("layernorm_after", "norm2"))):
            for name in names:  # ViT's names, DINOv2's
                r.move(f"{src}{name}.weight", f"{dst}{norm}/gamma")
                r.move(f"{src}{name}.bias", f"{dst}{norm}/beta")
        for scale in ("1", "2"):  # DINOv2's LayerScale
            r.move(f"{src}layer_scale{scale}.lambda1", f"{dst}scale{scale}/gamma")
        _fuse_qkv(r, [f"{src}attention.attention.{n}" for n in ("query", "key", "value")], dst)
        r.move(f"{src}attention.output.dense.weight", f"{dst}attention/out/kernel", np.transpose)
        r.move(f"{src}attention.output.dense.bias", f"{dst}attention/out/bias")
        gate, up = f"{src}mlp.gate_proj", f"{src}mlp.up_proj"  # DINOv2's SwiGLU in Transformers' own names
        for kind in ("weight", "bias"):
            if r.has(f"{gate}.{kind}", f"{up}.{kind}"):
                r.source[f"{src}mlp.weights_in.{kind}"] = np.concatenate(
                    [r.pop(f"{gate}.{kind}"), r.pop(f"{up}.{kind}")]
                )
            if r.has(f"{src}mlp.down_proj.{kind}"):
                r.source[f"{src}mlp.weights_out.{kind}"] = r.pop(f"{src}mlp.down_proj.{kind}")
        fc1_names = ("intermediate.dense", "mlp.fc1", "mlp.weights_in")
        for fc, names in (("fc1", fc1_names), ("fc2", ("output.dense", "mlp.fc2", "mlp.weights_out"))):
            for name in names:  # ViT's names, DINOv2's, DINOv2's packed SwiGLU [gate | value]
                r.move(f"{src}{name}.weight", f"{dst}mlp/{fc}/kernel", np.transpose)
                r.move(f"{src}{name}.bias", f"{dst}mlp/{fc}/bias")
    r.move("layernorm.weight", "encoder_norm/gamma")
    r.move("layernorm.bias", "encoder_norm/beta")
    r.move("pooler.dense.weight", "pre_logits/kernel", np.transpose)
    r.move("pooler.dense.bias", "pre_logits/bias")
    r.move("classifier.weight", "head/kernel", np.transpose)
    r.move("classifier.bias", "head/bias")
    return r.result()


def _fuse_qkv(r, projections, dst):
    """Moves the query, key and value Linear layers named `projections` into block `dst`'s fused
    `[q | k | v]` kernel and bias, or its `qv_bias` where the key has no bias (DINOv3)."""
    if r.has(*(f"{n}.weight" for n in projections)):
        r.out[f"{dst}attention/qkv/kernel"] = np.concatenate([r.pop(f"{n}.weight").T for n in projections], axis=1)
    q, k, v = (f"{n}.bias" for n in projections)
    if r.has(q, k, v):
        r.out[f"{dst}attention/qkv/bias"] = np.concatenate([r.pop(q), r.pop(k), r.pop(v)])
    elif r.has(q, v):
        r.out[f"{dst}attention/qv_bias"] = np.concatenate([r.pop(q), r.pop(v)])


def _siglip_to_keras(tensors):
    """SigLIP vision tower state dict -> {keras_vit variable path: array}."""
    tensors = {k: v for k, v in tensors.items() if not k.startswith(_SIGLIP_TEXT)}
    r = Remap({k.removeprefix("vision_model."): v for k, v in tensors.items()})
    if r.has("classifier.weight"):  # SiglipForImageClassification: its classifier reads the mean token
        for name in [k for k in r.source if k.startswith("head.")]:  # the unused attention head
            r.pop(name)
    r.move(_SIGLIP_PATCHES, "patch_embedding/projection/kernel", lambda w: w.transpose(2, 3, 1, 0))
    r.move("embeddings.patch_embedding.bias", "patch_embedding/projection/bias")
    r.move("embeddings.position_embedding.weight", "position_embedding/embedding", lambda w: w[None])
    for i in sorted({int(m.group(1)) for k in r.source if (m := re.match(r"encoder\.layers\.(\d+)\.", k))}):
        src, dst = f"encoder.layers.{i}.", f"block_{i}/"
        for norm in ("1", "2"):
            r.move(f"{src}layer_norm{norm}.weight", f"{dst}norm{norm}/gamma")
            r.move(f"{src}layer_norm{norm}.bias", f"{dst}norm{norm}/beta")
        _fuse_qkv(r, [f"{src}self_attn.{n}_proj" for n in ("q", "k", "v")], dst)
        r.move(f"{src}self_attn.out_proj.weight", f"{dst}attention/out/kernel", np.transpose)
        r.move(f"{src}self_attn.out_proj.bias", f"{dst}attention/out/bias")
        for fc in ("fc1", "fc2"):
            r.move(f"{src}mlp.{fc}.weight", f"{dst}mlp/{fc}/kernel", np.transpose)
            r.move(f"{src}mlp.{fc}.bias", f"{dst}mlp/{fc}/bias")
    r.move("post_layernorm.weight", "encoder_norm/gamma")
    r.move("post_layernorm.bias", "encoder_norm/beta")
    pool = "attention_pool/"
    r.move("head.probe", f"{pool}probe")
    if r.has("head.attention.in_proj_weight"):  # (3D, D): [q; k; v] rows
        w = r.pop("head.attention.in_proj_weight")
        width = w.shape[1]
        r.out[f"{pool}query/kernel"], r.out[f"{pool}key_value/kernel"] = w[:width].T, w[width:].T
    if r.has("head.attention.in_proj_bias"):
        b = r.pop("head.attention.in_proj_bias")
        r.out[f"{pool}query/bias"], r.out[f"{pool}key_value/bias"] = b[: b.shape[0] // 3], b[b.shape[0] // 3 :]
    r.move("head.attention.out_proj.weight", f"{pool}out/kernel", np.transpose)
    r.move("head.attention.out_proj.bias", f"{pool}out/bias")
    r.move("head.layernorm.weight", f"{pool}norm/gamma")
    r.move("head.layernorm.bias", f"{pool}norm/beta")
    for fc in ("fc1", "fc2"):
        r.move(f"head.mlp.{fc}.weight", f"{pool}mlp/{fc}/kernel", np.transpose)
        r.move(f"head.mlp.{fc}.bias", f"{pool}mlp/{fc}/bias")
    r.move("classifier.weight", "head/kernel", np.transpose)  # SiglipForImageClassification
    r.move("classifier.bias", "head/bias")
    return r.result()


def _dinov3_to_keras(tensors):
    """`DINOv3ViTModel` state dict -> {keras_vit variable path: array}."""
    r = Remap({k.removeprefix("model."): v for k, v in tensors.items()})
    r.move("embeddings.cls_token", "class_token/token")
    if r.has("embeddings.register_tokens") and not r.source["embeddings.register_tokens"].size:
        r.pop("embeddings.register_tokens")  # stored (1, 0, D) when the model has none
    r.move("embeddings.register_tokens", "register_tokens/tokens")
    if r.has("embeddings.mask_token"):  # masked-image training: no part of the model
        r.pop("embeddings.mask_token")
    r.move(_DINOV3_PATCHES, "patch_embedding/projection/kernel", lambda w: w.transpose(2, 3, 1, 0))
    r.move("embeddings.patch_embeddings.bias", "patch_embedding/projection/bias")
    for i in sorted({int(m.group(1)) for k in r.source if (m := re.match(r"layer\.(\d+)\.", k))}):
        src, dst = f"layer.{i}.", f"block_{i}/"
        for n in ("1", "2"):
            r.move(f"{src}norm{n}.weight", f"{dst}norm{n}/gamma")
            r.move(f"{src}norm{n}.bias", f"{dst}norm{n}/beta")
            r.move(f"{src}layer_scale{n}.lambda1", f"{dst}scale{n}/gamma")
        _fuse_qkv(r, [f"{src}attention.{n}_proj" for n in ("q", "k", "v")], dst)
        r.move(f"{src}attention.o_proj.weight", f"{dst}attention/out/kernel", np.transpose)
        r.move(f"{src}attention.o_proj.bias", f"{dst}attention/out/bias")
        gate, up = f"{src}mlp.gate_proj", f"{src}mlp.up_proj"
        for kind, fn in (("weight", np.transpose), ("bias", None)):
            if r.has(f"{gate}.{kind}"):  # a gated MLP: [gate | value]
                value = np.concatenate([r.pop(f"{gate}.{kind}"), r.pop(f"{up}.{kind}")])
                r.out[f"{dst}mlp/fc1/{'kernel' if kind == 'weight' else 'bias'}"] = fn(value) if fn else value
            r.move(f"{up}.{kind}", f"{dst}mlp/fc1/{'kernel' if kind == 'weight' else 'bias'}", fn)
            r.move(f"{src}mlp.down_proj.{kind}", f"{dst}mlp/fc2/{'kernel' if kind == 'weight' else 'bias'}", fn)
    r.move("norm.weight", "encoder_norm/gamma")
    r.move("norm.bias", "encoder_norm/beta")
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
    model_type = hf_config.get("model_type", "vit")
    if model_type not in MODEL_TYPES:
        raise CheckpointError(
            f"unsupported Hugging Face model_type {model_type!r}; keras_vit reads {', '.join(MODEL_TYPES)}."
        )
    if model_type == "siglip":
        hf_config = {**hf_config.get("vision_config", {}), "model_type": "siglip_vision_model"}
    activation = hf_config.get("hidden_act", "gelu")
    gated = bool(hf_config.get("use_swiglu_ffn") or hf_config.get("use_gated_mlp"))
    if gated and model_type == "dinov3_vit" and activation != "silu":
        raise CheckpointError(
            f"unsupported gated MLP with hidden_act {activation!r}; keras_vit's gated MLP is SwiGLU (silu)."
        )
    if not gated and activation not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
        raise CheckpointError(f"unsupported hidden_act {activation!r}; keras_vit's MLP uses GELU.")
    heads = {k for k in tensors if k.endswith("classifier.bias")}
    num_classes = tensors[heads.pop()].shape[0] if heads else 0
    pooler = [k for k in tensors if k.endswith("pooler.dense.bias")]
    # The MLP's width: the input of its output Dense (a SwiGLU's first Dense is twice as wide).
    fc2 = [
        v
        for k, v in tensors.items()
        if not k.startswith(_SIGLIP_TEXT)
        and re.search(r"(^|\.)layers?\.0\.(output\.dense|mlp\.fc2|mlp\.weights_out|mlp\.down_proj)\.weight$", k)
    ]
    # Transformers' `interpolate_pos_encoding`: torch's bicubic to the new grid, antialiased for
    # DINOv2 with registers only.
    posemb = "bicubic_antialias" if model_type == "dinov2_with_registers" else "bicubic"
    family = dict(qkv_bias=hf_config.get("qkv_bias", True), posemb_interpolation=posemb)
    if model_type.startswith("dinov2"):
        family.update(
            layer_scale_init=hf_config.get("layerscale_value", 1.0),
            num_register_tokens=hf_config.get("num_register_tokens", 0),
        )
    elif model_type == "dinov3_vit":
        biases = [hf_config.get(f"{n}_bias", n != "key") for n in ("query", "key", "value")]
        if biases[0] != biases[2]:
            raise CheckpointError(
                "a DINOv3 checkpoint with a query bias but no value bias (or the reverse) is not supported."
            )
        family.update(
            position_embedding=False,
            rope="dinov3",
            rope_theta=float(hf_config.get("rope_theta", 100.0)),
            num_register_tokens=hf_config.get("num_register_tokens", 0),
            layer_scale_init=hf_config.get("layerscale_value", 1.0),
            qkv_bias=biases[0],
            key_bias=biases[1],
        )
    elif model_type.startswith("siglip"):
        # SigLIP has no class token: its vision model pools with its attention head, its image
        # classifier (which keeps an unused attention head) with the mean of the tokens.
        family.update(classifier="map" if any(k.endswith("head.probe") for k in tensors) and not num_classes else "gap")
    patch, size = hf_config.get("patch_size", 16), hf_config.get("image_size", 224)
    if isinstance(size, int) and isinstance(patch, int) and size % patch:
        # Transformers' patch convolution leaves the last pixels out (SigLIP So400m/14 at 384 sees 378).
        logger.warning(
            "keras_vit: config.json's image size %d is no multiple of its %d-pixel patches: the model sees %d pixels "
            "(the same %dx%d grid), as the reference's patch convolution does",
            size,
            patch,
            size // patch * patch,
            size // patch,
            size // patch,
        )
        size = size // patch * patch
    return dict(
        hidden_size=hf_config["hidden_size"],
        num_layers=hf_config["num_hidden_layers"],
        num_heads=hf_config["num_attention_heads"],
        mlp_dim=fc2[0].shape[1] if fc2 else hf_config["intermediate_size"],
        mlp_type="swiglu" if gated else "gelu",
        image_size=size,
        patch_size=patch,
        channels=hf_config.get("num_channels", 3),
        layer_norm_epsilon=hf_config.get("layer_norm_eps", 1e-12),
        gelu_approximate=activation != "gelu",
        num_classes=num_classes,
        representation_size=tensors[pooler[0]].shape[0] if pooler else None,
        **family,
        **input_statistics(processor),
        **input_transform(processor),
    )
