"""Multi-head self-attention with a fused query/key/value projection."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class MultiHeadSelfAttention(keras.layers.Layer):
    """MSA of the paper: softmax(q k^T / sqrt(d)) v over all tokens, then an output Dense.

    Query, key and value come from one Dense of width 3D (one matmul instead of three);
    its kernel is `[q | k | v]` along the last axis, each `(D, heads * head_dim)` in the
    official `(D, heads, head_dim)` order. The fast path is
    `keras.ops.dot_product_attention` (fused kernels where the backend has them); the
    explicit path runs when attention probabilities are asked for or attention dropout
    is active, and computes the softmax in float32.

    Call with `return_attention_scores=True` to also get the probabilities
    `(batch, heads, tokens, tokens)`.
    """

    def __init__(self, num_heads, dropout_rate=0.0, use_bias=True, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.dropout_rate = float(dropout_rate)
        self.use_bias = bool(use_bias)
        self.dropout = keras.layers.Dropout(self.dropout_rate, dtype=self.dtype_policy)

    def build(self, input_shape):
        width = input_shape[-1]
        if width % self.num_heads:
            raise ValueError(f"width {width} is not divisible by num_heads={self.num_heads}.")
        self.head_dim = width // self.num_heads
        self.qkv = keras.layers.Dense(
            3 * width,
            use_bias=self.use_bias,
            # Xavier-uniform of each (D, D) projection: fan_avg of the fused (D, 3D) kernel
            # is 2D, so scale 2 gives the per-projection limit sqrt(6 / (D + D)).
            kernel_initializer=keras.initializers.VarianceScaling(2.0, "fan_avg", "uniform"),
            dtype=self.dtype_policy,
            name="qkv",
        )
        self.qkv.build(input_shape)
        self.out = keras.layers.Dense(
            width, kernel_initializer="glorot_uniform", dtype=self.dtype_policy, name="out"
        )
        self.out.build(tuple(input_shape[:-1]) + (width,))

    def call(self, x, training=None, return_attention_scores=False):
        tokens, width = ops.shape(x)[1], x.shape[-1]
        qkv = ops.reshape(self.qkv(x), (-1, tokens, 3, self.num_heads, self.head_dim))
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # (batch, tokens, heads, head_dim)
        use_dropout = training and self.dropout_rate > 0
        if return_attention_scores or use_dropout:
            context, probs = self._explicit_attention(q, k, v, training)
        else:
            context, probs = ops.dot_product_attention(q, k, v), None
        out = self.out(ops.reshape(context, (-1, tokens, width)))
        return (out, probs) if return_attention_scores else out

    def _explicit_attention(self, q, k, v, training):
        scale = 1.0 / float(self.head_dim) ** 0.5
        logits = ops.einsum("bqhd,bkhd->bhqk", q, k) * ops.cast(scale, q.dtype)
        probs = ops.softmax(ops.cast(logits, "float32"), axis=-1)  # float32 for fp16/bf16 safety
        context = ops.einsum("bhqk,bkhd->bqhd", ops.cast(self.dropout(probs, training=training), v.dtype), v)
        return context, probs

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "dropout_rate": self.dropout_rate,
            "use_bias": self.use_bias,
        }
