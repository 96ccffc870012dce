"""The official JAX layout (google-research/vision_transformer and big_vision .npz files).

Every variant is first normalised to the original release's names (`_1/_2/_3` module
suffixes, no prefix, one `encoderblock_{i}` per block); then one table maps those names to
keras_vit variables. Query/key/value kernels are `(D, heads, head_dim)`, `out` is
`(heads, head_dim, D)`; Conv2D kernels are HWIO in both worlds.
"""

import json
import re

import numpy as np

from keras_vit.checkpoints.files import CheckpointError
from keras_vit.checkpoints.remap import Remap
from keras_vit.config import resnet_stride

POS_KEY = "Transformer/posembed_input/pos_embedding"
# keras_vit's own addition (readers of the official layout ignore it): the patch grid (rows,
# columns) of the position embedding, which a token count alone does not tell for non-square
# grids.
GRID_KEY = "Transformer/posembed_input/grid_size"
GRID_PATH = "position_embedding/grid_size"  # where it travels beside the weights
# keras_vit's own record in its .npz files (readers of the official layout ignore it): the
# model's ViTConfig and class names as JSON, for what tensors do not tell (LayerNorm epsilon,
# input statistics, the image transform, the labels).
RECORD_KEY = "keras_vit/model.json"
_PREFIXES = ("opt/target/", "params/img/", "params/")
# Newer linen code and big_vision number the block's modules 0, 0, 1, 0.
_LINEN_TO_ORIGINAL = {
    "MultiHeadDotProductAttention_0": "MultiHeadDotProductAttention_1",
    "LayerNorm_1": "LayerNorm_2",
    "MlpBlock_0": "MlpBlock_3",
}
_BLOCK = re.compile(r"^Transformer/encoderblock_(\d+)/")
MAP_PROBE = "MAPHead_0/probe"  # big_vision's attention-pool head (SigLIP)


def record(config, class_names):
    """The `RECORD_KEY` array of a model's config (a dict) and class names (None: none)."""
    return np.asarray(json.dumps({"config": config, "class_names": None if class_names is None else list(class_names)}))


def pop_record(tensors):
    """`(config fields, class names)` of a keras_vit .npz file's record, removed from `tensors`;
    `({}, None)` for files without one. A prefix before it (big_vision's `params/`) is allowed."""
    key = next((k for k in tensors if k == RECORD_KEY or k.endswith("/" + RECORD_KEY)), None)
    if key is None:
        return {}, None
    value = tensors.pop(key)
    try:
        values = json.loads(str(value))
        config, names = dict(values["config"]), values["class_names"]
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"the keras_vit record {RECORD_KEY} is damaged ({error}).") from None
    return config, None if names is None else tuple(names)


def is_official(tensors):
    return any(f"{p}embedding/kernel" in tensors for p in ("",) + _PREFIXES)


def normalise(tensors):
    """Any official/big_vision variant -> the original release's names (a new dict)."""
    prefix = next((p for p in _PREFIXES if f"{p}embedding/kernel" in tensors), "")
    out = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
    if "pos_embedding" in out:  # big_vision: top-level, without the class-token slot
        out[POS_KEY] = out.pop("pos_embedding")
    stacked = [k for k in out if k.startswith("Transformer/encoderblock/")]
    for key in stacked:  # big_vision `scan`: one array per parameter, layer index first
        value = out.pop(key)
        rest = key[len("Transformer/encoderblock/") :]
        for i in range(value.shape[0]):
            out[f"Transformer/encoderblock_{i}/{rest}"] = value[i]
    if any(_BLOCK.match(k) and "/MultiHeadDotProductAttention_0/" in k for k in out):
        renamed = {}
        for key, value in out.items():
            if _BLOCK.match(key):
                parts = key.split("/")
                parts[2] = _LINEN_TO_ORIGINAL.get(parts[2], parts[2])
                key = "/".join(parts)
            renamed[key] = value
        out = renamed
    return out


def config_fields(tensors):
    """ViTConfig fields read off normalised official tensors."""
    kernel = tensors["embedding/kernel"]
    layers = sorted({int(m.group(1)) for k in tensors if (m := _BLOCK.match(k))})
    query = tensors["Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel"]
    fields = dict(
        hidden_size=kernel.shape[-1],
        patch_size=tuple(kernel.shape[:2]),
        channels=kernel.shape[2],
        num_layers=len(layers),
        num_heads=query.shape[1],
        mlp_dim=tensors["Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"].shape[1],
        classifier="token" if "cls" in tensors else "map" if MAP_PROBE in tensors else "gap",
        num_classes=tensors["head/bias"].shape[-1] if "head/bias" in tensors else 0,
        representation_size=tensors["pre_logits/bias"].shape[-1] if "pre_logits/bias" in tensors else None,
    )
    if MAP_PROBE in tensors:  # big_vision's SigLIP image towers: flax's GELU, the tanh form
        fields["gelu_approximate"] = True
        if tensors[MAP_PROBE].shape[-2] != 1:
            raise CheckpointError("an attention-pool head with several probes is not supported.")
    if "Transformer/encoderblock_0/LayerScale_0/scale" in tensors:
        fields["layer_scale_init"] = 1e-5
    stride = 1
    if "conv_root/kernel" in tensors:
        stages = sorted({int(m.group(1)) for k in tensors if (m := re.match(r"^block(\d+)/", k))})
        fields["resnet_layers"] = tuple(
            len({m.group(1) for k in tensors if (m := re.match(rf"^block{s}/unit(\d+)/", k))}) for s in stages
        )
        fields["resnet_width"] = tensors["conv_root/kernel"].shape[-1]
        fields["channels"] = tensors["conv_root/kernel"].shape[2]
        stride = resnet_stride(len(stages))
    grid = tensors.get(GRID_KEY)
    fields["image_size"] = image_size(tensors[POS_KEY].shape[-2], fields, stride, grid)
    return fields


def image_size(tokens, fields, stride, grid=None):
    """The image size (rows, columns) of a position embedding of `tokens` tokens: from `grid`
    when stored, else from the square grid the tokens make, with or without a class slot
    (big_vision and timm's `no_embed_class` models store none); None when they make no square
    (a non-square model's file without its grid: the caller must be given the size)."""
    patch = fields["patch_size"]
    if grid is not None:
        rows, cols = (int(g) for g in np.asarray(grid))
        return (rows * patch[0] * stride, cols * patch[1] * stride)
    class_token = fields.get("class_token")
    if (fields["classifier"] == "token" if class_token is None else class_token) and not _is_square(tokens):
        tokens -= 1
    if not _is_square(tokens):
        return None
    side = int(round(tokens**0.5))
    return (side * patch[0] * stride, side * patch[1] * stride)


def _is_square(n):
    return int(round(n**0.5)) ** 2 == n


def to_keras(tensors):
    """Normalised official tensors -> {keras_vit variable path: array}."""
    r = Remap(tensors)
    r.move("embedding/kernel", "patch_embedding/projection/kernel")
    r.move("embedding/bias", "patch_embedding/projection/bias")
    r.move("cls", "class_token/token")
    r.move(POS_KEY, "position_embedding/embedding")
    r.move(GRID_KEY, GRID_PATH)
    for i in sorted({int(m.group(1)) for k in tensors if (m := _BLOCK.match(k))}):
        src, dst = f"Transformer/encoderblock_{i}/", f"block_{i}/"
        mha = src + "MultiHeadDotProductAttention_1/"
        for norm, name in (("LayerNorm_0", "norm1"), ("LayerNorm_2", "norm2")):
            r.move(f"{src}{norm}/scale", f"{dst}{name}/gamma")
            r.move(f"{src}{norm}/bias", f"{dst}{name}/beta")
        qkv = [f"{mha}{n}" for n in ("query", "key", "value")]
        if r.has(*(f"{n}/kernel" for n in qkv)):
            r.out[f"{dst}attention/qkv/kernel"] = np.concatenate(
                [_flat_last(r.pop(f"{n}/kernel")) for n in qkv], axis=1
            )
        if r.has(*(f"{n}/bias" for n in qkv)):
            r.out[f"{dst}attention/qkv/bias"] = np.concatenate([r.pop(f"{n}/bias").reshape(-1) for n in qkv])
        r.move(f"{mha}out/kernel", f"{dst}attention/out/kernel", lambda w: w.reshape(-1, w.shape[-1]))
        r.move(f"{mha}out/bias", f"{dst}attention/out/bias")
        for j, name in ((0, "fc1"), (1, "fc2")):
            r.move(f"{src}MlpBlock_3/Dense_{j}/kernel", f"{dst}mlp/{name}/kernel")
            r.move(f"{src}MlpBlock_3/Dense_{j}/bias", f"{dst}mlp/{name}/bias")
        r.move(f"{src}LayerScale_0/scale", f"{dst}scale1/gamma")
        r.move(f"{src}LayerScale_1/scale", f"{dst}scale2/gamma")
    _map_head_to_keras(r)
    r.move("Transformer/encoder_norm/scale", "encoder_norm/gamma")
    r.move("Transformer/encoder_norm/bias", "encoder_norm/beta")
    for name in ("pre_logits/kernel", "pre_logits/bias", "head/kernel", "head/bias"):
        r.move(name, name)
    r.move("conv_root/kernel", "resnet/conv_root/kernel")
    r.move("gn_root/scale", "resnet/gn_root/gamma")
    r.move("gn_root/bias", "resnet/gn_root/beta")
    for key in list(tensors):
        match = re.match(r"^block(\d+)/unit(\d+)/(\w+)/(\w+)$", key)
        if match:
            stage, unit, layer, param = match.groups()
            param = {"scale": "gamma", "bias": "beta"}.get(param, param) if layer.startswith("gn") else param
            r.move(key, f"resnet/block{stage}_unit{unit}/{layer}/{param}")
    return r.result()


def _map_head_to_keras(r):
    """big_vision's `MAPHead_0` -> the `attention_pool` layer (key and value in one Dense)."""
    src, mha, dst = "MAPHead_0/", "MAPHead_0/MultiHeadDotProductAttention_0/", "attention_pool/"
    r.move(MAP_PROBE, f"{dst}probe")
    r.move(f"{mha}query/kernel", f"{dst}query/kernel", _flat_last)
    r.move(f"{mha}query/bias", f"{dst}query/bias", lambda b: b.reshape(-1))
    if r.has(f"{mha}key/kernel", f"{mha}value/kernel"):
        r.out[f"{dst}key_value/kernel"] = np.concatenate(
            [_flat_last(r.pop(f"{mha}{n}/kernel")) for n in ("key", "value")], axis=1
        )
    if r.has(f"{mha}key/bias", f"{mha}value/bias"):
        r.out[f"{dst}key_value/bias"] = np.concatenate([r.pop(f"{mha}{n}/bias").reshape(-1) for n in ("key", "value")])
    r.move(f"{mha}out/kernel", f"{dst}out/kernel", lambda w: w.reshape(-1, w.shape[-1]))
    r.move(f"{mha}out/bias", f"{dst}out/bias")
    r.move(f"{src}LayerNorm_0/scale", f"{dst}norm/gamma")
    r.move(f"{src}LayerNorm_0/bias", f"{dst}norm/beta")
    for j, name in ((0, "fc1"), (1, "fc2")):
        r.move(f"{src}MlpBlock_0/Dense_{j}/kernel", f"{dst}mlp/{name}/kernel")
        r.move(f"{src}MlpBlock_0/Dense_{j}/bias", f"{dst}mlp/{name}/bias")


def from_keras(weights, num_heads):
    """{keras_vit variable path: array} -> official .npz names (original release)."""
    out = {}
    for path, value in weights.items():
        parts = path.split("/")
        if path.startswith("patch_embedding/projection/"):
            out[f"embedding/{parts[-1]}"] = value
        elif path == "class_token/token":
            out["cls"] = value
        elif path == "position_embedding/embedding":
            out[POS_KEY] = value
        elif path == GRID_PATH:
            out[GRID_KEY] = value
        elif parts[0].startswith("block_"):
            out.update(_block_from_keras(int(parts[0][6:]), "/".join(parts[1:]), value, num_heads))
        elif parts[0] == "encoder_norm":
            out[f"Transformer/encoder_norm/{_norm_param(parts[1])}"] = value
        elif parts[0] in ("pre_logits", "head"):
            out[path] = value
        elif parts[0] == "resnet":
            if parts[1] in ("conv_root", "gn_root"):
                key = f"{parts[1]}/{_norm_param(parts[2]) if parts[1].startswith('gn') else parts[2]}"
            else:
                stage, unit = re.match(r"block(\d+)_unit(\d+)", parts[1]).groups()
                param = _norm_param(parts[3]) if parts[2].startswith("gn") else parts[3]
                key = f"block{stage}/unit{unit}/{parts[2]}/{param}"
            out[key] = value
        else:
            raise CheckpointError(
                f"the official .npz layout has no name for variable {path!r}: save this model as a .keras file "
                "(model.save) instead."
            )
    return out


def _block_from_keras(i, name, value, num_heads):
    src = f"Transformer/encoderblock_{i}/"
    mha = src + "MultiHeadDotProductAttention_1/"
    if name == "attention/qkv/kernel":
        width = value.shape[0]
        q, k, v = np.split(value, 3, axis=1)
        return {
            f"{mha}{n}/kernel": w.reshape(width, num_heads, -1) for n, w in zip(("query", "key", "value"), (q, k, v))
        }
    if name == "attention/qkv/bias":
        return {
            f"{mha}{n}/bias": b.reshape(num_heads, -1) for n, b in zip(("query", "key", "value"), np.split(value, 3))
        }
    if name == "attention/out/kernel":
        return {f"{mha}out/kernel": value.reshape(num_heads, -1, value.shape[-1])}
    simple = {
        "attention/out/bias": f"{mha}out/bias",
        "norm1/gamma": f"{src}LayerNorm_0/scale",
        "norm1/beta": f"{src}LayerNorm_0/bias",
        "norm2/gamma": f"{src}LayerNorm_2/scale",
        "norm2/beta": f"{src}LayerNorm_2/bias",
        "mlp/fc1/kernel": f"{src}MlpBlock_3/Dense_0/kernel",
        "mlp/fc1/bias": f"{src}MlpBlock_3/Dense_0/bias",
        "mlp/fc2/kernel": f"{src}MlpBlock_3/Dense_1/kernel",
        "mlp/fc2/bias": f"{src}MlpBlock_3/Dense_1/bias",
        "scale1/gamma": f"{src}LayerScale_0/scale",  # keras_vit extension (no official name)
        "scale2/gamma": f"{src}LayerScale_1/scale",
    }
    if name not in simple:
        raise CheckpointError(
            f"the official .npz layout has no name for variable 'block_{i}/{name}': save this model as a .keras file "
            "(model.save) instead."
        )
    return {simple[name]: value}


def _flat_last(kernel):
    """(D, heads, head_dim) -> (D, heads * head_dim)."""
    return kernel.reshape(kernel.shape[0], -1)


def _norm_param(name):
    return {"gamma": "scale", "beta": "bias"}[name]
