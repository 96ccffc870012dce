"""TensorFlow training kernels: the projections' bias gradients (Dense and the patch embedding;
in bfloat16 on AMX CPUs their bias adds too, `_bias_add_fuses`), fc1's bias add + exact GELU
and the LayerNorm (forward and gradient each one XLA kernel), and the bfloat16 attention
softmax's gradient (one XLA kernel).

In TensorFlow's graph mode (how `fit` trains on a CPU, see docs/training.md) these run one Eigen
kernel per op otherwise: about ten passes over fc1's output for the GELU and its gradient, and
more for a LayerNorm's. ViT-Ti/16's GELU on (6304, 768) bf16 activations took 17-20 ms a block
that way and 8.3 ms as two XLA kernels (2 Zen 4 cores; docs/performance.md). Each computes in
float32 and returns its input's dtype. Inference keeps Keras's ops: TensorFlow's graph optimizer
fuses the GELU into fc1's oneDNN kernel, and exports need the plain ops. Imported only on the
TensorFlow backend.
"""

import math

import keras
import tensorflow as tf
from keras.activations import linear

from keras_vit import cpu
from keras_vit.layers.layer_normalization import centred_normalize
from keras_vit.layers.mlp import normal_cdf

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def project(layer, x, gelu=False):
    """`layer(x)` of a `keras.layers.Dense` or channels-last convolution with a bias, then the
    exact GELU if `gelu`, for training: the bias gradient is summed with float32 accumulation.
    TensorFlow's CPU `BiasAddGrad`, which Keras's bias add gets (fused into the convolution's
    filter gradient there), sums bfloat16 in bfloat16: errors of 47 on sums of about 65 over the
    6304 rows of a ViT-Ti/16 batch (docs/models.md). With `gelu` the bias add and the GELU are
    one XLA kernel, forward and gradient. A layer with LoRA, a quantized kernel or an
    activation runs its own call."""
    if not runs_as_kernel_and_bias(layer):
        y = layer(x)
        return keras.activations.gelu(y, approximate=False) if gelu else y
    # the caller's autocast scope gives the kernel in x's dtype
    if isinstance(layer, keras.layers.Dense):
        y = keras.ops.matmul(x, layer.kernel)
    else:
        y = layer.convolution_op(x, layer.kernel)
    if layer.bias is None:
        return keras.activations.gelu(y, approximate=False) if gelu else y
    return _bias_gelu(y, tf.convert_to_tensor(layer.bias)) if gelu else bias_add(y, layer.bias)


def runs_as_kernel_and_bias(layer):
    """Whether `layer` (a Dense or convolution) is its kernel and bias alone: channels-last, no
    activation, no LoRA, not quantized."""
    plain = getattr(layer, "data_format", "channels_last") == "channels_last" and layer.activation is linear
    return plain and not getattr(layer, "lora_enabled", False) and not getattr(layer, "quantization_mode", None)


def bias_add(x, bias):
    """`x + bias` (a variable or tensor) over the last axis, the bias gradient summed with
    float32 accumulation."""
    return _bias_add(x, tf.convert_to_tensor(bias))  # a tensor: no variables inside


@tf.custom_gradient
def _bias_add(x, bias):
    # Its gradient a reduce_sum, whose CPU kernel accumulates bfloat16 in float32 (and ran 1.1 ms
    # against BiasAddGrad's 2.1 on (6304, 576) bf16, 2 Zen 4 cores).
    y = tf.nn.bias_add(x, bias) if _bias_add_fuses(x) else _separate_bias_add(x, bias)
    return y, lambda dy: (dy, tf.reduce_sum(dy, axis=list(range(len(dy.shape) - 1))))


def _bias_add_fuses(x):
    """Whether the bias add is a BiasAdd, which oneDNN fuses into the MatMul before it. Not for
    bfloat16 on a CPU with AMX-BF16: TensorFlow gives that fused op on variable weights to
    oneDNN's `gemm:jit` inner product, which leaves the AMX tiles unused, where a plain MatMul
    runs oneDNN's AMX `brg_matmul` (ViT-Ti/16 bf16 `fit` 1.06x on 2 AMX cores with the add as a
    kernel of its own; without AMX the separate add took the gain back, docs/performance.md)."""
    return x.dtype != tf.bfloat16 or "amx_bf16" not in (cpu.cpu_flags() or ())


@tf.function(jit_compile=True, autograph=False)
def _separate_bias_add(x, bias):
    return x + bias


@tf.function(jit_compile=True, autograph=False)
def _bias_gelu_forward(x, bias):
    x32 = tf.cast(x, tf.float32) + tf.cast(bias, tf.float32)
    return tf.cast(x32 * normal_cdf(x32), x.dtype)


@tf.function(jit_compile=True, autograph=False)
def _bias_gelu_gradient(x, bias, dy):
    # d/dx x * Phi(x) = Phi(x) + x * phi(x); the bias gradient sums it over the rows
    x32 = tf.cast(x, tf.float32) + tf.cast(bias, tf.float32)
    pdf = tf.exp(-0.5 * x32 * x32) * _INV_SQRT_2PI
    dx = tf.cast(dy, tf.float32) * (normal_cdf(x32) + x32 * pdf)
    return tf.cast(dx, x.dtype), tf.cast(tf.reduce_sum(dx, axis=list(range(len(x.shape) - 1))), bias.dtype)


@tf.custom_gradient
def _bias_gelu(x, bias):
    """Exact GELU of `x + bias`, `y * Phi(y)` computed in float32, with its gradients."""
    return _bias_gelu_forward(x, bias), lambda dy: _bias_gelu_gradient(x, bias, dy)


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


@tf.function(jit_compile=True, autograph=False)
def _softmax_gradient(y, dy):
    # d softmax: y * (dy - sum(y * dy)), in float32
    y, dy_y = tf.cast(y, tf.float32), tf.cast(y, tf.float32) * tf.cast(dy, tf.float32)
    return tf.cast(dy_y - y * tf.reduce_sum(dy_y, axis=-1, keepdims=True), dy.dtype)


@tf.custom_gradient
def softmax(logits):
    """Softmax over the last axis in the logits' dtype (oneDNN's kernel), its gradient computed
    in float32 from the probabilities as one XLA kernel. For bfloat16 logits where TensorFlow's
    bf16 softmax equals the float32 one rounded (see `attention.py`): no casts around it."""
    probs = tf.nn.softmax(logits)
    return probs, lambda dy: _softmax_gradient(probs, dy)
