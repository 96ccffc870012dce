"""One pre-norm Transformer encoder block: z' = z + MSA(LN(z)); z = z' + MLP(LN(z'))."""

import keras

from keras_vit.layers.attention import MultiHeadSelfAttention
from keras_vit.layers.drop_path import DropPath
from keras_vit.layers.layer_normalization import LayerNormalization
from keras_vit.layers.layer_scale import LayerScale
from keras_vit.layers.mlp import MLP
from keras_vit.names import MLP_TYPES


@keras.saving.register_keras_serializable(package="keras_vit")
class EncoderBlock(keras.layers.Layer):
    """Pre-norm block with optional LayerScale and stochastic depth on both branches; the
    attention's and MLP's options (`key_bias`, `rope`, `mlp_type`, `mlp_norm`) as in
    `MultiHeadSelfAttention` and `MLP`.

    Call with `return_attention_scores=True` to get `(tokens, attention_probabilities)`.
    """

    def __init__(
        self,
        num_heads,
        mlp_dim,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        drop_path_rate=0.0,
        layer_scale_init=None,
        layer_norm_epsilon=1e-6,
        gelu_approximate=False,
        qkv_bias=True,
        key_bias=True,
        mlp_type="gelu",
        mlp_norm=False,
        rope=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.mlp_dim = int(mlp_dim)
        self.dropout_rate = float(dropout_rate)
        self.attention_dropout_rate = float(attention_dropout_rate)
        self.drop_path_rate = float(drop_path_rate)
        self.layer_scale_init = layer_scale_init
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.gelu_approximate = bool(gelu_approximate)
        self.qkv_bias = bool(qkv_bias)
        self.key_bias = bool(key_bias)
        if mlp_type not in MLP_TYPES:
            raise ValueError(f"mlp_type must be one of {MLP_TYPES}; got {mlp_type!r}.")
        self.mlp_type = mlp_type
        self.mlp_norm = bool(mlp_norm)
        self.rope = None if rope is None else dict(rope)
        policy = self.dtype_policy
        self.norm1 = LayerNormalization(epsilon=self.layer_norm_epsilon, dtype=policy, name="norm1")
        self.attention = MultiHeadSelfAttention(
            self.num_heads,
            self.attention_dropout_rate,
            self.qkv_bias,
            key_bias=self.key_bias,
            rope=self.rope,
            dtype=policy,
            name="attention",
        )
        self.attention_dropout = keras.layers.Dropout(self.dropout_rate, dtype=policy)
        self.norm2 = LayerNormalization(epsilon=self.layer_norm_epsilon, dtype=policy, name="norm2")
        self.mlp = MLP(
            self.mlp_dim,
            self.dropout_rate,
            self.gelu_approximate,
            gated=mlp_type == "swiglu",
            norm=self.mlp_norm,
            layer_norm_epsilon=self.layer_norm_epsilon,
            dtype=policy,
            name="mlp",
        )
        self.drop_path = DropPath(self.drop_path_rate, dtype=policy)
        if layer_scale_init is None:
            self.scale1 = self.scale2 = None
        else:
            self.scale1 = LayerScale(layer_scale_init, dtype=policy, name="scale1")
            self.scale2 = LayerScale(layer_scale_init, dtype=policy, name="scale2")

    def build(self, input_shape):
        for layer in (self.norm1, self.attention, self.norm2, self.mlp, self.drop_path):
            layer.build(input_shape)
        for layer in (self.scale1, self.scale2):
            if layer is not None:
                layer.build(input_shape)

    def call(self, x, training=None, return_attention_scores=False, grid=None):
        y = self.attention(self.norm1(x), training=training, return_attention_scores=return_attention_scores, grid=grid)
        y, probs = y if return_attention_scores else (y, None)
        x = x + self._branch(self.attention_dropout(y, training=training), self.scale1, training)
        x = x + self._branch(self.mlp(self.norm2(x), training=training), self.scale2, training)
        return (x, probs) if return_attention_scores else x

    def compute_output_spec(self, x, training=None, return_attention_scores=False, grid=None):
        # Given, not traced: tracing a call with unknown sizes would give the tokens and `grid`
        # unrelated placeholder sizes.
        out = keras.KerasTensor(x.shape, self.compute_dtype)
        if not return_attention_scores:
            return out
        return out, keras.KerasTensor((x.shape[0], self.num_heads, x.shape[1], x.shape[1]), "float32")

    def _branch(self, y, scale, training):
        if scale is not None:
            y = scale(y)
        return self.drop_path(y, training=training)

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "mlp_dim": self.mlp_dim,
            "dropout_rate": self.dropout_rate,
            "attention_dropout_rate": self.attention_dropout_rate,
            "drop_path_rate": self.drop_path_rate,
            "layer_scale_init": self.layer_scale_init,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "gelu_approximate": self.gelu_approximate,
            "qkv_bias": self.qkv_bias,
            "key_bias": self.key_bias,
            "mlp_type": self.mlp_type,
            "mlp_norm": self.mlp_norm,
            "rope": self.rope,
        }
