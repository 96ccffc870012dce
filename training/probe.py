"""The linear probe (`--freeze-backbone`): the pre-trained backbone's pooled features of every
training (and selection) image, computed once, and a model of the head alone that trains on them.

A probe's epoch then costs a pass of one Dense layer over cached vectors instead of the whole
ViT's forward and backward passes over decoded, augmented images. The features are the model's
own `feature_model(...)["pooled"]` of each image read through its evaluation transform (no
augmentation: each image gives one vector), so the head trained here reads what it reads in the
full model, which is saved and evaluated as a whole.
"""

import dataclasses
import logging
import time

import keras
import numpy as np
import tensorflow as tf

from keras_vit.training import pipeline

logger = logging.getLogger("keras_vit")


def features_and_head(model, source, batch_size, multiple):
    """`(source, head)`: `source` (a `datasets.Source`) with its training and selection splits
    replaced by `model`'s pooled features of their images, and a Keras model of `model`'s
    head alone (its own layer: training it trains `model`'s head). `batch_size` and `multiple`
    as `pipeline.eval_pipeline` takes them (data-parallel devices)."""
    began = time.monotonic()
    extractor = model.feature_model(blocks=(), pooled=True)
    train, num_train = _features(extractor, model, source.train, batch_size, multiple)
    select, num_select = None, 0
    if source.select is not None:
        select, num_select = _features(extractor, model, source.select, batch_size, multiple)
    logger.info(
        "keras_vit: linear probe: the frozen backbone's features of %d training image%s computed once (%.1f s)",
        num_train,
        "" if num_train == 1 else "s",
        time.monotonic() - began,
    )
    features = keras.Input(shape=(extractor.output["pooled"].shape[-1],), name="features")
    head = keras.Model(features, model.get_layer("head")(features), name=f"{model.name}_head")
    cached = dataclasses.replace(
        source,
        records=train,
        num_train=num_train,
        select=select,
        num_select=num_select,
        decode=None,
        shuffle_buffer=None,  # the vectors are small: each pass permutes them all
        drop_undecodable=False,
    )
    return cached, head


def _features(extractor, model, examples, batch_size, multiple):
    """A dataset of (float32 feature vector, int label) of `examples` ((uint8 image, int label)
    pairs), in order, and how many there are (an image that cannot be decoded is left out)."""
    labels = np.fromiter(examples.map(lambda image, label: label).as_numpy_iterator(), np.int64)
    channels = model.config.channels
    images = pipeline.eval_pipeline(examples, model.image_transform, 1, batch_size, len(labels), multiple, channels)
    # Its batches, counted for `predict` (a dataset of unknown length would end in Keras's warning
    # that the input ran out): the examples and the blanks that make the last batch a multiple
    # (`batch_size`, a global batch, divides by the data-parallel devices already).
    steps = -(-(len(labels) + (-len(labels)) % multiple) // batch_size)
    vectors = extractor.predict(images, steps=steps, verbose=0)["pooled"][: len(labels)]  # without the blanks
    return tf.data.Dataset.from_tensor_slices((vectors.astype("float32"), labels)), len(labels)
