"""Patch embedding: cut the image into PxP patches and project each to width D."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchEmbedding(keras.layers.Layer):
    """Conv2D with kernel = stride = P (the same map as flatten + Dense), then tokens.

    Input `(batch, H, W, C)`; output `(batch, H/P * W/P, hidden_size)` in row-major patch
    order. The kernel layout is HWIO, as in the official checkpoints.
    """

    def __init__(self, hidden_size, patch_size, **kwargs):
        super().__init__(**kwargs)
        self.hidden_size = int(hidden_size)
        self.patch_size = tuple(patch_size) if not isinstance(patch_size, int) else (patch_size,) * 2
        self.projection = keras.layers.Conv2D(
            self.hidden_size,
            kernel_size=self.patch_size,
            strides=self.patch_size,
            padding="valid",
            kernel_initializer="lecun_normal",  # flax nn.Conv default, as in the reference
            dtype=self.dtype_policy,
            name="projection",
        )

    def build(self, input_shape):
        self.projection.build(input_shape)

    def call(self, images):
        _check_divisible(images.shape, self.patch_size)
        x = self.projection(images)
        return ops.reshape(x, (ops.shape(x)[0], -1, self.hidden_size))

    def compute_output_shape(self, input_shape):
        rows, cols = (None if s is None else s // p for s, p in zip(input_shape[1:3], self.patch_size))
        tokens = None if rows is None or cols is None else rows * cols
        return (input_shape[0], tokens, self.hidden_size)

    def get_config(self):
        return {**super().get_config(), "hidden_size": self.hidden_size, "patch_size": list(self.patch_size)}


def _check_divisible(shape, patch_size):
    for size, patch in zip(shape[1:3], patch_size):
        if size is not None and size % patch:
            raise ValueError(
                f"input of spatial size {tuple(shape[1:3])} is not divisible by patch size "
                f"{tuple(patch_size)}; resize the images or build the model with a matching image_size."
            )
