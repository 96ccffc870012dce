"""The encoder block's MLP: Dense(mlp_dim) - GELU - Dropout - Dense(D) - Dropout."""

import math

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class MLP(keras.layers.Layer):
    """Two Dense layers with GELU between, dropout after each (official init:
    Xavier-uniform kernels, biases ~ N(0, 1e-6))."""

    def __init__(self, mlp_dim, dropout_rate=0.0, gelu_approximate=False, **kwargs):
        super().__init__(**kwargs)
        self.mlp_dim = int(mlp_dim)
        self.dropout_rate = float(dropout_rate)
        self.gelu_approximate = bool(gelu_approximate)
        self.dropout = keras.layers.Dropout(self.dropout_rate, dtype=self.dtype_policy)

    def build(self, input_shape):
        dense = dict(
            kernel_initializer="glorot_uniform",
            bias_initializer=keras.initializers.RandomNormal(stddev=1e-6),
            dtype=self.dtype_policy,
        )
        self.fc1 = keras.layers.Dense(self.mlp_dim, name="fc1", **dense)
        self.fc2 = keras.layers.Dense(input_shape[-1], name="fc2", **dense)
        self.fc1.build((None, input_shape[-1]))
        self.fc2.build((None, self.mlp_dim))

    def call(self, x, training=None):
        shape = ops.shape(x)
        # Rank 2: TensorFlow's graph optimizer then fuses MatMul + bias + GELU into one oneDNN
        # kernel (fc1 of ViT-S/16 at batch 32: 49 ms instead of 66 ms on 2 CPU cores).
        x = ops.reshape(x, (-1, shape[-1]))
        x = self.dropout(self._gelu(self.fc1(x), training), training=training)
        return ops.reshape(self.dropout(self.fc2(x), training=training), shape)

    def _gelu(self, x, training):
        if training and not self.gelu_approximate and keras.backend.backend() == "tensorflow":
            # The same exact GELU written with erf, for training on TensorFlow only: TF's GELU
            # uses erfc, whose bfloat16 kernel is ~6x slower than erf's (29 vs 4.5 ms on a Ti/16
            # fc1 output, 2 cores), and training cannot fuse it into fc1 anyway (its gradient
            # needs the pre-activation). mixed_bfloat16 Ti/16 `fit`: +15% (docs/benchmarks.md).
            # Inference keeps `gelu`, which the graph optimizer fuses into the fc1 matmul.
            return x * (0.5 + 0.5 * ops.erf(x * math.sqrt(0.5)))
        return keras.activations.gelu(x, approximate=self.gelu_approximate)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "mlp_dim": self.mlp_dim,
            "dropout_rate": self.dropout_rate,
            "gelu_approximate": self.gelu_approximate,
        }
