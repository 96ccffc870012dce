"""Multi-head self-attention with a fused query/key/value projection."""

import functools

import keras
import numpy as np
from keras import ops

from keras_vit import initializers
from keras_vit.dtypes import is_half
from keras_vit.layers import frozen_graph
from keras_vit.layers.projection import project, project_tokens
from keras_vit.layers.rotary import RotaryEmbedding


@keras.saving.register_keras_serializable(package="keras_vit")
class MultiHeadSelfAttention(keras.layers.Layer):
    """MSA of the paper: softmax(q k^T / sqrt(d)) v over all tokens, then an output Dense.

    Query, key and value come from one Dense of width 3D (one matmul instead of three);
    its kernel is `[q | k | v]` along the last axis, each `(D, heads * head_dim)` in the
    official `(D, heads, head_dim)` order. The projections run on the tokens flattened to
    `(batch * tokens, D)`. On JAX and PyTorch the attention itself is
    `keras.ops.dot_product_attention` (cuDNN / SDPA fused kernels); on TensorFlow, and
    whenever probabilities are asked for or attention dropout is active, it is written out
    heads-first with the softmax in float32 (except in bfloat16 inference on TensorFlow
    without returned probabilities where that is exact, see `_explicit_attention`). In a frozen
    half-precision TensorFlow graph q, k and v are projected heads-first (`_heads_first_qkv`).

    `key_bias=False` (with `use_bias`): query and value biases only, `qv_bias` `(2D,)` (EVA-02).
    `rope`: a `RotaryEmbedding` config (dict) that rotates the queries and keys of the patch
    tokens (EVA-02, DINOv3); `grid` in the call: the patch grid of images whose size is known only
    in the call (see `RotaryEmbedding`).

    Call with `return_attention_scores=True` to also get the probabilities
    `(batch, heads, tokens, tokens)`.
    """

    def __init__(self, num_heads, dropout_rate=0.0, use_bias=True, key_bias=True, rope=None, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.dropout_rate = float(dropout_rate)
        self.use_bias = bool(use_bias)
        self.key_bias = bool(key_bias)
        self.rope = None if rope is None else dict(rope)
        self.dropout = keras.layers.Dropout(self.dropout_rate, dtype=self.dtype_policy)
        self.rotary = None if rope is None else RotaryEmbedding(**self.rope, dtype=self.dtype_policy, name="rotary")

    def build(self, input_shape):
        width = input_shape[-1]
        if width % self.num_heads:
            raise ValueError(f"width {width} is not divisible by num_heads={self.num_heads}.")
        self.head_dim = width // self.num_heads
        self.qkv = keras.layers.Dense(
            3 * width,
            use_bias=self.use_bias and self.key_bias,
            # Xavier-uniform of each (D, D) projection: fan_avg of the fused (D, 3D) kernel
            # is 2D, so scale 2 gives the per-projection limit sqrt(6 / (D + D)).
            kernel_initializer=initializers.VarianceScaling(2.0, "fan_avg", "uniform"),
            dtype=self.dtype_policy,
            name="qkv",
        )
        self.qkv.build((None, width))
        self.qv_bias = (
            self.add_weight(name="qv_bias", shape=(2 * width,), initializer="zeros")
            if self.use_bias and not self.key_bias
            else None
        )
        if self.rotary is not None:
            self.rotary.build((None, self.num_heads, None, self.head_dim))
        self.out = keras.layers.Dense(
            width, kernel_initializer=initializers.glorot_uniform(), dtype=self.dtype_policy, name="out"
        )
        self.out.build((None, width))
        # Checked here, eagerly, because `_explicit_attention` may run inside a traced function.
        self._bf16_softmax_without_casts = (
            keras.backend.backend() == "tensorflow"
            and self.compute_dtype == "bfloat16"
            and _bf16_softmax_is_float32_rounded()
        )

    def call(self, x, training=None, return_attention_scores=False, grid=None):
        shape, width = ops.shape(x), x.shape[-1]
        if self._heads_first_projections(x, training, return_attention_scores):
            q, k, v = self._heads_first_qkv(x)
            q, k = self._rotated(q, k, 2, grid)  # a rotation commutes with q's scale
            context, probs = self._explicit_attention(q, k, v, training, False)
        else:
            # Rank-2 projections: TensorFlow's graph optimizer fuses MatMul + bias (oneDNN) only
            # for rank-2 matmuls; a rank-3 Dense runs as Tensordot + a separate broadcast add.
            qkv = project(self.qkv, ops.reshape(x, (-1, width)), training)
            if self.qv_bias is not None:
                qkv = qkv + self._qkv_bias(qkv.dtype)
            qkv = ops.reshape(qkv, (-1, shape[1], 3, self.num_heads, self.head_dim))
            explicit = return_attention_scores or (training and self.dropout_rate > 0)
            if explicit or keras.backend.backend() == "tensorflow" or _float16_on_jax_cpu(x):
                # TensorFlow: Keras's dot_product_attention is two einsums token-first, with the
                # scale on the (tokens x tokens) logits; heads-first with the scale on q measured
                # 10-15% faster per block on CPU (docs/performance.md).
                q, k, v = ops.unstack(ops.transpose(qkv, (2, 0, 3, 1, 4)), axis=0)  # (batch, heads, tokens, head_dim)
                q, k = self._rotated(q, k, 2, grid)
                q = q * ops.cast(self.head_dim**-0.5, q.dtype)
                context, probs = self._explicit_attention(q, k, v, training, return_attention_scores)
            else:
                q, k, v = ops.unstack(qkv, axis=2)  # (batch, tokens, heads, head_dim) each
                q, k = self._rotated(q, k, 1, grid)
                context, probs = _fused_attention(q, k, v, training), None
        out = ops.reshape(project_tokens(self.out, ops.reshape(context, (-1, width)), training), shape)
        return (out, probs) if return_attention_scores else out

    def _heads_first_projections(self, x, training, return_probs):
        """Whether q, k and v come from `_heads_first_qkv`: in a frozen half-precision TensorFlow
        graph (`frozen_graph.half_inference`), without returned probabilities."""
        return (
            frozen_graph.half_inference(x, training)
            and keras.backend.backend() == "tensorflow"
            and not return_probs
            and len(x.shape) == 3
            and self.qkv.quantization_mode is None
        )

    def _heads_first_qkv(self, x):
        """q (scaled), k and v `(batch, heads, tokens, head_dim)` of tokens `x`, each as one batch
        matmul of `(batch, 1, tokens, D)` by the heads' `(1, heads, D, head_dim)` weights with its
        bias, which TensorFlow fuses into the matmul. This skips the transpose of the fused
        `(tokens, 3D)` projection to heads-first, and as batch matmuls the projections run on
        all threads where a rank-2 MatMul that fits the L2 cache runs on one
        (`projection.project_tokens`); ViT-S/16 bf16 on 2 AMX Xeon cores: 0.5-7% of a batch of
        32, 3-13% of a batch of 1 (docs/performance.md). The weights are
        re-laid out and the query's scale folded into them on constants, which TensorFlow's
        optimizer folds once. The numbers are those of the fused projection where the scale is
        a power of two (head_dim 4, 16, 64, 256); otherwise q's weights are rounded once more."""
        dtype, heads, head_dim = x.dtype, self.num_heads, self.head_dim
        kernel = ops.reshape(ops.cast(self.qkv.kernel, dtype), (-1, 3, heads, head_dim))
        wq, wk, wv = ops.unstack(ops.transpose(kernel, (1, 2, 0, 3)), axis=0)  # (heads, D, head_dim) each
        scale = ops.cast(head_dim**-0.5, dtype)
        tokens = ops.expand_dims(x, 1)
        q, k, v = (ops.matmul(tokens, ops.expand_dims(w, 0)) for w in (wq * scale, wk, wv))
        if self.use_bias:  # (1, heads, 1, head_dim) each
            bq, bk, bv = ops.unstack(ops.reshape(self._qkv_bias(dtype), (3, 1, heads, 1, head_dim)), axis=0)
            q, k, v = q + bq * scale, k + bk, v + bv
        return q, k, v

    def _qkv_bias(self, dtype):
        """The `(3D,)` bias `[q | k | v]`: the fused Dense's, or the query and value biases around
        a zero key bias."""
        if self.qv_bias is None:
            return ops.cast(self.qkv.bias, dtype)
        bq, bv = ops.split(ops.cast(self.qv_bias, dtype), 2)
        return ops.concatenate([bq, ops.zeros_like(bq), bv])

    def _rotated(self, q, k, token_axis, grid=None):
        if self.rotary is None:
            return q, k
        return self.rotary(q, token_axis=token_axis, grid=grid), self.rotary(k, token_axis=token_axis, grid=grid)

    def _explicit_attention(self, q, k, v, training, return_probs):
        """(context (batch, tokens, heads, head_dim), probabilities) of heads-first q (scaled), k
        and v; the probabilities are float32 when `return_probs`."""
        logits = ops.einsum("bhqd,bhkd->bhqk", q, k)
        # Softmax in float32 for fp16/bf16 safety, except in bfloat16 on TensorFlow when the
        # probabilities stay inside and TensorFlow's bf16 softmax kernel equals the float32 one
        # rounded to bf16 (bit for bit on AVX-512 CPUs; checked once per process), which is what
        # the product with v reads: there the two casts only cost time (inference: S/16 +3%,
        # B/16 +2%; training also computes the gradient in float32, docs/performance.md).
        if return_probs or not self._bf16_softmax_without_casts:
            probs = ops.softmax(ops.cast(logits, "float32"), axis=-1)
        elif training:  # its gradient in float32 as one XLA kernel, without casts around it
            from keras_vit import tf_kernels

            probs = tf_kernels.softmax(logits)
        else:
            probs = ops.softmax(logits, axis=-1)
        # A batched matmul, then the swap to token-first: TensorFlow's graph optimizer turns the
        # einsum above into a batch matmul but left this one (token-first output) an einsum,
        # whose gradients ran ~35% slower than batch matmuls on CPU. `fit`: +0-5% (Ti/16 and
        # CIFAR-size, docs/performance.md).
        context = ops.matmul(ops.cast(self.dropout(probs, training=training), v.dtype), v)
        return ops.swapaxes(context, 1, 2), probs

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "dropout_rate": self.dropout_rate,
            "use_bias": self.use_bias,
            "key_bias": self.key_bias,
            "rope": self.rope,
        }


def _fused_attention(q, k, v, training):
    """`keras.ops.dot_product_attention` of (batch, tokens, heads, head_dim) tensors; for
    half-precision training on a JAX GPU with an odd token count, `jax_attention.padded_attention`
    (JAX's cuDNN flash attention refuses odd lengths in training, and Keras would fall back to
    XLA's attention). float32 has no cuDNN flash attention; it stays as it is."""
    tokens = q.shape[1]
    if not (training and is_half(q.dtype) and tokens is not None and tokens % 2 and _on_jax_gpu()):
        return ops.dot_product_attention(q, k, v)
    from keras_vit import jax_attention

    return jax_attention.padded_attention(q, k, v)


_BF16_SOFTMAX_EXACT = []  # the answer of _bf16_softmax_is_float32_rounded, once known


def _bf16_softmax_is_float32_rounded():
    """Whether the backend's bfloat16 softmax gives the float32 softmax rounded to bf16, on 16
    rows of 197 logits: True with TensorFlow on AVX-512 CPUs; False on AVX2-only ones, whose
    Eigen kernel differed in about half the values by 1-2 bf16 steps (docs/performance.md).
    False, and not remembered, where the ops cannot run eagerly (inside a trace)."""
    if not _BF16_SOFTMAX_EXACT:
        logits = ops.cast(np.random.default_rng(0).standard_normal((16, 197)).astype("float32") * 4, "bfloat16")
        as_float = lambda t: ops.convert_to_numpy(ops.cast(t, "float32"))  # noqa: E731
        try:
            direct, rounded = (
                as_float(ops.softmax(logits)),
                as_float(ops.cast(ops.softmax(as_float(logits)), "bfloat16")),
            )
        except (TypeError, ValueError, NotImplementedError, AttributeError):  # symbolic tensors
            return False
        _BF16_SOFTMAX_EXACT.append(bool(np.array_equal(direct, rounded)))
    return _BF16_SOFTMAX_EXACT[0]


def _float16_on_jax_cpu(x):
    """Whether this is float16 on a JAX CPU, where Keras's attention (float32 logits of float16
    q and k) fails to compile: XLA:CPU has no float16 x float16 -> float32 dot
    (`F16_F16_F32 is not supported by dot_general on CPU`); the explicit attention's are float16."""
    return x.dtype == "float16" and keras.backend.backend() == "jax" and not _on_jax_gpu()


@functools.cache
def _on_jax_gpu():
    return keras.backend.backend() == "jax" and any(d.startswith("gpu") for d in keras.distribution.list_devices())
