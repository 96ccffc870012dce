"""keras_vit: the Vision Transformer (Dosovitskiy et al., ICLR 2021) for Keras 3."""

from keras_vit.onednn import prefer_onednn

prefer_onednn()  # before Keras loads TensorFlow

from keras_vit import checkpoints, distribution, layers, saving
from keras_vit.checkpoints import CheckpointError, list_checkpoints, load_weights, save_npz
from keras_vit.config import ViTConfig
from keras_vit.model import ViT, ViTFeatures, count_params
from keras_vit.presets import describe_preset, get_config, list_presets
from keras_vit.resample import resample_position_embeddings

__version__ = "0.2.0"

__all__ = [
    "CheckpointError",
    "checkpoints",
    "distribution",
    "list_checkpoints",
    "load_weights",
    "save_npz",
    "saving",
    "ViT",
    "ViTFeatures",
    "ViTConfig",
    "count_params",
    "describe_preset",
    "get_config",
    "layers",
    "list_presets",
    "resample_position_embeddings",
]
