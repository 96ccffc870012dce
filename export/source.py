"""What an export starts from: the Keras model, its label names, and real images for
calibration, fine-tuning and the held-out evaluation of every artifact (the model's own image
transform turns encoded images into its input: `model.image_transform`)."""

import dataclasses
import importlib.util
import logging

import keras
import numpy as np

from keras_vit import saving
from keras_vit.transform import to_channels

logger = logging.getLogger("keras_vit")


class ExportError(ValueError):
    """Bad export input (printed by the CLI as one line)."""


def require_packages(what, names, hint):
    """Raises an ExportError naming those of the packages `names` that are not installed: "`what`
    need X and Y, which are not installed: `hint`."."""
    missing = [name for name in names if importlib.util.find_spec(name) is None]
    if missing:
        which = (
            f"{', '.join(missing[:-1])} and {missing[-1]}, which are" if len(missing) > 1 else f"{missing[0]}, which is"
        )
        raise ExportError(f"{what} need {which} not installed: {hint}.")


def require_tensorflow_backend():
    """Raises ExportError unless Keras runs on TensorFlow: SavedModels, frozen graphs and LiteRT
    files are traced from the model as TensorFlow graphs."""
    if keras.backend.backend() != "tensorflow":
        raise ExportError(
            f"exporting needs Keras's TensorFlow backend, not {keras.backend.backend()}: set KERAS_BACKEND=tensorflow "
            "(a .keras file saved under any backend loads there)."
        )


@dataclasses.dataclass
class ExportSource:
    """A model to export and the data the report needs.

    `eval_images`/`eval_labels`: held-out uint8 or float pixels `(N, H, W, C)` at the
    model's size and channels (RGB ones become grayscale for a `channels=1` model) and integer
    labels; `calibration_images`: a representative sample of the training data; `train`: a
    `tf.data` pipeline of augmented (images, one-hot) batches for quantisation-aware training,
    pruning and clustering (None when not available);
    `data_split`: the dataset, seed and held-out shares of the model's training run, written
    into every artifact so that it is evaluated on the images training never saw.
    """

    model: keras.Model
    labels: list
    eval_images: np.ndarray = None
    eval_labels: np.ndarray = None
    calibration_images: np.ndarray = None
    train: object = None
    steps_per_epoch: int = 0
    label_smoothing: float = 0.0  # of the training recipe, reused when fine-tuning
    data_split: dict = None  # how the model's training data was split (from its run), recorded in the files

    def __post_init__(self):
        if not self.model.config.num_classes:
            raise ExportError(
                f"{self.model.name} has no classification head (num_classes=0): the exported files classify images. "
                "For features, use Keras's own model.export(path) on the model."
            )
        if self.model.config.dynamic_image_size:
            # Exported graphs take one size: the copy computes what the model computes at it.
            size = self.model.config.image_size
            logger.warning(
                "keras_vit: %s takes images of any size; the exported files take %dx%d, its image_size "
                "(model.resized((height, width)) sets another before exporting)",
                self.model.name,
                *size,
            )
            self.model = self.model.resized(dynamic_image_size=False)
        size, channels = tuple(self.model.config.image_size), self.model.config.channels
        if len(self.labels) != self.model.config.num_classes:
            raise ExportError(f"{len(self.labels)} label names for a model of {self.model.config.num_classes} classes.")
        saving.check_label_names(self.labels)
        for what in ("eval_images", "calibration_images"):
            images = getattr(self, what)
            if images is None:
                continue
            images = to_channels(np.asarray(images), channels) if np.ndim(images) == 4 else np.asarray(images)
            if images.ndim != 4 or images.shape[1:] != size + (channels,):
                raise ExportError(
                    f"{what} must be (N, {size[0]}, {size[1]}, {channels}) pixels for this model; got shape "
                    f"{images.shape}."
                )
            if len(images) == 0:
                raise ExportError(f"{what} is empty.")
            setattr(self, what, images.astype(np.float32))
        if (self.eval_images is None) != (self.eval_labels is None):
            raise ExportError("eval_images and eval_labels go together.")

    def with_data(self, data):
        """A copy with the data fields of `data` (a dict, e.g. from
        `keras_vit.training.export_samples`; None changes nothing)."""
        return dataclasses.replace(self, **(data or {}))


def load_source(path, labels=None):
    """An `ExportSource` from a `keras-vit train` run directory (its best checkpoint and labels),
    a `.keras` file or any checkpoint keras_vit reads (`labels`: a labels file or list, else the
    run's, else the model's `class_names`, else class indices). It holds no data until
    `with_data` gives it some, e.g. a run's own from `keras_vit.training.export_samples`;
    without data, nothing is calibrated and the exports are checked against the Keras model
    on stand-in images."""
    try:
        model = saving.load_model(path)
        names = saving.label_names(path, model, labels)
    except (ValueError, OSError) as error:
        raise ExportError(str(error)) from None
    return ExportSource(model=model, labels=names)
