"""The patch tokens as a spatial map, so CAM methods (tf-keras-vis GradCAM++, ScoreCAM) can
target a ViT: `(batch, prefix + rows*cols, D)` <-> `(batch, rows, cols, D)`."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class TokenGrid(keras.layers.Layer):
    """The patch tokens (prefix tokens dropped) reshaped to the `(rows, cols)` patch grid.
    `grid_size=None`: the grid of each call's `grid` tensor (its shape `(batch, rows, cols, ...)`,
    see `PatchEmbedding`), for images whose size is known only in the call."""

    def __init__(self, grid_size, num_prefix_tokens=1, **kwargs):
        super().__init__(**kwargs)
        self.grid_size = None if grid_size is None else tuple(int(g) for g in grid_size)
        self.num_prefix_tokens = int(num_prefix_tokens)

    def call(self, tokens, grid=None):
        if self.grid_size is None and grid is None:
            raise ValueError(f"{self.name}: a TokenGrid without a grid_size takes the `grid` of each call.")
        grid_size = self.grid_size or ops.shape(grid)[1:3]
        return ops.reshape(tokens[:, self.num_prefix_tokens :], (-1, *grid_size, tokens.shape[-1]))

    def compute_output_shape(self, input_shape):
        return (input_shape[0], *(self.grid_size or (None, None)), input_shape[-1])

    def get_config(self):
        grid_size = None if self.grid_size is None else list(self.grid_size)
        return {**super().get_config(), "grid_size": grid_size, "num_prefix_tokens": self.num_prefix_tokens}


@keras.saving.register_keras_serializable(package="keras_vit")
class MergeTokenGrid(keras.layers.Layer):
    """Inverse of `TokenGrid`: `[tokens, grid]` -> the prefix tokens of `tokens` followed by
    the flattened `grid`. With `TokenGrid` it is the identity, but it routes the patch tokens
    through the grid tensor, so gradients with respect to the grid are the real ones."""

    def __init__(self, num_prefix_tokens=1, **kwargs):
        super().__init__(**kwargs)
        self.num_prefix_tokens = int(num_prefix_tokens)

    def call(self, inputs):
        tokens, grid = inputs
        rows, cols = ops.shape(grid)[1:3]
        flat = ops.reshape(grid, (-1, rows * cols, grid.shape[-1]))
        return ops.concatenate([tokens[:, : self.num_prefix_tokens], flat], axis=1)

    def compute_output_shape(self, input_shape):
        return input_shape[0]

    def get_config(self):
        return {**super().get_config(), "num_prefix_tokens": self.num_prefix_tokens}
