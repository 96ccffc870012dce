"""Patch embedding: cut the image into PxP patches and project each to width D."""

import keras
from keras import ops

from keras_vit import initializers
from keras_vit.dtypes import is_half
from keras_vit.layers.projection import project


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchEmbedding(keras.layers.Layer):
    """Conv2D with kernel = stride = P (the same map as flatten + Dense), then tokens.

    Input `(batch, H, W, C)`; output `(batch, H/P * W/P, hidden_size)` in row-major patch
    order. The kernel layout is HWIO, as in the official checkpoints. With `return_grid`, the
    output is `(tokens, grid)`: `grid` is a `(batch, H/P, W/P, 0)` tensor, empty, whose shape
    tells the layers after it the patch grid of images whose size is known only in the call
    (`ViTConfig.dynamic_image_size`).
    """

    def __init__(self, hidden_size, patch_size, return_grid=False, **kwargs):
        super().__init__(**kwargs)
        self.return_grid = bool(return_grid)
        self.hidden_size = int(hidden_size)
        self.patch_size = tuple(patch_size) if not isinstance(patch_size, int) else (patch_size,) * 2
        self.projection = keras.layers.Conv2D(
            self.hidden_size,
            kernel_size=self.patch_size,
            strides=self.patch_size,
            padding="valid",
            kernel_initializer=initializers.lecun_normal(),  # flax nn.Conv default, as in the reference
            dtype=self.dtype_policy,
            name="projection",
        )

    def build(self, input_shape):
        self.projection.build(input_shape)

    def call(self, images, training=None):
        _check_divisible(images.shape, self.patch_size)
        if None not in images.shape[1:] and self._as_matmul(training):
            tokens = self._project_patches(images, training)
        else:
            x = project(self.projection, images, training)
            # The token count, not -1, where it is known: PyTorch cannot infer -1 in an empty batch.
            count = x.shape[1] * x.shape[2] if None not in x.shape[1:3] else -1
            tokens = ops.reshape(x, (ops.shape(x)[0], count, self.hidden_size))
        if not self.return_grid:
            return tokens
        return tokens, images[:, :: self.patch_size[0], :: self.patch_size[1], :0]

    def _as_matmul(self, training):
        """Whether to run the projection as `_project_patches`: in inference on JAX, where XLA's
        convolution with 3 input channels and stride P ran 3-6x slower than the matmul on an H100
        (ViT-B/16 batch 256: 2.0 ms against 0.33-0.51 ms; bf16 inference +7%) and 1.3-2.5x slower
        on 2 CPU cores; and in half-precision training on TensorFlow, where oneDNN's bfloat16
        filter gradient of that convolution took about 40 ms of a ViT-Ti/16 step on 2 AMX cores
        against 6 ms for the matmul's forward and gradient. `fit` on JAX on the H100 ran 1-3%
        slower with it, float32 `fit` and inference on TensorFlow tied (LiteRT exports keep one
        CONV_2D), and torch's CPU convolution was faster; those keep the Conv2D
        (docs/performance.md)."""
        backend = keras.backend.backend()
        if backend == "jax":
            return not training
        if backend == "tensorflow" and training and is_half(self.compute_dtype):
            from keras_vit import tf_kernels

            return tf_kernels.runs_as_kernel_and_bias(self.projection)
        return False

    def _project_patches(self, images, training=None):
        """The same map as `projection`, as patches flattened in (row, col, channel) order
        times the HWIO kernel read as `(P*P*C, D)`; in TensorFlow training the bias gradient is
        summed with float32 accumulation (`keras_vit.tf_kernels.bias_add`)."""
        (rows, size_r), (cols, size_c) = ((s // p, p) for s, p in zip(images.shape[1:3], self.patch_size))
        channels = images.shape[3]
        x = ops.reshape(images, (-1, rows, size_r, cols, size_c, channels))
        x = ops.reshape(ops.transpose(x, (0, 1, 3, 2, 4, 5)), (-1, size_r * size_c * channels))
        x = ops.matmul(x, ops.reshape(self.projection.kernel, (-1, self.hidden_size)))
        if self.projection.use_bias:
            if training and keras.backend.backend() == "tensorflow":
                from keras_vit import tf_kernels

                x = tf_kernels.bias_add(x, self.projection.bias)
            else:
                x = x + self.projection.bias
        return ops.reshape(x, (-1, rows * cols, self.hidden_size))

    def compute_output_shape(self, input_shape):
        rows, cols = (None if s is None else s // p for s, p in zip(input_shape[1:3], self.patch_size))
        tokens = None if rows is None or cols is None else rows * cols
        shape = (input_shape[0], tokens, self.hidden_size)
        return (shape, (input_shape[0], rows, cols, 0)) if self.return_grid else shape

    def get_config(self):
        config = {**super().get_config(), "hidden_size": self.hidden_size, "patch_size": list(self.patch_size)}
        return {**config, "return_grid": True} if self.return_grid else config


def _check_divisible(shape, patch_size):
    for size, patch in zip(shape[1:3], patch_size):
        if size is not None and size % patch:
            raise ValueError(
                f"input of spatial size {tuple(shape[1:3])} is not divisible by patch size "
                f"{tuple(patch_size)}; resize the images or build the model with a matching image_size."
            )
