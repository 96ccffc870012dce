"""Model files: `.keras` files that load wherever keras_vit is imported, and the sources every
command reads a model from (a `.keras` file, a training run directory, a checkpoint)."""

import os
import zipfile
from pathlib import Path

import keras

# A training run directory, written by keras_vit.training and read by every command.
from keras_vit.names import EXPORTED_FILES, RUN_CHECKPOINTS, RUN_LABELS


class ModelFileError(ValueError):
    """A model source that cannot be read; the message is one line that names the file."""


def inference_copy(model, into=None, dtype=None):
    """An uncompiled model with `model`'s config and weights (`into`: an earlier copy to update).
    `dtype`: another dtype policy for the copy (e.g. "mixed_bfloat16"), for models whose config
    carries it, as keras_vit's; the weights keep their values, stored as that policy stores them."""
    if into is None:
        config = model.get_config()
        if dtype is not None:
            config = {**config, "dtype": dtype}
        into = type(model).from_config(config)
    into.set_weights(model.get_weights())
    return into


def in_policy(model, policy):
    """`model` itself when it computes in the dtype policy named `policy` (e.g. "float32"),
    else an `inference_copy` of it in that policy."""
    return model if model.dtype_policy.name == policy else inference_copy(model, dtype=policy)


def save_model(model, path):
    """Writes `model` to the `.keras` file `path` without its optimizer and compile settings
    (they would need the training code's classes to load), through a temporary file renamed
    into place, so a kill never leaves a half-written file."""
    path = Path(path)
    if getattr(model, "compiled", False):
        model = inference_copy(model)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder; a .keras model is a file.")
    temporary = path.with_name(f".{path.name}.tmp.keras")
    try:
        model.save(temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)  # what a failed save or rename left


def is_run_dir(path):
    """Whether `path` is a training run directory (not a Hugging Face checkpoint folder)."""
    path = Path(path)
    return path.is_dir() and not (path / "config.json").is_file()


def holds_saved_model(path):
    """Whether `path` is a SavedModel directory, one `export --saved-model` wrote (its
    `NAME/VERSION/` SavedModels) or a model's folder in it (`NAME`, its `VERSION/` SavedModels)."""
    path = Path(path)
    return (path / "saved_model.pb").is_file() or any(path.glob("*/*/saved_model.pb")) or bool(versions(path))


def versions(path):
    """The `VERSION/` SavedModels of TF Serving's model folder `path`, oldest first."""
    found = [p.parent for p in Path(path).glob("*/saved_model.pb") if p.parent.name.isdigit()]
    return sorted(found, key=lambda p: int(p.name))


def run_checkpoint(run_dir):
    """The `.keras` file of a run directory: `best.keras`, else `last.keras`."""
    for name in RUN_CHECKPOINTS:
        if (Path(run_dir) / name).is_file():
            return Path(run_dir) / name
    if holds_saved_model(run_dir):
        raise ModelFileError(
            f"{run_dir} is an exported SavedModel; give the run directory or .keras file it was exported from."
        )
    if held := [runtime for suffix, runtime in EXPORTED_FILES.items() if any(Path(run_dir).glob(f"*{suffix}"))]:
        raise ModelFileError(
            f"{run_dir} holds exported {'/'.join(held)} files (`predict` and `evaluate --dataset` answer from one); "
            "give the run directory or .keras file they were exported from."
        )
    raise ModelFileError(f"{run_dir} has no {' or '.join(RUN_CHECKPOINTS)} (has training finished an epoch?).")


def load_keras_file(path):
    """A keras_vit `ViT` from a `.keras` file, in safe mode and without training state, so
    files that carry an optimizer (written by keras_vit 0.1 runs) load too."""
    from keras_vit.model import ViT

    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"model file not found: {path}")
    if not zipfile.is_zipfile(path):  # Keras would say "File not found" of a file cut short
        raise ModelFileError(f"{path} is not a whole .keras file (those are zip archives): truncated or corrupt")
    try:
        model = keras.saving.load_model(path, safe_mode=True, compile=False)
    except Exception as error:  # zip, h5 and config errors of many types
        reason = " ".join(str(error).split())[:300]
        raise ModelFileError(f"cannot load {path}: {type(error).__name__}: {reason}") from None
    if not isinstance(model, ViT):
        raise ModelFileError(f"{path} holds a {type(model).__name__}, not a keras_vit ViT.")
    return model


# Config fields in the words of `load_model`'s message, for its keyword arguments and the command
# line's flags alike (`num_classes=`, `--num-classes`).
_OVERRIDE_WORDS = {"image_size": "image size", "num_classes": "number of classes", "num_heads": "number of heads"}


def load_model(source, **overrides):
    """A keras_vit `ViT` from a `.keras` file, a run directory (its `best.keras`, else
    `last.keras`) or any checkpoint `ViT.from_checkpoint` reads (file, Hugging Face or keras-hub
    folder, keras-hub `.keras` file or known name; `overrides` are config fields for it, e.g.
    `num_classes`)."""
    from keras_vit.model import ViT

    path = Path(source)
    if is_run_dir(path):
        path = run_checkpoint(path)
    if path.suffix in EXPORTED_FILES:
        raise ModelFileError(
            f"{path} is an exported {EXPORTED_FILES[path.suffix]} file (`predict` and `evaluate --dataset` answer from "
            "it); give the run directory or .keras file it was exported from."
        )
    from keras_vit.checkpoints import keras_hub  # checkpoints imports this module

    if path.suffix == ".keras" and not keras_hub.is_keras_hub(path):
        if overrides:
            words = [_OVERRIDE_WORDS.get(name, name.replace("_", " ")) for name in overrides]
            fields = " and ".join(filter(None, [", ".join(words[:-1]), words[-1]]))
            raise ModelFileError(f"{path} is a complete model: its {fields} cannot be overridden.")
        return load_keras_file(path)
    return ViT.from_checkpoint(source, **overrides)


def label_names(source, model, labels=None):
    """Class names of `model` (read from `source`): from `labels` (a file of one name per line,
    or a list), else the run directory's `labels.txt`, else the model's own `class_names`, else
    the class indices as strings."""
    num_classes = model.config.num_classes
    if labels is not None:
        names = read_labels_file(labels) if isinstance(labels, (str, Path)) else list(labels)
    elif is_run_dir(source) and (Path(source) / RUN_LABELS).is_file():
        names = read_labels_file(Path(source) / RUN_LABELS)
    elif model.class_names is not None:
        names = list(model.class_names)
    else:
        names = index_names(num_classes)
    if len(names) != num_classes:
        raise ModelFileError(f"{len(names)} label names for a model of {num_classes} classes.")
    return names


def index_names(num_classes):
    """The names of unnamed classes: their indices as strings."""
    return [str(i) for i in range(num_classes)]


def read_labels_file(path):
    """The class names in the file `path`, one per line (blank lines at the end ignored); a
    blank line among them is refused (`check_label_names`)."""
    if not Path(path).is_file():
        raise ModelFileError(f"labels file not found: {path}")
    names = Path(path).read_text().splitlines()
    while names and not names[-1].strip():
        names.pop()
    check_label_names(names, f"{path}: line")
    return names


def check_label_names(names, what="class name"):
    """Raises ModelFileError for a blank class name, which labels nothing (in a labels file, the
    n-th line names class n). A name given twice is allowed: ImageNet-1k has two classes named
    "crane" and two "maillot"."""
    for number, name in enumerate(names, 1):
        if not str(name).strip():
            raise ModelFileError(f"{what} {number} is blank; give one class name per line, without blank lines.")
