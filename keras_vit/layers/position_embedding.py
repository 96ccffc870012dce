"""Learned 1-D position embeddings, resampled in 2-D when loaded at another resolution."""

import keras
import numpy as np
from keras import ops

from keras_vit import initializers
from keras_vit.resample import interpolation_matrix, resample_position_embeddings

GRID_KEY = "grid_size"  # stored beside the embedding in .keras and .weights.h5 files


@keras.saving.register_keras_serializable(package="keras_vit")
class PositionEmbedding(keras.layers.Layer):
    """Adds a learned `(1, prefix + rows*cols, D)` embedding, initialised N(0, 0.02).

    Loading weights saved for another patch grid (`load_weights`, `.keras` files or
    `assign_resampled`) resamples the 2-D grid (`interpolation`, see `keras_vit.resample`) and
    keeps the prefix (class token) slots, so a model trained at 224 can be fine-tuned at 384.
    `.keras` and weights files store the grid beside the embedding, so non-square grids
    resample exactly. Called with `grid` (a tensor whose shape is `(batch, rows, cols, ...)`, see
    `PatchEmbedding`), it adds the embedding resampled to that grid in the call.
    """

    def __init__(self, grid_size, num_prefix_tokens=1, interpolation="bilinear", **kwargs):
        super().__init__(**kwargs)
        self.grid_size = tuple(int(g) for g in grid_size)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.interpolation = interpolation

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
            initializer=initializers.RandomNormal(stddev=0.02),
        )

    def call(self, tokens, grid=None):
        embedding = self.embedding if grid is None else self.on_grid(ops.shape(grid)[1:3])
        return tokens + ops.cast(embedding, tokens.dtype)

    def on_grid(self, grid_size):
        """The embedding resampled to `grid_size` (ints, or scalar tensors of a size known only in
        the call) with this layer's interpolation, in the graph."""
        if all(isinstance(n, int) for n in grid_size) and tuple(grid_size) == self.grid_size:
            return self.embedding
        prefix, width = self.num_prefix_tokens, self.embedding.shape[-1]
        embedding = ops.cast(self.embedding, "float32")
        rows, cols = (
            interpolation_matrix(old, new, self.interpolation, xp=ops) for old, new in zip(self.grid_size, grid_size)
        )
        grid = ops.reshape(embedding[0, prefix:], (*self.grid_size, width))
        grid = ops.reshape(ops.einsum("ir,rcd,jc->ijd", rows, grid, cols), (1, -1, width))
        return ops.concatenate([embedding[:, :prefix], grid], axis=1)

    def compute_output_shape(self, input_shape):
        return input_shape

    def assign_resampled(self, value, grid_size=None):
        """Assigns an embedding of any grid, resampled to this layer's grid (see `resampled`)."""
        self.embedding.assign(self.resampled(value, grid_size))

    def resampled(self, value, grid_size=None):
        """`value` resampled to this layer's grid, as a `(1, tokens, D)` array.

        `value` is `(1, prefix + rows*cols, D)` or `(prefix + rows*cols, D)`. A value without
        the prefix slots (big_vision token models, timm's `no_embed_class` models, which add no
        position embedding to the class token) gets zero slots, which compute the same.
        `grid_size`: the source grid; without it, this layer's own grid when the token count
        matches it, else a square grid (see `source_grid`).
        """
        value = np.asarray(value, dtype="float32")
        value = value.reshape((1,) + value.shape[-2:])
        width = int(self.embedding.shape[-1])
        if value.shape[-1] != width:
            raise ValueError(f"{self.name}: embedding width {value.shape[-1]} != {width}.")
        grid_size, src_prefix = self.source_grid(value.shape[1], grid_size)
        prefix = self.num_prefix_tokens
        if src_prefix == 0 and prefix:
            value = np.concatenate([np.zeros((1, prefix, width), "float32"), value], axis=1)
        return resample_position_embeddings(value, self.grid_size, grid_size, prefix, self.interpolation)

    def source_grid(self, num_tokens, grid_size=None):
        """`(grid, prefix slots)` of a stored embedding of `num_tokens` tokens: `grid_size` when
        given, else this layer's grid if the count fits it (with or without the prefix slots),
        else the square grid the count makes."""
        prefix = self.num_prefix_tokens
        own = self.grid_size[0] * self.grid_size[1]
        if grid_size is None:
            if num_tokens in (own + prefix, own):
                grid_size = self.grid_size
            else:
                grid_size = _square_grid(num_tokens, prefix, self.name)
        grid_size = tuple(int(g) for g in grid_size)
        src_prefix = num_tokens - grid_size[0] * grid_size[1]
        if src_prefix not in (0, prefix):
            raise ValueError(
                f"{self.name}: cannot map {num_tokens} tokens on grid {grid_size} "
                f"to {prefix} prefix token(s) + grid {self.grid_size}."
            )
        return grid_size, src_prefix

    def save_own_variables(self, store):
        super().save_own_variables(store)
        store[GRID_KEY] = np.asarray(self.grid_size, "int32")

    def load_own_variables(self, store):
        stored = store["0"]
        if tuple(stored.shape) == tuple(self.embedding.shape):
            self.embedding.assign(stored)
        else:  # files written before the grid was stored hold a square one or this layer's own
            grid = tuple(int(g) for g in np.asarray(store[GRID_KEY])) if GRID_KEY in store else None
            self.assign_resampled(np.asarray(stored), grid)

    def get_config(self):
        return {
            **super().get_config(),
            "grid_size": list(self.grid_size),
            "num_prefix_tokens": self.num_prefix_tokens,
            "interpolation": self.interpolation,
        }


def _square_grid(num_tokens, prefix, name):
    for candidate_prefix in (prefix, 0):
        side = int(round(np.sqrt(num_tokens - candidate_prefix)))
        if side * side == num_tokens - candidate_prefix:
            return (side, side)
    raise ValueError(f"{name}: {num_tokens} tokens do not form a square grid; pass `grid_size`.")
