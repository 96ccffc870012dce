"""keras-hub's ViT family, read with h5py (keras-hub is not needed): preset folders (what
`save_to_preset` writes and Kaggle serves) and `.keras` files of a `ViTBackbone` or
`ViTImageClassifier`, a `DINOV2Backbone` (with or without registers), a `DINOV3Backbone`, and
SigLIP's vision tower (a `SigLIPVisionEncoder`, or the one in a `SigLIPBackbone`, whose text tower
is left out).

Keras stores a model's weights in HDF5 under the snake-cased class names of its layers
(`vi_t_encoder_block`, `vi_t_encoder_block_1`, ..., `dense`), each layer's variables as
`vars/0`, `vars/1` in creation order, trainable ones first. keras-hub's attention keeps separate
query, key and value kernels (`keras.layers.MultiHeadAttention`'s `(D, heads, head_dim)`, DINOv3's
`(D, D)`), fused here into keras_vit's `(D, 3D)` one. Its image converter computes
`pixels * scale + offset`: keras_vit's `input_mean = -offset / scale`, `input_std = 1 / scale`.

What keras_vit computes of each: the ViT's logits (or pooled features); the first token of
DINOv2's and DINOv3's output sequence (the final LayerNorm's class token: `classifier="token"`,
no head); SigLIP's attention-pooled vector (`classifier="map"`).
"""

import io
import json
import logging
import re
import zipfile
from pathlib import Path

import numpy as np

from keras_vit.checkpoints.files import CheckpointError
from keras_vit.checkpoints.official import GRID_PATH

logger = logging.getLogger("keras_vit")

BACKBONE = "keras_hub>ViTBackbone"
CLASSIFIER = "keras_hub>ViTImageClassifier"
CONVERTER = "keras_hub>ViTImageConverter"
DINOV2 = "keras_hub>DINOV2Backbone"
DINOV3 = "keras_hub>DINOV3Backbone"
SIGLIP_VISION = "keras_hub>SigLIPVisionEncoder"
SIGLIP = "keras_hub>SigLIPBackbone"  # its `vision_encoder` is read
KAGGLE_PREFIX = "kaggle://"
PRESET_FILES = ("config.json", "model.weights.h5")  # a backbone preset; a classifier adds:
TASK_FILES = ("task.json", "task.weights.h5")
READS = (
    "ViT (ViTBackbone, ViTImageClassifier), DINOv2 (DINOV2Backbone), DINOv3 (DINOV3Backbone) and SigLIP's vision "
    "tower (SigLIPVisionEncoder, SigLIPBackbone)"
)
_EMBEDDING = "vi_t_patching_and_embedding/"


def download(handle):
    """The local folder of a Kaggle model handle such as
    `kaggle://keras/vit/keras/vit_base_patch16_224_imagenet/4` (keras-hub's published presets),
    downloaded once into kagglehub's cache."""
    try:
        import kagglehub
    except ImportError:
        raise CheckpointError(f"{handle}: Kaggle downloads need kagglehub (pip install kagglehub).") from None
    try:
        return Path(kagglehub.model_download(handle.removeprefix(KAGGLE_PREFIX)))
    except Exception as error:  # kagglehub's own errors, and the network's
        raise CheckpointError(
            f"{handle}: download failed ({type(error).__name__}: {error}); pass the preset folder's path instead."
        ) from None


def is_keras_hub(path):
    """Whether `path` is a keras-hub preset folder or `.keras` file (of any model: `read` says
    which it reads)."""
    try:
        return str(_registered(_Files(path).json("config.json"))).startswith("keras_hub>")
    except (CheckpointError, OSError, zipfile.BadZipFile):
        return False


def read(path):
    """`(weights, fields)`: weights keyed by keras_vit variable path, and the ViTConfig fields.

    `path`: a preset folder (`config.json` of a backbone, its `model.weights.h5`, and for a ViT
    classifier `task.json` and `task.weights.h5`), or a model's `.keras` file (or the folder it
    unzips to)."""
    files = _Files(path)
    missing = [name for name in PRESET_FILES if not files.has(name)]
    if missing:
        raise CheckpointError(f"{path}: a keras-hub model without {', '.join(missing)}.")
    top = files.json("config.json")
    backbone, task, inside = top, None, ""
    if _registered(top) == CLASSIFIER:
        backbone, task = top["config"]["backbone"], top
    elif _registered(top) == SIGLIP:
        backbone, inside = top["config"]["vision_encoder"], "sig_lip_vision_encoder/layers/"
    family = _FAMILIES.get(_registered(backbone))
    if family is None:
        raise CheckpointError(f"{path}: keras-hub model {_registered(top)}; keras_vit reads keras-hub's {READS}.")
    tensors = _read_h5(files.h5("model.weights.h5"), f"{path}: model.weights.h5")
    if _registered(backbone) == BACKBONE and task is None and all(files.has(name) for name in TASK_FILES):
        task = files.json("task.json")  # a ViT classifier's preset
        tensors.update(_read_h5(files.h5("task.weights.h5"), f"{path}: task.weights.h5"))
    tensors = _backbone_tensors(tensors, inside)
    converter = files.json("image_converter.json") if files.has("image_converter.json") else _find_converter(task)
    fields_of, to_keras = family
    fields = fields_of(backbone["config"], task and task["config"], tensors, path)
    if converter:
        fields.update(_input_statistics(converter["config"], fields["channels"]))
    return to_keras(_Tensors(tensors), fields, backbone["config"]), fields


class _Files:
    """The files of a preset folder or of a `.keras` zip archive, by name, read when asked for."""

    def __init__(self, path):
        self.path = Path(path)
        self.names = None  # a folder's files are looked up on disk
        if not self.path.is_dir():
            if self.path.suffix != ".keras":
                raise CheckpointError(f"{path}: neither a folder nor a .keras file.")
            with zipfile.ZipFile(self.path) as archive:
                self.names = set(archive.namelist())

    def has(self, name):
        return name in self.names if self.names is not None else (self.path / name).is_file()

    def read(self, name):
        if self.names is None:
            return (self.path / name).read_bytes()
        with zipfile.ZipFile(self.path) as archive:
            return archive.read(name)

    def h5(self, name):
        """What h5py opens: a folder's file by its path (not copied into memory), an archive
        member as bytes."""
        return str(self.path / name) if self.names is None else io.BytesIO(self.read(name))

    def json(self, name):
        try:
            return json.loads(self.read(name))
        except (KeyError, FileNotFoundError):
            raise CheckpointError(f"{self.path}: no {name}.") from None
        except json.JSONDecodeError as error:
            raise CheckpointError(f"{self.path}: {name} is not valid JSON ({error}).") from None


class _Tensors:
    """A checkpoint's tensors by path, popped as they are placed: whatever is left keeps its
    name, for the assignment to report."""

    def __init__(self, tensors):
        self.source = dict(tensors)

    def take(self, name, default=None):
        if name in self.source:
            return self.source.pop(name)
        if default is None:
            raise CheckpointError(f"keras-hub checkpoint: tensor {name} is missing.")
        return default

    def dense(self, src, out, dst, width=None):
        """The Dense layer at `src` (`vars/0` kernel, `vars/1` bias, zero when it has none) as `dst`
        kernel and bias; `width` flattens keras-hub's per-head ones (`(width, -1)` and `(-1,)`)."""
        kernel = self.take(f"{src}vars/0")
        kernel = kernel if width is None else kernel.reshape(width, -1)
        out[f"{dst}/kernel"] = kernel
        out[f"{dst}/bias"] = self.take(f"{src}vars/1", np.zeros(kernel.shape[-1], "float32")).reshape(-1)

    def norm(self, src, out, dst):
        out[f"{dst}/gamma"], out[f"{dst}/beta"] = self.take(f"{src}vars/0"), self.take(f"{src}vars/1")

    def attention(self, src, out, dst, fields):
        """keras-hub's `query_dense`, `key_dense`, `value_dense` and `output_dense` at `src` as
        keras_vit's fused attention at `dst`: `qkv` kernel and bias, or `qv_bias` without a key bias."""
        width = fields["hidden_size"]
        q, k, v = (f"{src}{name}_dense/vars/" for name in ("query", "key", "value"))
        out[f"{dst}qkv/kernel"] = np.concatenate([self.take(p + "0").reshape(width, -1) for p in (q, k, v)], 1)
        if fields.get("qkv_bias", True):
            with_key = fields.get("key_bias", True)
            biases = [self.take(p + "1").reshape(-1) for p in ((q, k, v) if with_key else (q, v))]
            out[f"{dst}{'qkv/bias' if with_key else 'qv_bias'}"] = np.concatenate(biases)
        out[f"{dst}out/kernel"] = self.take(f"{src}output_dense/vars/0").reshape(-1, width)
        out[f"{dst}out/bias"] = self.take(f"{src}output_dense/vars/1", np.zeros(width, "float32"))

    def blocks(self, stem):
        """`(keras-hub path, keras_vit path)` of each encoder block: `stem`, `stem_1`, ... (Keras's
        unique names) become `block_0`, `block_1`, ..."""
        pattern = re.compile(re.escape(stem) + r"(?:_(\d+))?/")
        indices = sorted({int(m.group(1) or 0) for name in self.source if (m := pattern.match(name))})
        return [(f"{stem}{f'_{i}' if i else ''}/", f"block_{i}/") for i in indices]

    def left(self, out):
        return {**out, **self.source}


def _common(config, mlp_dim):
    """The fields every keras-hub backbone's config gives alike."""
    height, width, channels = config["image_shape"]
    return dict(
        image_size=(height, width),
        patch_size=_pair(config["patch_size"]),
        hidden_size=config["hidden_dim"],
        num_layers=config["num_layers"],
        num_heads=config["num_heads"],
        mlp_dim=mlp_dim,
        channels=channels,
        num_classes=0,
    )


def _input_statistics(converter, channels):
    """`input_mean` and `input_std` of an image converter's `scale` and `offset` (and the
    `mean` and `variance` of early Kaggle presets)."""
    scale, offset = converter.get("scale"), converter.get("offset")
    scale = np.broadcast_to(np.asarray(1.0 if scale is None else scale, "float64"), (channels,))
    offset = np.broadcast_to(np.asarray(0.0 if offset is None else offset, "float64"), (channels,))
    if "mean" in converter and "variance" in converter:  # the converters of early Kaggle presets
        std = np.sqrt(np.asarray(converter["variance"], "float64"))
        scale, offset = scale / std, -np.asarray(converter["mean"], "float64") / std
    return dict(input_mean=tuple(float(m) for m in -offset / scale), input_std=tuple(float(s) for s in 1 / scale))


def _vit_fields(backbone, task, tensors, path):
    use_class_token = backbone.get("use_class_token", True)
    pooling = (task or {}).get("pooling", "token" if use_class_token else "gap")
    if (pooling == "token") != use_class_token:
        raise CheckpointError(
            f"{path}: keras-hub pooling {pooling!r} with use_class_token={use_class_token}; keras_vit reads the "
            "class token ('token' with a class token) or the mean of the patch tokens ('gap' without one)."
        )
    return dict(
        _common(backbone, backbone["mlp_dim"]),
        layer_norm_epsilon=backbone.get("layer_norm_epsilon", 1e-6),
        qkv_bias=backbone.get("use_mha_bias", True),
        classifier=pooling,
        num_classes=task["num_classes"] if task else 0,
        representation_size=(task or {}).get("intermediate_dim") or None,  # 0: none
    )


def _vit_to_keras(t, fields, config):
    out = {}
    t.dense(_EMBEDDING + "patch_embedding/", out, "patch_embedding/projection")
    out["position_embedding/embedding"] = t.take(_EMBEDDING + "position_embedding/vars/0")[None]
    if fields["classifier"] == "token":
        out["class_token/token"] = t.take(_EMBEDDING + "vars/0")
    for src, dst in t.blocks("vi_t_encoder/encoder_layers/vi_t_encoder_block"):
        t.norm(f"{src}layer_norm_1/", out, f"{dst}norm1")
        t.norm(f"{src}layer_norm_2/", out, f"{dst}norm2")
        t.attention(f"{src}mha/", out, f"{dst}attention/", fields)
        t.dense(f"{src}mlp/dense_1/", out, f"{dst}mlp/fc1")
        t.dense(f"{src}mlp/dense_2/", out, f"{dst}mlp/fc2")
    t.norm("vi_t_encoder/layer_norm/", out, "encoder_norm")
    # The classifier's Dense layers, in order: the pre-logits (intermediate_dim) first, if any.
    heads = sorted((name for name in t.source if re.fullmatch(r"dense(_\d+)?/vars/0", name)), key=_dense_order)
    named = ["pre_logits", "head"] if fields["representation_size"] else ["head"]
    if fields["num_classes"] and len(heads) == len(named):
        for kernel, ours in zip(heads, named):
            t.dense(kernel[: -len("vars/0")], out, ours)
    out[GRID_PATH] = np.asarray(_grid(fields["image_size"], fields["patch_size"]), "int32")
    return t.left(out)


def _dinov2_fields(config, task, tensors, path):
    swiglu = bool(config.get("use_swiglu_ffn", False))
    fc2 = f"dinov2_encoder/layers/dinov2_layer/mlp/{'weights_out' if swiglu else 'fc2'}/vars/0"
    if fc2 not in tensors:
        raise CheckpointError(f"{path}: keras-hub checkpoint: tensor {fc2} is missing.")
    fields = dict(
        _common(config, tensors[fc2].shape[0]),  # a SwiGLU's width is keras-hub's rounding of 2/3 of intermediate_dim
        layer_norm_epsilon=1e-6,  # keras-hub's DINOv2 fixes it
        layer_scale_init=config.get("layer_scale_init_value", 1.0),
        num_register_tokens=config.get("num_register_tokens", 0),
        mlp_type="swiglu" if swiglu else "gelu",
        classifier="token",
        # keras-hub resamples the stored position embedding to the image's grid with its backend's
        # bicubic resize: antialiased, PIL's kernel on every backend; without antialiasing torch's
        # a = -0.75 kernel under PyTorch, a = -0.5 ones under TensorFlow and JAX.
        posemb_interpolation="bicubic_antialias" if config.get("antialias_in_interpolation") else "bicubic",
    )
    stored, image = _stored_grid(config, fields["patch_size"]), _grid(fields["image_size"], fields["patch_size"])
    if stored != image and fields["posemb_interpolation"] == "bicubic":
        logger.warning(
            "keras_vit: %s: keras-hub resamples this DINOv2 model's %dx%d position embedding to its %dx%d image grid "
            "with its backend's bicubic resize (a = -0.75 under PyTorch, a = -0.5 under TensorFlow and JAX); keras_vit "
            "resamples as PyTorch and Transformers do, so its outputs match keras-hub's under PyTorch only",
            path,
            *stored,
            *image,
        )
    return fields


def _dinov2_to_keras(t, fields, config):
    out = {}
    stem = "dinov2_embedding/"
    t.dense(f"{stem}patch_embeddings/projection/", out, "patch_embedding/projection")
    # After the tokens: the position embedding resampled to the image's grid (trainable, which
    # keras-hub recomputes on load), then the stored one (not trainable).
    _embedding_variables(t, out, stem, config, fields, (None, "position_embedding/embedding"))
    for src, dst in t.blocks("dinov2_encoder/layers/dinov2_layer"):
        _dino_block(t, out, src, dst)
        t.attention(f"{src}attention/attention/", out, f"{dst}attention/", fields)
        swiglu = fields["mlp_type"] == "swiglu"
        t.dense(f"{src}mlp/{'weights_in' if swiglu else 'fc1'}/", out, f"{dst}mlp/fc1")  # SwiGLU: [gate | value]
        t.dense(f"{src}mlp/{'weights_out' if swiglu else 'fc2'}/", out, f"{dst}mlp/fc2")
    t.norm("layer_normalization/", out, "encoder_norm")
    out[GRID_PATH] = np.asarray(_stored_grid(config, fields["patch_size"]), "int32")
    return t.left(out)


def _stored_grid(config, patch_size):
    """The patch grid a DINOv2 model stores its position embedding at (keras-hub's default 518 pixels)."""
    return _grid(config.get("position_embedding_shape", (518, 518))[:2], patch_size)


def _embedding_variables(t, out, stem, config, fields, after=()):
    """A DINOv2 or DINOv3 embedding layer's own variables, in the order Keras saves them: the class
    token, the mask token (masked-image training, no part of the model), the register tokens, then
    `after`'s names (None: not kept)."""
    names = ["class_token/token"] + [None] * bool(config.get("use_mask_token", True))
    names += ["register_tokens/tokens"] * bool(fields["num_register_tokens"])
    for i, name in enumerate(names + list(after)):
        value = t.take(f"{stem}vars/{i}")
        if name:
            out[name] = value


def _dino_block(t, out, src, dst):
    """A DINOv2 or DINOv3 block's LayerNorms and LayerScales."""
    for n in ("1", "2"):
        t.norm(f"{src}norm{n}/", out, f"{dst}norm{n}")
        out[f"{dst}scale{n}/gamma"] = t.take(f"{src}layer_scale{n}/vars/0")


def _dinov3_fields(config, task, tensors, path):
    query, key, value = (config.get(f"use_{name}_bias", True) for name in ("query", "key", "value"))
    if query != value or (key and not query):
        raise CheckpointError(
            f"{path}: keras-hub DINOv3 with use_query_bias={query}, use_key_bias={key}, use_value_bias={value}; "
            "keras_vit has query and value biases together, and a key bias only beside them."
        )
    gated, activation = bool(config.get("use_gated_mlp", False)), config.get("hidden_activation", "gelu")
    if activation != ("silu" if gated else "gelu"):
        raise CheckpointError(
            f"{path}: keras-hub DINOv3 with hidden_activation {activation!r} and use_gated_mlp={gated}; keras_vit's "
            "MLPs are GELU ('gelu') and gated SwiGLU ('silu')."
        )
    return dict(
        _common(config, config["intermediate_dim"]),
        layer_norm_epsilon=config.get("layer_norm_eps", 1e-5),
        layer_scale_init=config.get("layer_scale_init_value", 1.0),
        num_register_tokens=config.get("num_register_tokens", 0),
        mlp_type="swiglu" if gated else "gelu",
        qkv_bias=query,
        key_bias=key,
        position_embedding=False,
        rope="dinov3",
        rope_theta=float(config.get("rope_theta") or 100.0),
        classifier="token",
    )


def _dinov3_to_keras(t, fields, config):
    out = {}
    stem = "dinov3_embedding/"
    t.dense(f"{stem}patch_embeddings/projection/", out, "patch_embedding/projection")
    _embedding_variables(t, out, stem, config, fields)
    for src, dst in t.blocks("dinov3_encoder/layers/dinov3_layer"):
        _dino_block(t, out, src, dst)
        t.attention(f"{src}attention/", out, f"{dst}attention/", fields)
        if fields["mlp_type"] == "swiglu":  # gate_proj and up_proj: keras_vit's fc1 [gate | value]
            gated = {}
            for name in ("gate", "up"):
                t.dense(f"{src}mlp/{name}_proj/", gated, name)
            for kind, axis in (("kernel", 1), ("bias", 0)):
                out[f"{dst}mlp/fc1/{kind}"] = np.concatenate([gated[f"gate/{kind}"], gated[f"up/{kind}"]], axis)
        else:
            t.dense(f"{src}mlp/up_proj/", out, f"{dst}mlp/fc1")
        t.dense(f"{src}mlp/down_proj/", out, f"{dst}mlp/fc2")
    t.norm("layer_normalization/", out, "encoder_norm")
    return t.left(out)


_SIGLIP_ACTIVATIONS = {"gelu_approximate": True, "gelu": False}  # -> gelu_approximate


def _siglip_fields(config, task, tensors, path):
    activation, epsilon = config.get("intermediate_activation", "gelu_approximate"), config.get("layer_norm_epsilon")
    if activation not in _SIGLIP_ACTIVATIONS:
        raise CheckpointError(
            f"{path}: keras-hub SigLIP with intermediate_activation {activation!r}; keras_vit's MLP is GELU "
            f"({', '.join(map(repr, _SIGLIP_ACTIVATIONS))})."
        )
    if epsilon not in (None, 1e-6):
        raise CheckpointError(
            f"{path}: keras-hub SigLIP with layer_norm_epsilon {epsilon} beside its final LayerNorm's fixed 1e-6; "
            "keras_vit's LayerNorms share one epsilon."
        )
    return dict(
        _common(config, config["intermediate_dim"]),
        layer_norm_epsilon=1e-6,
        gelu_approximate=_SIGLIP_ACTIVATIONS[activation],
        classifier="map",
    )


def _siglip_to_keras(t, fields, config):
    out = {}
    width, stem = fields["hidden_size"], "sig_lip_vision_embedding/"
    t.dense(f"{stem}patch_embedding/", out, "patch_embedding/projection")
    out["position_embedding/embedding"] = t.take(f"{stem}position_embedding/vars/0")[None]
    t.take(f"{stem}vars/0")  # position_ids: 0, 1, ... (integers, no weight)
    for src, dst in t.blocks("sig_lip_encoder_layer"):
        t.norm(f"{src}layer_norm1/", out, f"{dst}norm1")
        t.norm(f"{src}layer_norm2/", out, f"{dst}norm2")
        t.attention(f"{src}self_attn/", out, f"{dst}attention/", fields)
        t.dense(f"{src}mlp/fc1/", out, f"{dst}mlp/fc1")
        t.dense(f"{src}mlp/fc2/", out, f"{dst}mlp/fc2")
    t.norm("layer_normalization/", out, "encoder_norm")
    src, dst = "sig_lip_multi_head_attention_pooling/", "attention_pool/"
    out[f"{dst}probe"] = t.take(f"{src}vars/0")
    t.dense(f"{src}attention/query_dense/", out, f"{dst}query", width)
    t.dense(f"{src}attention/output_dense/", out, f"{dst}out", width)
    key_value = {}
    for name in ("key", "value"):
        t.dense(f"{src}attention/{name}_dense/", key_value, name, width)
    for kind, axis in (("kernel", 1), ("bias", 0)):
        out[f"{dst}key_value/{kind}"] = np.concatenate([key_value[f"key/{kind}"], key_value[f"value/{kind}"]], axis)
    t.norm(f"{src}layer_norm/", out, f"{dst}norm")
    t.dense(f"{src}mlp/fc1/", out, f"{dst}mlp/fc1")
    t.dense(f"{src}mlp/fc2/", out, f"{dst}mlp/fc2")
    out[GRID_PATH] = np.asarray(_grid(fields["image_size"], fields["patch_size"]), "int32")
    return t.left(out)


# The registered name of a backbone -> (its ViTConfig fields, its weights as keras_vit's).
_FAMILIES = {
    BACKBONE: (_vit_fields, _vit_to_keras),
    DINOV2: (_dinov2_fields, _dinov2_to_keras),
    DINOV3: (_dinov3_fields, _dinov3_to_keras),
    SIGLIP_VISION: (_siglip_fields, _siglip_to_keras),
}


def _backbone_tensors(tensors, inside=""):
    """The backbone's weights by their path inside it: `layers/vi_t_backbone/layers/X` (a ViT
    classifier's `.keras` file) and `layers/X` (a backbone's) both become `X`, a classifier's own
    layers (`layers/dense/vars/0`) `dense/vars/0`; with `inside` (a SigLIPBackbone's
    `sig_lip_vision_encoder/layers/`) only that model's. An optimizer's state is left out."""
    out = {}
    for name, value in tensors.items():
        name = name.removeprefix("layers/")
        if name.startswith("optimizer/") or not name.startswith(inside):
            continue
        out[name.removeprefix(inside).removeprefix("vi_t_backbone/layers/")] = value
    return out


def _grid(image_size, patch_size):
    rows, cols = _pair(image_size)
    return rows // patch_size[0], cols // patch_size[1]


def _dense_order(name):
    match = re.match(r"dense_(\d+)/", name)
    return int(match.group(1)) if match else 0


def _pair(size):
    return tuple(size) if isinstance(size, (list, tuple)) else (size, size)


def _read_h5(source, where):
    import h5py

    tensors = {}

    def keep(name, item):
        if isinstance(item, h5py.Dataset):
            if item.attrs.get("dtype") == "bfloat16":  # how Keras marks a bfloat16 variable
                import ml_dtypes

                tensors[name] = np.array(item, dtype=ml_dtypes.bfloat16).astype("float32")
            else:
                value = np.asarray(item[()])
                tensors[name] = value.astype("float32") if value.dtype.kind == "f" else value

    try:
        with h5py.File(source, "r") as file:
            file.visititems(keep)
    except OSError as error:
        raise CheckpointError(f"{where}: not a readable Keras weights file ({error}).") from None
    return tensors


def _find_converter(config):
    """The ViTImageConverter config nested in a classifier's config, if any."""
    if isinstance(config, dict):
        if _registered(config) == CONVERTER:
            return config
        values = config.values()
    elif isinstance(config, list):
        values = config
    else:
        return None
    return next((found for value in values if (found := _find_converter(value))), None)


def _registered(config):
    return config.get("registered_name") if isinstance(config, dict) else None
