"""Register tokens (Darcet et al., "Vision Transformers Need Registers", ICLR 2024)."""

import keras
from keras import ops

from keras_vit import initializers


@keras.saving.register_keras_serializable(package="keras_vit")
class RegisterTokens(keras.layers.Layer):
    """Inserts `num_tokens` learned tokens after the first `num_prefix_tokens` tokens (the class
    token) of `(batch, N, D)`. The model calls it after the position embedding is added, so the
    registers get no position; pooling and the patch maps leave them out."""

    def __init__(self, num_tokens, num_prefix_tokens=1, **kwargs):
        super().__init__(**kwargs)
        self.num_tokens = int(num_tokens)
        self.num_prefix_tokens = int(num_prefix_tokens)
        if self.num_tokens < 1 or self.num_prefix_tokens < 0:
            raise ValueError(
                f"RegisterTokens needs num_tokens >= 1 and num_prefix_tokens >= 0; got {num_tokens}, "
                f"{num_prefix_tokens}."
            )

    def build(self, input_shape):
        self.tokens = self.add_weight(
            name="tokens",
            shape=(1, self.num_tokens, input_shape[-1]),
            initializer=initializers.RandomNormal(stddev=1e-6),
        )

    def call(self, tokens):
        registers = ops.cast(self.tokens, tokens.dtype)
        registers = ops.broadcast_to(registers, (ops.shape(tokens)[0], self.num_tokens, tokens.shape[-1]))
        prefix = self.num_prefix_tokens
        return ops.concatenate([tokens[:, :prefix], registers, tokens[:, prefix:]], axis=1)

    def compute_output_shape(self, input_shape):
        length = None if input_shape[1] is None else input_shape[1] + self.num_tokens
        return (input_shape[0], length, input_shape[2])

    def get_config(self):
        return {**super().get_config(), "num_tokens": self.num_tokens, "num_prefix_tokens": self.num_prefix_tokens}
