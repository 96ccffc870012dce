"""Keras weights files of keras_vit models (`model.save_weights("x.weights.h5")`). They hold no
architecture, so they load into a model of the target's own config (its position embedding
resamples a file saved at another resolution as it loads) with the file's head width, whose
weights then reach the target through `assign`, as any checkpoint's do."""

import re
import textwrap
import warnings

from keras_vit.checkpoints.assign import export
from keras_vit.checkpoints.files import CheckpointError

SUFFIX = ".weights.h5"
# Keras stores each layer under its class's snake-cased name: the head and pre-logits are `dense*`.
_DENSE_KERNEL = re.compile(r"layers/dense(_\d+)?/vars/0")


def is_keras_weights(path):
    return str(path).endswith(SUFFIX)


def read(path, config):
    """`{variable path: array}` of a Keras weights file saved from a keras_vit ViT like one of
    `config` (a ViTConfig), read through such a model with each head width the file holds."""
    import h5py

    from keras_vit.model import ViT

    try:
        with h5py.File(path, "r") as file:
            widths = []
            file.visititems(
                lambda name, item: (
                    widths.append(item.shape[-1]) if _DENSE_KERNEL.fullmatch(name) and len(item.shape) == 2 else None
                )
            )
    except OSError as error:
        raise CheckpointError(f"{path}: not a readable Keras weights file ({error}).") from None
    failures = []
    for classes in dict.fromkeys([config.num_classes, *widths]):
        donor = ViT(config.replace(num_classes=classes))
        try:
            with warnings.catch_warnings():  # Keras warns of each part it did not find
                warnings.simplefilter("ignore")
                donor.load_weights(path)
        except ValueError as error:
            failures.append(" ".join(str(error).split()) or type(error).__name__)
            continue
        return export(donor)
    why = textwrap.shorten(failures[0], 160, placeholder=" ...")
    raise CheckpointError(
        f"{path}: a Keras weights file of another architecture than this model's (Keras: {why}). Such files hold no "
        "architecture: load it into the model that saved it (model.load_weights), or save that model as .keras "
        "(model.save), which loads anywhere."
    )
