"""Frozen inference graphs for export: a Keras model's forward with its weights as constants
(`keras_vit.tf_predict.frozen_forward`), with export's checks."""

from keras_vit import tf_predict
from keras_vit.export.source import ExportError, require_tensorflow_backend


def freeze(model):
    """The inference forward of a single-input Keras model (TensorFlow backend) as a TensorFlow
    graph that holds the weights as constants, mixed-precision weight casts folded into
    half-precision constants and a hybrid's standardised ResNet kernels computed once:
    `frozen(images)` returns the model's output tensor for a batch
    (tensor or array) of any size; it can be called inside a `tf.function` and saved in a
    SavedModel. On an AMX CPU oneDNN lays constant weights out once for its AMX kernels; on AMD
    CPUs ViT-S/16 and B/16 ran 3-5% faster in float32 and 3-11% in mixed_bfloat16 than the
    model's `tf.function`, with the same outputs (docs/performance.md).

    Raises ExportError for models with several inputs or weights over the 2 GiB graph limit
    (ViT-H/14 in float32).
    """
    require_tensorflow_backend()
    if len(model.inputs or []) != 1:
        raise ExportError(f"freezing needs a model with one image input; {model.name} has {len(model.inputs or [])}.")
    if not tf_predict.fits(model):
        raise ExportError(
            f"{model.name} holds {tf_predict.weight_bytes(model) / 2**30:.1f} GiB of weights; a frozen graph is "
            "limited to 2 GiB (export it unfrozen)."
        )
    return tf_predict.frozen_forward(model)
