"""Frozen inference graphs: a Keras model's forward with its weights folded in as constants."""

import numpy as np
import tensorflow as tf
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from keras_vit.export.source import ExportError

# A GraphDef is a protocol buffer, which cannot exceed 2 GiB; leave room for the ops.
MAX_FROZEN_BYTES = 2**31 - 2**27


def freeze(model):
    """The inference forward of a single-input Keras model (TensorFlow backend) as a
    TensorFlow graph that holds the weights as constants: `frozen(images)` returns the model's
    output tensor for a batch (tensor or array) of any size; it can be called inside a
    `tf.function` and saved in a SavedModel.

    What it buys on CPU: TensorFlow's graph optimiser folds the weight-only arithmetic into
    the constants (the mixed-precision weight casts: 152 -> 52 Cast ops in ViT-S/16), and its
    oneDNN matmuls ran 3% (float32) to 7% (bfloat16) faster on constant weights (why was not
    traced further). ViT-S/16 and B/16 on 2 cores: +3-5% images/s
    in float32 and +3-11% in mixed_bfloat16 against the model's `tf.function`; float32 outputs
    are the same (docs/benchmarks.md).

    Raises ExportError for models with several inputs or weights over the 2 GiB graph limit
    (ViT-H/14 in float32).
    """
    if len(model.inputs or []) != 1:
        raise ExportError(f"freezing needs a model with one image input; {model.name} has {len(model.inputs or [])}.")
    size = sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in model.weights)
    if size > MAX_FROZEN_BYTES:
        raise ExportError(
            f"{model.name} holds {size / 2**30:.1f} GiB of weights; a frozen graph is limited to 2 GiB "
            "(export it unfrozen)."
        )
    spec = model.inputs[0]
    forward = tf.function(lambda images: model(images, training=False))
    concrete = forward.get_concrete_function(tf.TensorSpec(spec.shape, spec.dtype, "images"))
    frozen = convert_variables_to_constants_v2(concrete)

    def call(images):
        return frozen(tf.convert_to_tensor(images, spec.dtype))[0]

    return call
