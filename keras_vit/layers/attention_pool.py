"""Multi-head attention pooling (the "MAP" head of SigLIP and big_vision): a learned probe reads
the tokens with multi-head attention, followed by a residual LayerNorm-MLP."""

import keras
from keras import ops

from keras_vit import initializers
from keras_vit.layers.layer_normalization import LayerNormalization
from keras_vit.layers.mlp import MLP


@keras.saving.register_keras_serializable(package="keras_vit")
class AttentionPool(keras.layers.Layer):
    """`(batch, N, D)` tokens -> `(batch, D)`: a learned `(1, 1, D)` probe is the query of a
    multi-head attention over the tokens after the first `num_prefix_tokens` (query Dense `query`,
    fused key/value Dense `key_value` laid out `[k | v]`, output Dense `out`), then
    `x + MLP(LayerNorm(x))`. The softmax runs in float32."""

    def __init__(
        self, num_heads, mlp_dim, num_prefix_tokens=0, layer_norm_epsilon=1e-6, gelu_approximate=False, **kwargs
    ):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.mlp_dim = int(mlp_dim)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.gelu_approximate = bool(gelu_approximate)

    def build(self, input_shape):
        width = input_shape[-1]
        if width % self.num_heads:
            raise ValueError(f"width {width} is not divisible by num_heads={self.num_heads}.")
        self.head_dim = width // self.num_heads
        policy = self.dtype_policy
        self.probe = self.add_weight(
            name="probe", shape=(1, 1, width), initializer=initializers.RandomNormal(stddev=width**-0.5)
        )
        dense = dict(kernel_initializer=initializers.glorot_uniform(), dtype=policy)
        self.query = keras.layers.Dense(width, name="query", **dense)
        self.key_value = keras.layers.Dense(2 * width, name="key_value", **dense)
        self.out = keras.layers.Dense(width, name="out", **dense)
        for layer, fan_in in ((self.query, width), (self.key_value, width), (self.out, width)):
            layer.build((None, fan_in))
        self.norm = LayerNormalization(epsilon=self.layer_norm_epsilon, dtype=policy, name="norm")
        self.norm.build((None, 1, width))
        self.mlp = MLP(self.mlp_dim, gelu_approximate=self.gelu_approximate, dtype=policy, name="mlp")
        self.mlp.build((None, 1, width))

    def call(self, tokens, training=None):
        tokens = tokens[:, self.num_prefix_tokens :]
        width, heads, head_dim = tokens.shape[-1], self.num_heads, self.head_dim
        batch, length = ops.shape(tokens)[0], ops.shape(tokens)[1]
        q = self.query(ops.cast(ops.reshape(self.probe, (1, width)), tokens.dtype))  # (1, D)
        q = ops.reshape(q * ops.cast(head_dim**-0.5, q.dtype), (1, heads, 1, head_dim))
        kv = self.key_value(ops.reshape(tokens, (-1, width)))
        kv = ops.transpose(ops.reshape(kv, (batch, length, 2, heads, head_dim)), (2, 0, 3, 1, 4))
        k, v = kv[0], kv[1]  # (batch, heads, N, head_dim)
        logits = ops.matmul(ops.broadcast_to(q, (batch, heads, 1, head_dim)), ops.swapaxes(k, -1, -2))
        probs = ops.cast(ops.softmax(ops.cast(logits, "float32"), axis=-1), v.dtype)
        context = ops.reshape(ops.matmul(probs, v), (batch, width))  # one query: heads side by side
        x = self.out(context)
        x = ops.expand_dims(x, 1)
        x = x + self.mlp(self.norm(x), training=training)
        return x[:, 0]

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "mlp_dim": self.mlp_dim,
            "num_prefix_tokens": self.num_prefix_tokens,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "gelu_approximate": self.gelu_approximate,
        }
