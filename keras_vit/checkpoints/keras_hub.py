"""keras-hub's ViT: a `ViTBackbone` or `ViTImageClassifier` preset folder (what `save_to_preset`
writes and Kaggle serves) or `.keras` file, read with h5py (keras-hub is not needed).

Keras stores a model's weights in HDF5 under the snake-cased class names of its layers
(`vi_t_encoder_block`, `vi_t_encoder_block_1`, ..., `dense`), each layer's variables as
`vars/0`, `vars/1` in creation order. keras-hub's attention is `keras.layers.MultiHeadAttention`:
separate `(D, heads, head_dim)` query, key and value kernels, fused here into keras_vit's
`(D, 3D)` one. Its image converter computes `pixels * scale + offset`: keras_vit's
`input_mean = -offset / scale`, `input_std = 1 / scale`.
"""

import io
import json
import re
import zipfile
from pathlib import Path

import numpy as np

from keras_vit.checkpoints.files import CheckpointError
from keras_vit.checkpoints.official import GRID_PATH

BACKBONE = "keras_hub>ViTBackbone"
CLASSIFIER = "keras_hub>ViTImageClassifier"
CONVERTER = "keras_hub>ViTImageConverter"
KAGGLE_PREFIX = "kaggle://"
PRESET_FILES = ("config.json", "model.weights.h5")  # a backbone preset; a classifier adds:
TASK_FILES = ("task.json", "task.weights.h5")
_EMBEDDING = "vi_t_patching_and_embedding/"
_BLOCK = re.compile(r"vi_t_encoder/encoder_layers/vi_t_encoder_block(?:_(\d+))?/")


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

    `path`: a preset folder (`config.json` of a ViTBackbone, its `model.weights.h5`, and for a
    classifier `task.json` and `task.weights.h5`), or a ViTBackbone's or ViTImageClassifier's
    `.keras` file (or the folder it unzips to)."""
    files = _Files(path)
    missing = [name for name in PRESET_FILES if not files.has(name)]
    if missing:
        raise CheckpointError(f"{path}: a keras-hub model without {', '.join(missing)}.")
    top = files.json("config.json")
    backbone, task = (top["config"]["backbone"], top) if _registered(top) == CLASSIFIER else (top, None)
    if _registered(backbone) != BACKBONE:
        raise CheckpointError(f"{path}: keras-hub model {_registered(top)}; keras_vit reads keras-hub's ViT.")
    tensors = _read_h5(files.h5("model.weights.h5"), f"{path}: model.weights.h5")
    if task is None and all(files.has(name) for name in TASK_FILES):  # a classifier's preset
        task = files.json("task.json")
        tensors.update(_read_h5(files.h5("task.weights.h5"), f"{path}: task.weights.h5"))
    converter = files.json("image_converter.json") if files.has("image_converter.json") else _find_converter(task)
    fields = _fields(backbone["config"], task and task["config"], converter and converter["config"], path)
    return _to_keras(tensors, fields), fields


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


def _fields(backbone, task, converter, path):
    use_class_token = backbone.get("use_class_token", True)
    pooling = (task or {}).get("pooling", "token" if use_class_token else "gap")
    if (pooling == "token") != use_class_token:
        raise CheckpointError(
            f"{path}: keras-hub pooling {pooling!r} with use_class_token={use_class_token}; keras_vit reads the "
            "class token ('token' with a class token) or the mean of the patch tokens ('gap' without one)."
        )
    height, width, channels = backbone["image_shape"]
    fields = dict(
        image_size=(height, width),
        patch_size=_pair(backbone["patch_size"]),
        hidden_size=backbone["hidden_dim"],
        num_layers=backbone["num_layers"],
        num_heads=backbone["num_heads"],
        mlp_dim=backbone["mlp_dim"],
        channels=channels,
        layer_norm_epsilon=backbone.get("layer_norm_epsilon", 1e-6),
        qkv_bias=backbone.get("use_mha_bias", True),
        classifier=pooling,
        num_classes=task["num_classes"] if task else 0,
        representation_size=(task or {}).get("intermediate_dim") or None,  # 0: none
    )
    if converter:
        scale, offset = converter.get("scale"), converter.get("offset")
        scale = np.broadcast_to(np.asarray(1.0 if scale is None else scale, "float64"), (channels,))
        offset = np.broadcast_to(np.asarray(0.0 if offset is None else offset, "float64"), (channels,))
        if "mean" in converter and "variance" in converter:  # the converters of early Kaggle presets
            std = np.sqrt(np.asarray(converter["variance"], "float64"))
            scale, offset = scale / std, -np.asarray(converter["mean"], "float64") / std
        fields.update(input_mean=tuple(float(m) for m in -offset / scale), input_std=tuple(float(s) for s in 1 / scale))
    return fields


def _to_keras(tensors, fields):
    """keras-hub weight paths -> keras_vit variable paths; a tensor left over keeps its name, for
    the assignment to report."""
    width = fields["hidden_size"]
    source = {_backbone_path(name): value for name, value in tensors.items() if not name.startswith("optimizer/")}
    out = {}

    def take(name, default=None):
        if name in source:
            return source.pop(name)
        if default is None:
            raise CheckpointError(f"keras-hub checkpoint: tensor {name} is missing.")
        return default

    zeros = np.zeros(width, "float32")
    out["patch_embedding/projection/kernel"] = take(_EMBEDDING + "patch_embedding/vars/0")
    out["patch_embedding/projection/bias"] = take(_EMBEDDING + "patch_embedding/vars/1", zeros)
    out["position_embedding/embedding"] = take(_EMBEDDING + "position_embedding/vars/0")[None]
    if fields["classifier"] == "token":
        out["class_token/token"] = take(_EMBEDDING + "vars/0")
    blocks = sorted({int(m.group(1) or 0) for name in source if (m := _BLOCK.match(name))})
    for i in blocks:
        src, dst = f"vi_t_encoder/encoder_layers/vi_t_encoder_block{f'_{i}' if i else ''}/", f"block_{i}/"
        for norm, ours in (("layer_norm_1", "norm1"), ("layer_norm_2", "norm2")):
            out[f"{dst}{ours}/gamma"] = take(f"{src}{norm}/vars/0")
            out[f"{dst}{ours}/beta"] = take(f"{src}{norm}/vars/1")
        projections = [f"{src}mha/{n}_dense/vars/" for n in ("query", "key", "value")]
        out[f"{dst}attention/qkv/kernel"] = np.concatenate([take(p + "0").reshape(width, -1) for p in projections], 1)
        if fields["qkv_bias"]:
            out[f"{dst}attention/qkv/bias"] = np.concatenate([take(p + "1").reshape(-1) for p in projections])
        out[f"{dst}attention/out/kernel"] = take(f"{src}mha/output_dense/vars/0").reshape(-1, width)
        out[f"{dst}attention/out/bias"] = take(f"{src}mha/output_dense/vars/1", zeros)
        for dense, ours, size in (("dense_1", "fc1", fields["mlp_dim"]), ("dense_2", "fc2", width)):
            out[f"{dst}mlp/{ours}/kernel"] = take(f"{src}mlp/{dense}/vars/0")
            out[f"{dst}mlp/{ours}/bias"] = take(f"{src}mlp/{dense}/vars/1", np.zeros(size, "float32"))
    out["encoder_norm/gamma"] = take("vi_t_encoder/layer_norm/vars/0")
    out["encoder_norm/beta"] = take("vi_t_encoder/layer_norm/vars/1")
    # The classifier's Dense layers, in order: the pre-logits (intermediate_dim) first, if any.
    heads = sorted((name for name in source if re.fullmatch(r"dense(_\d+)?/vars/0", name)), key=_dense_order)
    named = ["pre_logits", "head"] if fields["representation_size"] else ["head"]
    if fields["num_classes"] and len(heads) == len(named):
        for kernel, ours in zip(heads, named):
            out[f"{ours}/kernel"] = source.pop(kernel)
            out[f"{ours}/bias"] = take(kernel[: -len("0")] + "1", np.zeros(out[f"{ours}/kernel"].shape[1], "float32"))
    grid = [f // p for f, p in zip(fields["image_size"], fields["patch_size"])]
    out[GRID_PATH] = np.asarray(grid, "int32")
    return {**out, **source}


def _backbone_path(name):
    """A weight's path inside the backbone: `layers/vi_t_backbone/layers/X` (a classifier's
    `.keras` file) and `layers/X` (a backbone's) both become `X`; a classifier's own layers
    (`layers/dense/vars/0`) become `dense/vars/0`."""
    return name.removeprefix("layers/").removeprefix("vi_t_backbone/layers/")


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
