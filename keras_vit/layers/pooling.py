"""Reading the image representation off the token sequence."""

import keras
from keras import ops

from keras_vit.names import POOLING_MODES


@keras.saving.register_keras_serializable(package="keras_vit")
class TokenPooling(keras.layers.Layer):
    """`token`: the first (class) token; `gap`: the mean of the tokens after the prefix."""

    def __init__(self, mode="token", num_prefix_tokens=1, **kwargs):
        super().__init__(**kwargs)
        if mode not in POOLING_MODES:
            raise ValueError(f"pooling mode must be one of {POOLING_MODES}; got {mode!r}.")
        if mode == "token" and num_prefix_tokens < 1:
            raise ValueError("`token` pooling needs a class token (num_prefix_tokens >= 1).")
        self.mode = mode
        self.num_prefix_tokens = int(num_prefix_tokens)

    def call(self, tokens):
        if self.mode == "token":
            return tokens[:, 0]
        return ops.mean(tokens[:, self.num_prefix_tokens :], axis=1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def get_config(self):
        return {**super().get_config(), "mode": self.mode, "num_prefix_tokens": self.num_prefix_tokens}
