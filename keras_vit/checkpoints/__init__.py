"""Pretrained checkpoints: official/big_vision .npz, timm and Hugging Face weights, keras-hub ViT,
DINOv2, DINOv3 and SigLIP presets, and keras_vit's own `.keras` models and training runs (to
fine-tune a model trained here).

keras_vit.load_weights(model, "ViT-B_16.npz")       # file, HF folder, known name, .keras or run dir
keras_vit.save_npz(model, "finetuned.npz")          # the official layout, readable by timm
keras_vit.ViT.from_checkpoint("model.safetensors")  # config read off the checkpoint
"""

import difflib
import logging
import typing
from pathlib import Path

import numpy as np

from keras_vit import saving
from keras_vit.checkpoints import hub, huggingface, keras_hub, keras_weights, official, timm
from keras_vit.checkpoints.assign import assign, export
from keras_vit.checkpoints.files import CheckpointError, read_tensors, write_npz
from keras_vit.checkpoints.known import KNOWN_CHECKPOINTS, fetch
from keras_vit.config import OFFICIAL_MEAN, OFFICIAL_STD, ViTConfig, check_fields, normalization_name
from keras_vit.names import RUN_CHECKPOINTS
from keras_vit.presets import PRESETS

logger = logging.getLogger("keras_vit")

__all__ = [
    "CheckpointError",
    "KNOWN_CHECKPOINTS",
    "architecture",
    "config_fields",
    "list_checkpoints",
    "load_weights",
    "open_checkpoint",
    "read_checkpoint",
    "save_npz",
]


def list_checkpoints():
    """Names of the published checkpoints that `weights=` accepts."""
    return list(KNOWN_CHECKPOINTS)


def resolve(source):
    """A known checkpoint name, Kaggle handle or `hf://` name (downloaded once) or a local path
    -> local path."""
    if isinstance(source, str) and source in KNOWN_CHECKPOINTS:
        return fetch(source)
    if isinstance(source, str) and source.startswith(keras_hub.KAGGLE_PREFIX):
        return keras_hub.download(source)
    if isinstance(source, str) and source.startswith(hub.PREFIX):
        return hub.download(source)
    path = Path(source)
    if not path.exists():
        if str(source) in PRESETS:  # an architecture: its published weights have longer names
            named = [n for n in KNOWN_CHECKPOINTS if n.startswith(f"{source}.")]
            weights = f"; its weights: {', '.join(named)}" if named else ""
            raise CheckpointError(f"{source} is a preset (an architecture without weights){weights}.")
        close = difflib.get_close_matches(str(source), KNOWN_CHECKPOINTS, n=3)
        hint = f" Close known names: {', '.join(close)}." if close else ""
        raise CheckpointError(f"checkpoint not found: {source} (neither a file nor a known name).{hint}")
    return path


# Config fields that change what a model computes without changing a weight's shape: loading a
# checkpoint into a model that differs in one it records is warned about.
NUMERICS = ("normalize_inputs", "input_mean", "input_std", "layer_norm_epsilon", "gelu_approximate")
# Config fields of the image transform a checkpoint ships with (its input statistics, crop and
# interpolation): a model built for it takes them.
TRANSFORM = ("normalize_inputs", "input_mean", "input_std", "crop_fraction", "interpolation")


class Checkpoint(typing.NamedTuple):
    """A checkpoint as read: weights keyed by keras_vit variable path, the ViTConfig fields it
    implies (None unless asked for), its kind, its class names (None when it has none), and the
    `NUMERICS` fields it records (a keras_vit record, a `.keras` model, a Hugging Face or
    keras-hub config; {} for files that record none), and the `TRANSFORM` fields it ships with
    (None when it records no input statistics: a bare timm file, a Hugging Face folder without
    its image processor, a keras-hub model without its image converter)."""

    weights: dict
    fields: dict | None
    kind: str
    class_names: tuple | None
    numerics: dict = {}
    transform: dict | None = None


def read_checkpoint(source, infer_config=True):
    """Reads any supported checkpoint -> `(weights, fields, kind)`: weights keyed by keras_vit
    variable path, the ViTConfig fields it implies (None unless `infer_config`), and
    "official", "timm", "huggingface", "keras-hub" (a keras-hub preset folder or `.keras`
    file) or "keras" (a `.keras` model or a training run directory, whose `best.keras`, else
    `last.keras`, is read)."""
    return tuple(open_checkpoint(source, infer_config))[:3]


def open_checkpoint(source, infer_config=True):
    """`read_checkpoint` as a `Checkpoint`, with the class names the checkpoint carries: a
    Hugging Face `config.json`'s `id2label` (unless Transformers' default `LABEL_n`), a keras_vit
    model's own, or a run directory's labels."""
    path = resolve(source)
    if keras_weights.is_keras_weights(path):
        raise CheckpointError(
            f"{path} is a Keras weights file (model.save_weights): it holds no architecture. Build the model "
            "(keras_vit.ViT.from_preset or keras_vit.ViT(config)) and load it with keras_vit.load_weights(model, path)."
        )
    if keras_hub.is_keras_hub(path):
        weights, fields = keras_hub.read(path)
        return Checkpoint(
            weights, fields if infer_config else None, "keras-hub", None, _numerics(fields), _transform(fields)
        )
    if path.suffix == ".keras" or (path.is_dir() and any((path / name).is_file() for name in RUN_CHECKPOINTS)):
        model = saving.load_model(path)
        quantized = sorted({layer.quantization_mode for layer in model._flatten_layers() if layer.quantization_mode})
        if quantized:  # its variables are integer kernels and scales, not weights to place
            raise CheckpointError(
                f"{path} holds a quantized model ({', '.join(quantized)}): load it whole with "
                "keras.saving.load_model; converting it or taking its weights needs the float model it was "
                "quantized from."
            )
        weights = {**export(model), official.GRID_PATH: np.asarray(model.config.grid_size, "int32")}
        names = saving.label_names(path, model)
        names = None if names == saving.index_names(model.config.num_classes) else tuple(names)
        fields = model.config.to_dict()
        return Checkpoint(
            weights, fields if infer_config else None, "keras", names, _numerics(fields), _transform(fields)
        )
    tensors, hf_config = read_tensors(path)
    recorded, names = official.pop_record(tensors)
    shipped = {}  # what the files beside the weights say: a timm folder's pretrained_cfg
    if official.is_official(tensors):
        tensors = official.normalise(tensors)
        kind, reader, args = "official", official.config_fields, (tensors,)
        weights = official.to_keras(tensors)
        # The official and big_vision releases feed x / 127.5 - 1 (the default, unless recorded).
        transform = {"input_mean": OFFICIAL_MEAN, "input_std": OFFICIAL_STD, **_transform(recorded, {})}
    elif timm.is_timm(tensors):
        kind, reader, args = "timm", timm.config_fields, (tensors,)
        weights = timm.to_keras(tensors)
        shipped = timm.pretrained_fields(hf_config, tensors)
        transform = _transform({**shipped, **recorded})
    elif huggingface.is_huggingface(tensors):
        processor = huggingface.read_processor(path)
        kind, reader, args = "huggingface", huggingface.config_fields, (hf_config, tensors, processor)
        weights = huggingface.to_keras(tensors)
        names = huggingface.class_names(hf_config)
        transform = _transform(
            {**huggingface.input_statistics(processor), **huggingface.input_transform(processor), **recorded}
        )
    else:
        sample = ", ".join(sorted(tensors)[:5]) or "no tensors"
        raise CheckpointError(
            f"{path}: not a ViT checkpoint keras_vit knows (official, big_vision, timm or "
            f"Hugging Face); its first tensors: {sample}."
        )
    # Loading into an existing model needs no architecture (a timm file does not even say its
    # head count), so the config is read off the tensors only when asked for; a keras_vit .npz
    # file's record adds what they do not tell.
    fields = {**_fields(reader, path, *args), **shipped, **recorded} if infer_config else None
    numerics = {**shipped, **recorded}
    if kind == "huggingface" and fields is None:  # a JSON file or two: read whether asked for or not
        try:
            numerics = _fields(reader, path, *args)
        except CheckpointError:  # no config.json: nothing recorded to compare
            numerics = {}
    elif kind == "huggingface":
        numerics = fields
    return Checkpoint(weights, fields, kind, names, _numerics(numerics), transform)


def _numerics(fields):
    return {name: fields[name] for name in NUMERICS if name in fields}


def _transform(fields, none=None):
    """The `TRANSFORM` fields of `fields`; `none` when they hold no input statistics."""
    if "input_mean" not in fields:
        return none
    return {name: fields[name] for name in TRANSFORM if name in fields}


def warn_assumed_normalization(checkpoint, source, config, overrides=()):
    """Logs one warning when `checkpoint` records no input statistics and `overrides` (the
    caller's config fields) set none: the model `config` describes then assumes its own, which
    the warning names with the option that sets them. Returns whether it warned."""
    if checkpoint.transform is not None or "input_mean" in overrides:
        return False
    name = normalization_name(config.input_mean, config.input_std)
    logger.warning(
        "keras_vit: %s records no input normalisation: assumed %s (mean %s, std %s in pixels); a model trained with "
        "others (DeiT, DINOv2: imagenet; EVA-02: clip) needs them named: normalization='imagenet'|'inception'|'clip'|"
        "'MEAN,STD' (--normalization)",
        source,
        repr(name) if name else "the model's",
        ", ".join(f"{v:g}" for v in config.input_mean),
        ", ".join(f"{v:g}" for v in config.input_std),
    )
    return True


def warn_numerics(model, checkpoint, source):
    """Logs one line when `model`'s config differs from the checkpoint's in a `NUMERICS` field it
    records: the weights load, but the model computes otherwise than the one they came from."""
    try:
        recorded = model.config.replace(**checkpoint.numerics)  # normalised as the model's own fields
    except ValueError:  # statistics for another channel count: the weights' check says more
        return []
    differ = [name for name in checkpoint.numerics if getattr(recorded, name) != getattr(model.config, name)]
    if differ:
        logger.warning(
            "keras_vit: %s was saved from a model with %s; this model has %s: its outputs differ from that model's "
            "(ViT.from_checkpoint builds the model the checkpoint describes)",
            source,
            ", ".join(f"{name}={getattr(recorded, name)}" for name in differ),
            ", ".join(f"{name}={getattr(model.config, name)}" for name in differ),
        )
    return differ


def adopt_class_names(model, checkpoint):
    """Gives `model` the checkpoint's class names when it has none of its own and kept the
    checkpoint's head (a new head's classes are not the checkpoint's)."""
    names, head = checkpoint.class_names, checkpoint.weights.get("head/kernel")
    if model.class_names is None and names is not None and head is not None and model.config.num_classes:
        if tuple(head.shape) == tuple(model.get_layer("head").kernel.shape) and len(names) == model.config.num_classes:
            model.class_names = names


def open_weights(source):
    """`open_checkpoint(source, infer_config=False)`, or None for a Keras weights file (which
    `load_weights` reads into the model it is given)."""
    return None if keras_weights.is_keras_weights(source) else open_checkpoint(source, infer_config=False)


def config_fields(source):
    """The ViTConfig fields a checkpoint implies (sizes, depth, heads, head, ...); `num_heads`
    is None where the checkpoint does not say (a timm file of a width no paper variant has), and
    `image_size` where its position embedding's tokens make no square grid and it stores none."""
    return read_checkpoint(source)[1]


def architecture(fields, overrides, source):
    """A checkpoint's config `fields` with `overrides` (ViTConfig fields) over them; a
    CheckpointError when the head count is known from neither."""
    check_fields(ViTConfig, overrides, "ViTConfig field")
    merged = {**fields, **overrides}
    if merged.get("image_size") is None:
        raise CheckpointError(
            f"{source}: cannot infer the image size from its position embedding (its tokens make no square grid): "
            "pass image_size (image_size=(rows, columns), --image-size)."
        )
    if merged.get("num_heads") is None:
        raise CheckpointError(
            f"{source} does not store the head count (timm files do not) and its width {merged['hidden_size']} is "
            "no paper variant's: pass num_heads (num_heads=..., --num-heads) or a preset."
        )
    return merged


def load_weights(model, source):
    """Loads a checkpoint (file, Hugging Face folder or known name, or a Keras `.weights.h5`
    file of a keras_vit model) into a keras_vit model.

    Raises `CheckpointError` (a ValueError) naming the tensor or file on any mismatch; see
    `keras_vit.checkpoints.assign.assign` for the head, pre-logits and resolution policy.
    Returns the list of adaptations made (also logged)."""
    if keras_weights.is_keras_weights(source):
        path = resolve(source)
        return assign(model, keras_weights.read(path, model.config), f"{path.name} (Keras weights)")
    return place(model, open_checkpoint(source, infer_config=False), source)


def place(model, checkpoint, source):
    """`load_weights` of a checkpoint already opened (`open_checkpoint`) from `source`."""
    label = str(source) if str(source).startswith(hub.PREFIX) else Path(str(source)).name  # a name, or a file's
    notes = assign(model, checkpoint.weights, f"{label} ({checkpoint.kind})", checkpoint.class_names)
    warn_numerics(model, checkpoint, label)
    adopt_class_names(model, checkpoint)
    return notes


def save_npz(model, path):
    """Writes the model's weights as an official-layout .npz (original release names), with the
    patch grid of the position embedding (`official.GRID_KEY`) and the model's config and class
    names (`official.RECORD_KEY`) beside them, so `from_checkpoint` rebuilds the same model.
    `path` must end in `.npz`, the suffix that tells readers (this one too) the format."""
    if Path(path).suffix.lower() != ".npz":
        raise CheckpointError(f"save_npz writes an .npz file: name it so (got {Path(path).name}).")
    weights = {**export(model), official.GRID_PATH: np.asarray(model.config.grid_size, "int32")}
    tensors = official.from_keras(weights, model.config.num_heads)
    write_npz(path, {**tensors, official.RECORD_KEY: official.record(model.config.to_dict(), model.class_names)})


def _fields(reader, path, *args):
    try:
        return reader(*args)
    except KeyError as error:
        raise CheckpointError(f"{path}: incomplete checkpoint, tensor {error} is missing.") from None
