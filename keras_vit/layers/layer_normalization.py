"""Layer normalisation written as `(x - mean) * rsqrt(var + eps)`, the form that quantises."""

import keras
from keras import ops


def centred_normalize(x, axis, epsilon):
    """`(x - mean) * rsqrt(var + epsilon)` over `axis`, in float32 for half-precision `x`: the
    form that maps onto quantisable TFLite builtins (keras_vit's Layer and GroupNormalization)."""
    if keras.backend.standardize_dtype(x.dtype) in ("float16", "bfloat16"):
        x = ops.cast(x, "float32")
    centred = x - ops.mean(x, axis=axis, keepdims=True)
    # `centred * centred`, not `square`: the converter fuses sub + square into
    # SQUARED_DIFFERENCE, which LiteRT cannot run on int16 (int16x8 mode).
    variance = ops.mean(centred * centred, axis=axis, keepdims=True)
    return centred * ops.rsqrt(variance + epsilon)


@keras.saving.register_keras_serializable(package="keras_vit")
class LayerNormalization(keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization` (same weights, config and outputs to float rounding)
    computed from the centred input.

    Keras's TensorFlow kernel folds the mean into the offset (`x * s + (beta - mean * s)`),
    which the TFLite converter lowers to a float `NEG` that full-integer int8 and int16x8
    quantisation cannot convert. Centring first maps onto quantisable builtin ops only.
    Half-precision inputs are normalised in float32, as Keras does. The class keeps Keras's
    name so `.keras` files store its weights under the same key either way.
    """

    def call(self, inputs):
        if self.rms_scaling:
            return super().call(inputs)
        y = centred_normalize(inputs, self.axis, self.epsilon)
        if self.scale:
            y = y * ops.cast(self.gamma, y.dtype)
        if self.center:
            y = y + ops.cast(self.beta, y.dtype)
        return ops.cast(y, self.compute_dtype)
