"""Learned 1-D position embeddings, resampled in 2-D when loaded at another resolution."""

import keras
import numpy as np
from keras import ops

from keras_vit.resample import resample_position_embeddings


@keras.saving.register_keras_serializable(package="keras_vit")
class PositionEmbedding(keras.layers.Layer):
    """Adds a learned `(1, prefix + rows*cols, D)` embedding, initialised N(0, 0.02).

    Loading weights saved for another patch grid (`load_weights`, `.keras` files or
    `assign_resampled`) resamples the 2-D grid bilinearly and keeps the prefix (class
    token) slots, so a model trained at 224 can be fine-tuned at 384.
    """

    def __init__(self, grid_size, num_prefix_tokens=1, **kwargs):
        super().__init__(**kwargs)
        self.grid_size = tuple(int(g) for g in grid_size)
        self.num_prefix_tokens = int(num_prefix_tokens)

    @property
    def num_tokens(self):
        return self.num_prefix_tokens + self.grid_size[0] * self.grid_size[1]

    def build(self, input_shape):
        if input_shape[1] is not None and input_shape[1] != self.num_tokens:
            raise ValueError(
                f"{self.name} expects {self.num_tokens} tokens ({self.num_prefix_tokens} prefix + "
                f"grid {self.grid_size}); got {input_shape[1]}."
            )
        self.embedding = self.add_weight(
            name="embedding",
            shape=(1, self.num_tokens, input_shape[-1]),
            initializer=keras.initializers.RandomNormal(stddev=0.02),
        )

    def call(self, tokens):
        return tokens + ops.cast(self.embedding, tokens.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def assign_resampled(self, value, grid_size=None):
        """Assigns an embedding of any grid, resampled to this layer's grid (see `resampled`)."""
        self.embedding.assign(self.resampled(value, grid_size))

    def resampled(self, value, grid_size=None):
        """`value` resampled to this layer's grid, as a `(1, tokens, D)` array.

        `value` is `(1, prefix + rows*cols, D)` or `(prefix + rows*cols, D)`; a value without
        the prefix slots (as big_vision stores it) gets them from the current weights.
        `grid_size` is needed only for a non-square source grid.
        """
        value = np.asarray(value, dtype="float32")
        value = value.reshape((1,) + value.shape[-2:])
        current = keras.ops.convert_to_numpy(self.embedding)
        if value.shape[-1] != current.shape[-1]:
            raise ValueError(f"{self.name}: embedding width {value.shape[-1]} != {current.shape[-1]}.")
        prefix = self.num_prefix_tokens
        if grid_size is None:
            grid_size = _square_grid(value.shape[1], prefix, self.name)
        src_prefix = value.shape[1] - grid_size[0] * grid_size[1]
        if src_prefix not in (0, prefix):
            raise ValueError(
                f"{self.name}: cannot map {value.shape[1]} tokens on grid {tuple(grid_size)} "
                f"to {prefix} prefix token(s) + grid {self.grid_size}."
            )
        if src_prefix == 0 and prefix:
            value = np.concatenate([current[:, :prefix], value], axis=1)
        return resample_position_embeddings(value, self.grid_size, grid_size, prefix)

    def load_own_variables(self, store):
        stored = store["0"]
        if tuple(stored.shape) == tuple(self.embedding.shape):
            self.embedding.assign(stored)
        else:
            self.assign_resampled(np.asarray(stored))

    def get_config(self):
        return {
            **super().get_config(),
            "grid_size": list(self.grid_size),
            "num_prefix_tokens": self.num_prefix_tokens,
        }


def _square_grid(num_tokens, prefix, name):
    for candidate_prefix in (prefix, 0):
        side = int(round(np.sqrt(num_tokens - candidate_prefix)))
        if side * side == num_tokens - candidate_prefix:
            return (side, side)
    raise ValueError(f"{name}: {num_tokens} tokens do not form a square grid; pass `grid_size`.")
