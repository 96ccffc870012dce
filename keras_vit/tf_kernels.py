"""Kernels for TensorFlow training: the exact GELU and LayerNorm, forward and gradient each one
XLA kernel.

In TensorFlow's graph mode (how `fit` trains on a CPU, see docs/training.md) these run one Eigen
kernel per op otherwise: about ten passes over fc1's output for the GELU and its gradient, and
more for a LayerNorm's. ViT-Ti/16's GELU on (6304, 768) bf16 activations took 17-20 ms a block
that way and 8.3 ms as two XLA kernels (2 Zen 4 cores; docs/benchmarks.md). Each computes in
float32 and returns its input's dtype. Inference keeps Keras's ops: TensorFlow's graph optimizer
fuses the GELU into fc1's oneDNN kernel, and exports need the plain ops. Imported only on the
TensorFlow backend.
"""

import math

import tensorflow as tf

from keras_vit.layers.layer_normalization import centred_normalize
from keras_vit.layers.mlp import normal_cdf

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


@tf.function(jit_compile=True, autograph=False)
def _gelu_forward(x):
    x32 = tf.cast(x, tf.float32)
    return tf.cast(x32 * normal_cdf(x32), x.dtype)


@tf.function(jit_compile=True, autograph=False)
def _gelu_gradient(x, dy):
    # d/dx x * Phi(x) = Phi(x) + x * phi(x)
    x32 = tf.cast(x, tf.float32)
    pdf = tf.exp(-0.5 * x32 * x32) * _INV_SQRT_2PI
    return tf.cast(tf.cast(dy, tf.float32) * (normal_cdf(x32) + x32 * pdf), x.dtype)


@tf.custom_gradient
def gelu(x):
    """Exact GELU, `x * Phi(x)`, with its gradient."""
    return _gelu_forward(x), lambda dy: _gelu_gradient(x, dy)


@tf.function(jit_compile=True, autograph=False)
def _layer_norm_forward(x, gamma, beta, epsilon):
    return tf.cast(centred_normalize(x, -1, epsilon) * gamma + beta, x.dtype)


@tf.function(jit_compile=True, autograph=False)
def _layer_norm_gradient(x, gamma, epsilon, dy):
    (normalized, rstd), dy = centred_normalize(x, -1, epsilon, return_rstd=True), tf.cast(dy, tf.float32)
    g = dy * gamma
    mean_g, mean_gn = (tf.reduce_mean(t, axis=-1, keepdims=True) for t in (g, g * normalized))
    dx = rstd * (g - mean_g - normalized * mean_gn)
    outer = list(range(len(x.shape) - 1))
    return tf.cast(dx, x.dtype), tf.reduce_sum(dy * normalized, axis=outer), tf.reduce_sum(dy, axis=outer)


def layer_norm(x, gamma, beta, epsilon):
    """LayerNorm over the last axis, `(x - mean) * rsqrt(var + epsilon) * gamma + beta`, with its
    gradients to `x`, `gamma` and `beta` (float32 tensors, e.g. read from the variables)."""
    epsilon = tf.constant(epsilon, tf.float32)

    @tf.custom_gradient
    def forward(x, gamma, beta):
        gradient = lambda dy: (*_layer_norm_gradient(x, gamma, epsilon, dy),)  # noqa: E731
        return _layer_norm_forward(x, gamma, beta, epsilon), gradient

    return forward(x, gamma, beta)
