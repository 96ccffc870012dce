"""Layer normalisation; on TensorFlow written as `(x - mean) * rsqrt(var + eps)`, the form that quantises."""

import keras
from keras import ops

from keras_vit.dtypes import is_half
from keras_vit.layers import frozen_graph


def centred_normalize(x, axis, epsilon, return_rstd=False):
    """`(x - mean) * rsqrt(var + epsilon)` over `axis`, in float32 for half-precision `x`: the
    form that maps onto quantisable TFLite builtins (keras_vit's Layer and GroupNormalization).
    With `return_rstd`, also the `rsqrt(var + epsilon)` (the LayerNorm gradient needs it)."""
    if is_half(x.dtype):
        x = ops.cast(x, "float32")
    centred = x - ops.mean(x, axis=axis, keepdims=True)
    # `centred * centred`, not `square`: the converter fuses sub + square into
    # SQUARED_DIFFERENCE, which LiteRT cannot run on int16 (int16x8 mode).
    rstd = ops.rsqrt(ops.mean(centred * centred, axis=axis, keepdims=True) + epsilon)
    return (centred * rstd, rstd) if return_rstd else centred * rstd


@keras.saving.register_keras_serializable(package="keras_vit")
class LayerNormalization(keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization` (same weights, config and outputs to float rounding)
    computed from the centred input on TensorFlow.

    Keras's kernel folds the mean into the offset (`x * s + (beta - mean * s)`), which the
    TFLite converter lowers to a float `NEG` that full-integer int8 and int16x8 quantisation
    cannot convert; on TensorFlow, where models are exported, centring first maps onto
    quantisable builtin ops only. On JAX and PyTorch the layer runs Keras's kernel (PyTorch's
    fused `layer_norm`; on JAX XLA's reduction fusions, which ran ViT-S/16 bfloat16 inference
    7% faster than the centred form's on an H200, docs/performance.md); in a frozen TensorFlow graph
    (`keras_vit.tf_predict`) oneDNN's LayerNorm kernel. Half-precision inputs
    are normalised in float32 either way. The class keeps Keras's name so `.keras` files store
    its weights under the same key.
    """

    def _affine_over_last_axis(self, inputs):
        # the form the fused kernels below take: scale and offset, normalised over the last axis
        return self.scale and self.center and self.axis in ([-1], [len(inputs.shape) - 1])

    def call(self, inputs, training=None):
        if self.rms_scaling or keras.backend.backend() != "tensorflow":
            return super().call(inputs)
        if training and self._affine_over_last_axis(inputs):
            from keras_vit import tf_kernels  # the forward and its gradients as one XLA kernel each

            gamma, beta = (ops.cast(w, "float32") for w in (self.gamma, self.beta))
            return ops.cast(tf_kernels.layer_norm(inputs, gamma, beta, self.epsilon), self.compute_dtype)
        if (
            frozen_graph.half_inference(inputs, training)
            and len(inputs.shape) in (2, 3)
            and self._affine_over_last_axis(inputs)
        ):
            from keras_vit import tf_predict  # one oneDNN kernel in a frozen graph

            return ops.cast(tf_predict.layer_norm(inputs, self.gamma, self.beta, self.epsilon), self.compute_dtype)
        y = centred_normalize(inputs, self.axis, self.epsilon)
        if self.scale:
            y = y * ops.cast(self.gamma, y.dtype)
        if self.center:
            y = y + ops.cast(self.beta, y.dtype)
        return ops.cast(y, self.compute_dtype)
