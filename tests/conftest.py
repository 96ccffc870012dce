"""Shared helpers: small configs, weight perturbation, backend markers."""

import keras_vit  # first: it asks TensorFlow for its oneDNN kernels before Keras loads it  # isort: skip

import keras
import numpy as np
import pytest


def _exact_float32_matmuls():
    """On GPUs, JAX and TensorFlow run float32 matmuls and convolutions in TF32 by default, and
    torch its cuDNN convolutions: about 1e-3 from float32 on a ViT's logits, which the parity
    tests would read as a wrong model (seen on an H100 under JAX: 2.5e-3 against the 1e-4
    bar). The tests check the float32 math, so they ask every backend for full float32."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        jax.config.update("jax_default_matmul_precision", "highest")
    elif backend == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_tensor_float_32_execution(False)
    elif backend == "torch":
        import torch

        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False


_exact_float32_matmuls()


def pytest_collection_modifyitems(config, items):
    if keras.backend.backend() == "tensorflow":
        return
    skip = pytest.mark.skip(reason=f"needs the TensorFlow backend (this run: {keras.backend.backend()})")
    for item in items:
        if "tensorflow_only" in item.keywords:
            item.add_marker(skip)


def tiny_config(**overrides):
    """A ViT small enough for fast tests: 32x32 images, 8x8 patches, width 64, 2 blocks."""
    values = dict(image_size=32, patch_size=8, hidden_size=64, num_layers=2, num_heads=4, mlp_dim=128, num_classes=7)
    return keras_vit.ViTConfig(**{**values, **overrides})


def perturb(model, seed=0, scale=0.05):
    """Moves every weight off its initial value (zero heads, unit LayerNorms, ...) so a
    dropped, swapped or mis-wired tensor changes the outputs."""
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        value = keras.ops.convert_to_numpy(weight)
        weight.assign((value + scale * rng.standard_normal(value.shape)).astype(value.dtype))
    return model


def images(batch=2, size=(32, 32), channels=3, seed=0):
    return np.random.default_rng(seed).uniform(0, 255, (batch, *size, channels)).astype("float32")


def sample_photos(size):
    """scikit-learn's bundled photos (china.jpg, flower.jpg), resized to `size` x `size`:
    real images, no download. Pixels in [0, 255], shape (2, size, size, 3)."""
    from PIL import Image
    from sklearn.datasets import load_sample_image

    photos = [
        Image.fromarray(load_sample_image(name)).resize((size, size), Image.BILINEAR)
        for name in ("china.jpg", "flower.jpg")
    ]
    return np.stack([np.asarray(p, dtype="float32") for p in photos])
