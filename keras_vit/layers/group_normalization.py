"""Group normalisation written as `(x - mean) * rsqrt(var + eps)`, the form that quantises."""

import math

import keras
from keras import ops

from keras_vit.layers.layer_normalization import centred_normalize


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
        shape = ops.shape(inputs)
        # (batch, positions, groups, channels per group), whatever the input's rank; the positions
        # counted where known (JAX and PyTorch cannot infer -1 in an empty batch)
        positions = -1 if None in inputs.shape[1:-1] else math.prod(inputs.shape[1:-1])
        grouped = ops.reshape(inputs, (shape[0], positions, self.groups, inputs.shape[-1] // self.groups))
        y = ops.reshape(centred_normalize(grouped, (1, 3), self.epsilon), shape)
        if self.scale:
            y = y * ops.cast(self.gamma, y.dtype)
        if self.center:
            y = y + ops.cast(self.beta, y.dtype)
        return ops.cast(y, self.compute_dtype)
