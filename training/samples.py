"""Samples of a model's data for the export application and exported files: calibration images,
held-out arrays and a fine-tuning pipeline, made the way training and evaluation make them."""

import numpy as np

from keras_vit.training import datasets, pipeline
from keras_vit.training.run import data_config, in_model_order, load_run_config, model_classes, training_run


def export_samples(model, source=None, dataset=None, calibration_size=200, eval_limit=2000, class_names=None):
    """The data `keras_vit.export.ExportSource` takes, as keyword arguments, or None when there
    is none: `dataset` ("digits", "tfds:NAME" or a folder), else the data of `source` when it is
    a run directory or a checkpoint in one; split as that run split it when it trained on that
    data, else as `train` does with its default options.

    The held-out images pass through the model's own `image_transform`; `calibration_size`
    training images (shuffled with the run's seed) likewise; `train` is the run's augmented
    training pipeline for quantisation-aware training, pruning and clustering; `data_split` is
    how the run split its data (None: no run), recorded in the exported files. The data's classes
    are matched to the model's by name (`class_names`, the names of its outputs in order;
    default: the model's `class_names`), as `evaluate` matches them."""
    run = training_run(source)
    if not dataset and run is None:
        return None
    config = data_config(dataset, run=run)
    data = datasets.load(config)
    trained_on = load_run_config(run).data_split() if run is not None else None
    size, num_classes, data_classes = tuple(model.config.image_size), model.config.num_classes, len(data.class_names)
    names = model.class_names if class_names is None else list(class_names)
    order = model_classes(data.class_names, names, config.dataset, num_classes)
    to_model = np.arange(data_classes) if order is None else np.asarray(order)

    def arrays(ds, limit):
        channels = model.config.channels
        ds = pipeline.eval_pipeline(ds.take(limit), model.image_transform, data_classes, 64, channels=channels)
        images, labels = zip(*((x.numpy(), y.numpy()) for x, y in ds))
        return np.concatenate(images), to_model[np.concatenate(labels).argmax(-1)]

    eval_images, eval_labels = arrays(data.eval, eval_limit)
    # The first pass of training's order: shuffled before decoding, no decoded image buffered.
    calibration, _ = arrays(data.passes(config.seed).map(lambda image, label, _: (image, label)), calibration_size)
    batch = min(config.batch_size, data.num_train)
    return dict(
        eval_images=eval_images,
        eval_labels=eval_labels,
        calibration_images=calibration,
        train=_in_model_classes(
            pipeline.train_pipeline(data, config, size, data_classes, batch, channels=model.config.channels),
            to_model,
            num_classes,
        ),
        steps_per_epoch=max(1, data.num_train // batch),
        label_smoothing=config.label_smoothing or 0.0,
        data_split=trained_on,
    )


def _in_model_classes(batches, to_model, num_classes):
    """Training batches whose (mixed) one-hot labels over the data's classes become labels over
    the model's `num_classes`, class i of the data its class `to_model[i]`."""
    if np.array_equal(to_model, np.arange(num_classes)):
        return batches
    import tensorflow as tf

    placement = tf.constant(np.eye(num_classes, dtype=np.float32)[to_model])  # (data classes, model classes)
    return batches.map(lambda x, y: (x, tf.matmul(y, placement)))


def held_out_images(dataset=None, class_names=None, split=None, source=None, recorded=None):
    """The evaluation split of `dataset` ("digits", "tfds:NAME" or a folder; None: the model's
    own) for models that take images as they are (exported files): split as the model's
    training split it when that is known and was this data — from `source` (a run directory or a
    checkpoint in one) or `recorded` (the data split an exported model records, its
    `data_split`) — else as `train` splits it by default; or `split` (as `evaluate`'s).
    Returns `(examples, num_examples, data_class_names)`, `examples` an iterator of `(uint8
    image (H, W, 3), label)` NumPy pairs, the labels in `class_names`' order (None: the data's)."""
    config = data_config(dataset, split, training_run(source), recorded)
    data = datasets.load(config)
    return in_model_order(data, class_names, config.dataset).as_numpy_iterator(), data.num_eval, list(data.class_names)
