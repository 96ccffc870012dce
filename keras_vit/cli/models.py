"""Finding the model a command works on."""

from pathlib import Path

RUN_DIR_CHECKPOINTS = ("best.keras", "last.keras")


def load_model(source):
    """A keras_vit model from a `.keras` file, a run directory (its `best.keras`, else
    `last.keras`) or any checkpoint `keras_vit.ViT.from_checkpoint` reads."""
    import keras

    import keras_vit

    path = Path(source)
    if path.is_dir() and not (path / "config.json").is_file():  # a run directory, not a HF folder
        found = [path / name for name in RUN_DIR_CHECKPOINTS if (path / name).is_file()]
        if not found:
            raise ValueError(f"{path} has no {' or '.join(RUN_DIR_CHECKPOINTS)}.")
        path = found[0]
    if path.suffix == ".keras":
        if not path.is_file():
            raise FileNotFoundError(f"model file not found: {path}")
        try:
            model = keras.saving.load_model(path, safe_mode=True)
        except Exception as error:  # zip/h5/config errors of many types
            raise ValueError(f"cannot load {path}: {type(error).__name__}: {error}") from None
        if not isinstance(model, keras_vit.ViT):
            raise ValueError(f"{path} holds a {type(model).__name__}, not a keras_vit ViT.")
        return model
    return keras_vit.ViT.from_checkpoint(source)
