"""What an export starts from: the Keras model, its label names, and real images for
calibration, fine-tuning and the held-out evaluation of every artifact."""

import dataclasses
import logging

import keras
import numpy as np

from keras_vit import saving
from keras_vit.names import EVAL_CROP

logger = logging.getLogger("keras_vit")


class ExportError(ValueError):
    """Bad export input (printed by the CLI as one line)."""


@dataclasses.dataclass
class ExportSource:
    """A model to export and the data the report needs.

    `crop`: the evaluation centre-crop fraction, applied to encoded images served by bytes.
    `eval_images`/`eval_labels`: held-out uint8 or float pixels `(N, H, W, 3)` at the
    model's size and integer labels; `calibration_images`: a representative sample of the
    training data; `train`: a `tf.data` pipeline of augmented (images, one-hot) batches for
    quantisation-aware training, pruning and clustering (None when not available).
    """

    model: keras.Model
    labels: list
    eval_images: np.ndarray = None
    eval_labels: np.ndarray = None
    calibration_images: np.ndarray = None
    train: object = None
    steps_per_epoch: int = 0
    crop: float = EVAL_CROP  # centre-crop fraction of the evaluation transform (1: resize only)
    label_smoothing: float = 0.0  # of the training recipe, reused when fine-tuning

    def __post_init__(self):
        size = tuple(self.model.config.image_size)
        if len(self.labels) != self.model.config.num_classes:
            raise ExportError(f"{len(self.labels)} label names for a model of {self.model.config.num_classes} classes.")
        for what in ("eval_images", "calibration_images"):
            images = getattr(self, what)
            if images is None:
                continue
            images = np.asarray(images)
            if images.ndim != 4 or images.shape[1:] != size + (3,):
                raise ExportError(
                    f"{what} must be (N, {size[0]}, {size[1]}, 3) pixels for this model; got shape {images.shape}."
                )
            if len(images) == 0:
                raise ExportError(f"{what} is empty.")
            setattr(self, what, images.astype(np.float32))
        if (self.eval_images is None) != (self.eval_labels is None):
            raise ExportError("eval_images and eval_labels go together.")


def load_source(path, calibration_size=200, eval_limit=2000, labels=None, dataset=None):
    """An `ExportSource` from a `keras-vit train` run directory (its best checkpoint, labels,
    training and evaluation splits), a `.keras` file or any checkpoint keras_vit reads (with
    `labels`, a labels file or list, and `dataset`, a training dataset spec such as "digits",
    "tfds:NAME" or a folder, both optional: without data, nothing is calibrated and the
    exports are checked against the Keras model on stand-in images)."""
    from keras_vit.training import TrainConfig, run

    try:
        model = saving.load_model(path)
        names = saving.label_names(path, model.config.num_classes, labels)
    except (ValueError, OSError) as error:
        raise ExportError(str(error)) from None
    if dataset:
        config = TrainConfig(dataset=dataset).resolved()
    elif saving.is_run_dir(path):
        config = run.load_run_config(path)
    else:
        return ExportSource(model=model, labels=names)
    return ExportSource(model=model, labels=names, **_data(config, model, calibration_size, eval_limit))


def _data(config, model, calibration_size, eval_limit):
    """Calibration sample, held-out arrays and the fine-tuning pipeline of a training config."""
    from keras_vit.training import datasets, pipeline

    source = datasets.load(config)
    size, num_classes = tuple(model.config.image_size), model.config.num_classes
    crop = config.eval_crop

    def arrays(ds, limit):
        ds = pipeline.eval_pipeline(ds.take(limit), size, num_classes, 64, crop=crop)
        images, labels = zip(*((x.numpy(), y.numpy()) for x, y in ds))
        return np.concatenate(images), np.concatenate(labels).argmax(-1)

    eval_images, eval_labels = arrays(source.eval, eval_limit)
    calibration, _ = arrays(source.train.shuffle(source.num_train, seed=config.seed), calibration_size)
    batch = min(config.batch_size, source.num_train)
    train = pipeline.train_pipeline(source.train, source.num_train, config, size, num_classes, batch)
    return dict(
        eval_images=eval_images,
        eval_labels=eval_labels,
        calibration_images=calibration,
        train=train,
        steps_per_epoch=max(1, source.num_train // batch),
        crop=crop,
        label_smoothing=config.label_smoothing or 0.0,
    )
