"""keras_vit: the Vision Transformer (Dosovitskiy et al., ICLR 2021) for Keras 3."""

from keras_vit import layers
from keras_vit.config import ViTConfig
from keras_vit.model import ViT, count_params
from keras_vit.presets import describe_preset, get_config, list_presets
from keras_vit.resample import resample_position_embeddings

__version__ = "0.1.0"

__all__ = [
    "ViT",
    "ViTConfig",
    "count_params",
    "describe_preset",
    "get_config",
    "layers",
    "list_presets",
    "resample_position_embeddings",
]
