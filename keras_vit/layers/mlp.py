"""The encoder block's MLP: Dense(mlp_dim) - GELU - Dropout - Dense(D) - Dropout."""

import math

import keras
from keras import ops

from keras_vit import initializers
from keras_vit.layers.layer_normalization import LayerNormalization
from keras_vit.layers.projection import project


def normal_cdf(x):
    """Phi(x), the standard normal CDF, as `0.5 + 0.5 * erf(x / sqrt(2))`; the exact GELU is `x * Phi(x)`."""
    return 0.5 + 0.5 * ops.erf(x * math.sqrt(0.5))


@keras.saving.register_keras_serializable(package="keras_vit")
class MLP(keras.layers.Layer):
    """Two Dense layers with GELU between, dropout after each (official init:
    Xavier-uniform kernels, biases ~ N(0, 1e-6)).

    `gated=True`: SwiGLU, `SiLU(x W_gate) * x W_value` of width `mlp_dim` from one `fc1` of width
    `2 * mlp_dim` laid out `[gate | value]`. `norm=True`: a LayerNorm (`norm`, epsilon
    `layer_norm_epsilon`) on the hidden activations before `fc2` (EVA-02's sub-LayerNorm)."""

    def __init__(
        self,
        mlp_dim,
        dropout_rate=0.0,
        gelu_approximate=False,
        gated=False,
        norm=False,
        layer_norm_epsilon=1e-6,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.mlp_dim = int(mlp_dim)
        self.dropout_rate = float(dropout_rate)
        self.gelu_approximate = bool(gelu_approximate)
        self.gated = bool(gated)
        self.norm = bool(norm)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.dropout = keras.layers.Dropout(self.dropout_rate, dtype=self.dtype_policy)

    def build(self, input_shape):
        # One kernel initializer per layer: an instance draws the same values at every call. The
        # N(0, 1e-6) biases share one (fc2's are fc1's first values): a new one would change the
        # weights of every seeded run.
        dense = dict(bias_initializer=initializers.RandomNormal(stddev=1e-6), dtype=self.dtype_policy)
        kernel = initializers.glorot_uniform
        width = 2 * self.mlp_dim if self.gated else self.mlp_dim
        self.fc1 = keras.layers.Dense(width, kernel_initializer=kernel(), name="fc1", **dense)
        self.fc2 = keras.layers.Dense(input_shape[-1], kernel_initializer=kernel(), name="fc2", **dense)
        self.fc1.build((None, input_shape[-1]))
        self.fc2.build((None, self.mlp_dim))
        self.hidden_norm = None
        if self.norm:
            self.hidden_norm = LayerNormalization(epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name="norm")
            self.hidden_norm.build((None, self.mlp_dim))

    def call(self, x, training=None):
        shape = ops.shape(x)
        # Rank 2: TensorFlow's graph optimizer then fuses MatMul + bias + GELU into one oneDNN
        # kernel (fc1 of ViT-S/16 at batch 32: 49 ms instead of 66 ms on 2 CPU cores).
        x = ops.reshape(x, (-1, shape[-1]))
        if self.gated or self.norm:
            x = project(self.fc1, x, training)
            if self.gated:
                gate, value = ops.split(x, 2, axis=-1)
                x = ops.silu(gate) * value
            else:
                x = self._gelu(x)
            if self.hidden_norm is not None:
                x = self.hidden_norm(x)
        elif training and keras.backend.backend() == "tensorflow" and not self.gelu_approximate:
            from keras_vit import tf_kernels  # fc1's bias add + exact GELU as one XLA kernel

            x = tf_kernels.project(self.fc1, x, gelu=True)
        else:
            x = self._gelu(project(self.fc1, x, training))
        x = project(self.fc2, self.dropout(x, training=training), training)
        return ops.reshape(self.dropout(x, training=training), shape)

    def _gelu(self, x):
        if keras.backend.backend() == "tensorflow":
            # TensorFlow (inference) keeps `gelu`, which its graph optimizer fuses into fc1.
            from keras_vit import tf_predict

            return tf_predict.gelu_after_projection(x, self.gelu_approximate)
        if self.gelu_approximate:
            return keras.activations.gelu(x, approximate=True)
        # The same exact GELU written with erf. TF's and JAX's exact `gelu` use erfc, which
        # costs a second polynomial branch and an exp: TF's bfloat16 erfc kernel ran ~6x
        # slower than erf's (Ti/16 fc1 output, 2 CPU cores; mixed_bfloat16 `fit` +15%), and
        # on an H100 under JAX the erfc fusion took 0.49 ms of a 2.3 ms ViT-B/16 block
        # (batch 256, bf16 inference). Numbers in docs/performance.md.
        return x * normal_cdf(x)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "mlp_dim": self.mlp_dim,
            "dropout_rate": self.dropout_rate,
            "gelu_approximate": self.gelu_approximate,
            "gated": self.gated,
            "norm": self.norm,
            "layer_norm_epsilon": self.layer_norm_epsilon,
        }
