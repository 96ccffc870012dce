"""Group normalisation written as `(x - mean) * rsqrt(var + eps)`, the form that quantises."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class GroupNormalization(keras.layers.GroupNormalization):
    """`keras.layers.GroupNormalization` over channels-last feature maps (same weights, config
    and outputs to float rounding) computed from the centred input.

    Keras's kernel takes the variance as `mean(x^2) - mean^2` and folds the mean into the
    offset (`x * s + (beta - mean * s)`); the TFLite converter lowers that to float `SQUARE`
    and `NEG`, which int8 and int16x8 quantisation cannot convert (the hybrid ViT's ResNet
    stem then failed to export in those modes). Centring first maps onto quantisable builtin
    ops only, and is the more accurate variance besides. Half-precision inputs are normalised
    in float32, as Keras does. The class keeps Keras's name so `.keras` files store its
    weights under the same key either way.
    """

    def build(self, input_shape):
        if self.axis not in (-1, len(input_shape) - 1):
            raise ValueError(f"keras_vit's GroupNormalization normalises the last axis; got axis={self.axis}.")
        super().build(input_shape)

    def call(self, inputs):
        x = inputs
        if keras.backend.standardize_dtype(x.dtype) in ("float16", "bfloat16"):
            x = ops.cast(x, "float32")
        channels = x.shape[-1]
        # (batch, positions, groups, channels per group), whatever the input's rank.
        grouped = ops.reshape(x, (ops.shape(x)[0], -1, self.groups, channels // self.groups))
        centred = grouped - ops.mean(grouped, axis=(1, 3), keepdims=True)
        # `centred * centred`, not `square`: the converter fuses sub + square into
        # SQUARED_DIFFERENCE, which LiteRT cannot run on int16 (int16x8 mode).
        variance = ops.mean(centred * centred, axis=(1, 3), keepdims=True)
        y = ops.reshape(centred * ops.rsqrt(variance + self.epsilon), ops.shape(x))
        if self.scale:
            y = y * ops.cast(self.gamma, y.dtype)
        if self.center:
            y = y + ops.cast(self.beta, y.dtype)
        return ops.cast(y, self.compute_dtype)
