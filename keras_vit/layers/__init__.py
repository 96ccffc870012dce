"""Keras 3 layers of the Vision Transformer (backend-agnostic, all serialisable)."""

from keras_vit.layers.attention import MultiHeadSelfAttention
from keras_vit.layers.attention_pool import AttentionPool
from keras_vit.layers.class_token import ClassToken
from keras_vit.layers.drop_path import DropPath
from keras_vit.layers.encoder_block import EncoderBlock
from keras_vit.layers.group_normalization import GroupNormalization
from keras_vit.layers.layer_normalization import LayerNormalization
from keras_vit.layers.layer_scale import LayerScale
from keras_vit.layers.mlp import MLP
from keras_vit.layers.normalization import ImageNormalization
from keras_vit.layers.patch_embedding import PatchEmbedding
from keras_vit.layers.pooling import TokenPooling
from keras_vit.layers.position_embedding import PositionEmbedding
from keras_vit.layers.register_tokens import RegisterTokens
from keras_vit.layers.resnet import BottleneckUnit, ResNetStem, StdConv2D
from keras_vit.layers.rotary import RotaryEmbedding
from keras_vit.layers.token_grid import MergeTokenGrid, TokenGrid

__all__ = [
    "AttentionPool",
    "BottleneckUnit",
    "ClassToken",
    "DropPath",
    "EncoderBlock",
    "GroupNormalization",
    "ImageNormalization",
    "LayerNormalization",
    "LayerScale",
    "MergeTokenGrid",
    "MLP",
    "MultiHeadSelfAttention",
    "PatchEmbedding",
    "PositionEmbedding",
    "RegisterTokens",
    "ResNetStem",
    "RotaryEmbedding",
    "StdConv2D",
    "TokenGrid",
    "TokenPooling",
]
