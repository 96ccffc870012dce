"""The learned class token prepended to the patch sequence."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class ClassToken(keras.layers.Layer):
    """Prepends one learned token (zero-initialised, as in the reference) to `(batch, N, D)`."""

    def build(self, input_shape):
        self.token = self.add_weight(name="token", shape=(1, 1, input_shape[-1]), initializer="zeros")

    def call(self, tokens):
        cls = ops.cast(self.token, tokens.dtype)  # follows the compute dtype under mixed precision
        cls = ops.broadcast_to(cls, (ops.shape(tokens)[0], 1, tokens.shape[-1]))
        return ops.concatenate([cls, tokens], axis=1)

    def compute_output_shape(self, input_shape):
        length = None if input_shape[1] is None else input_shape[1] + 1
        return (input_shape[0], length, input_shape[2])
