"""Hugging Face Hub repositories by name, `hf://ORG/NAME[@REVISION]`: timm repositories
(`config.json` with `pretrained_cfg`, weights), Transformers ones (`config.json`,
`preprocessor_config.json`, weights), keras-hub presets and keras_vit models (a `.keras` file, or
a run directory's `best.keras` with its `labels.txt`), through huggingface_hub's cache.

The local cache comes first: a snapshot that holds the weights is used without asking the
network. `HF_HUB_OFFLINE`, `HF_HUB_CACHE` and `HF_HOME` are read when a name is resolved."""

import os
from pathlib import Path

from keras_vit.checkpoints.files import HF_WEIGHT_FILES, CheckpointError
from keras_vit.names import LABELS_FILE, RUN_CHECKPOINTS

PREFIX = "hf://"
# What a repository's snapshot needs: its JSON files (configs, image processor, keras-hub's task
# and converter) and one weights file, or its keras_vit models and labels; a repository holding
# only `pytorch_model.bin` gets that.
_FILES = ("*.json", HF_WEIGHT_FILES[0], "model.weights.h5", "task.weights.h5", "*.keras", LABELS_FILE)
_FALLBACK = (HF_WEIGHT_FILES[1],)
_WEIGHTS = (*HF_WEIGHT_FILES, "model.weights.h5", "*.keras")
_TRUE = ("1", "on", "yes", "true")


def parse(name):
    """`(repository, revision)` of `hf://ORG/NAME[@REVISION]` (revision None: the default branch)."""
    repository, at, revision = name.removeprefix(PREFIX).partition("@")
    parts = repository.split("/")
    if len(parts) != 2 or not all(parts) or (at and not revision):
        raise CheckpointError(f"{name}: a Hugging Face name is hf://ORG/NAME or hf://ORG/NAME@REVISION.")
    return repository, revision or None


def cache_folder():
    """huggingface_hub's cache, as it reads it: `HF_HUB_CACHE`, else `HF_HOME/hub`, else
    `XDG_CACHE_HOME/huggingface/hub` (default `~/.cache/huggingface/hub`)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(os.environ.get("HF_HOME") or Path(cache) / "huggingface").expanduser() / "hub"


def offline():
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def cached(name):
    """Whether `hf://` name `name` has a snapshot with weights in the local cache."""
    try:
        return _local(*parse(name)) is not None
    except (CheckpointError, ImportError):
        return False


def download(name):
    """The local checkpoint of `hf://` name `name` (its snapshot folder, or the folder's one
    `.keras` file): the cached snapshot when it holds weights, else downloaded (only its JSON
    files and one weights file, or its `.keras` files and labels)."""
    repository, revision = parse(name)
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        raise CheckpointError(
            f"{name}: Hugging Face names need huggingface_hub (pip install huggingface_hub)."
        ) from None
    folder = _local(repository, revision)
    if folder is not None:
        return _checkpoint(folder)
    where = cache_folder() / f"models--{repository.replace('/', '--')}"
    if offline():
        fetch = f"hf download {repository}" + (f" --revision {revision}" if revision else "")
        raise CheckpointError(
            f"{name}: not in the Hugging Face cache ({where}) and HF_HUB_OFFLINE is set; fetch it where there is "
            f"internet (`{fetch}`, with the same HF_HUB_CACHE or HF_HOME) or pass a local copy's folder."
        )
    try:
        folder = _snapshot(repository, revision, _FILES, local=False)
        if not _has_weights(folder):
            folder = _snapshot(repository, revision, _FALLBACK, local=False)
    except Exception as error:  # huggingface_hub's errors and the network's
        raise CheckpointError(
            f"{name}: download failed ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); "
            "pass a local copy's folder instead."
        ) from None
    if not _has_weights(folder):
        raise CheckpointError(f"{name}: the repository has none of {', '.join(_WEIGHTS)}.")
    return _checkpoint(folder)


def _local(repository, revision):
    try:
        folder = _snapshot(repository, revision, None, local=True)
    except Exception:  # not cached (huggingface_hub's LocalEntryNotFoundError and kin)
        return None
    return folder if _has_weights(folder) else None


def _snapshot(repository, revision, patterns, local):
    from huggingface_hub import snapshot_download

    folder = snapshot_download(
        repository,
        revision=revision,
        cache_dir=cache_folder(),
        local_files_only=local,
        allow_patterns=None if patterns is None else list(patterns),
    )
    return Path(folder)


def _has_weights(folder):
    return any(path.is_file() for pattern in _WEIGHTS for path in folder.glob(pattern))


def _checkpoint(folder):
    """What the snapshot `folder` holds to load: the folder (a timm, Transformers or keras-hub
    repository, or a run directory's `best.keras`), or its one keras_vit `.keras` file."""
    models = sorted(folder.glob("*.keras"))
    if len(models) == 1 and not any((folder / name).is_file() for name in (*HF_WEIGHT_FILES, *RUN_CHECKPOINTS)):
        return models[0]
    return folder
