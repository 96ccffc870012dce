"""A block's Dense or convolution applied to its input, with TensorFlow training's bias gradients,
the attention's Dense layers in a frozen half-precision graph, and empty batches on TensorFlow."""

import keras
from keras import ops

from keras_vit.layers import frozen_graph


def project(layer, x, training):
    """`layer(x)`; in training on TensorFlow through `keras_vit.tf_kernels.project`, which sums
    the bias gradient with float32 accumulation (TensorFlow's CPU `BiasAddGrad` sums bfloat16
    in bfloat16). An empty batch gives `empty_output`."""
    if is_empty_on_tensorflow(x):
        return empty_output(layer, x)
    if training and keras.backend.backend() == "tensorflow":
        from keras_vit import tf_kernels

        return tf_kernels.project(layer, x)
    return layer(x)


def project_tokens(layer, x, training):
    """`project` for the attention's output Dense on rank-2 tokens. In a frozen half-precision
    graph (`frozen_graph.half_inference`) it is a batch matmul of one matrix plus the bias, the same
    numbers bit for bit: TensorFlow runs a MatMul whose operands fit in the L2 cache on one
    thread (its oneDNN integration's heuristic: 2 bytes x (m n + k (m + n)) under the L2 size),
    which at ViT-S/16 batch 1 is every projection, and a BatchMatMul on all threads (ViT-S/16
    and B/16 batch 1 on 2 AMX Xeon cores: 3-8% of the batch with q/k/v as batch matmuls too,
    nothing at batch 32; docs/performance.md). The MLP keeps its MatMul, into which oneDNN fuses
    the bias and the GELU. Quantized layers (`quantize`) keep their own call."""
    if not (frozen_graph.half_inference(x, training) and len(x.shape) == 2 and layer.quantization_mode is None):
        return project(layer, x, training)
    kernel = ops.cast(layer.kernel, x.dtype)
    y = ops.squeeze(ops.matmul(ops.expand_dims(x, 0), ops.expand_dims(kernel, 0)), 0)
    return y + ops.cast(layer.bias, x.dtype) if layer.use_bias else y


def is_empty_on_tensorflow(x):
    """Whether `x` is a batch of no examples (its first dimension 0 where it is known) on the
    TensorFlow backend, whose oneDNN convolution (TensorFlow 2.21 on AVX-512 CPUs) returns its
    input's shape for an empty batch: the bias add after it failed, a bias-free one went on
    with the wrong shape."""
    return x.shape[0] == 0 and keras.backend.backend() == "tensorflow"


def empty_output(layer, x):
    """What `layer` gives for the empty batch `x`: zeros of its output shape."""
    return ops.zeros(layer.compute_output_shape(x.shape), layer.compute_dtype)
