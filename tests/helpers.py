"""Helpers the tests import: a tiny config, weight perturbation, images."""

import os

import keras
import numpy as np

import keras_vit


def tiny_config(**overrides):
    """A ViT small enough for fast tests: 32x32 images, 8x8 patches, width 64, 2 blocks."""
    values = dict(image_size=32, patch_size=8, hidden_size=64, num_layers=2, num_heads=4, mlp_dim=128, num_classes=7)
    return keras_vit.ViTConfig(**{**values, **overrides})


def perturb(model, seed=0, scale=0.05):
    """Moves every weight off its initial value (zero heads, unit LayerNorms, ...) so a
    dropped, swapped or mis-wired tensor changes the outputs; integer buffers (keras-hub's
    position ids) are left as they are."""
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        value = keras.ops.convert_to_numpy(weight)
        if value.dtype.kind in "iub":
            continue
        weight.assign((value + scale * rng.standard_normal(value.shape)).astype(value.dtype))
    return model


def images(batch=2, size=(32, 32), channels=3, seed=0):
    return np.random.default_rng(seed).uniform(0, 255, (batch, *size, channels)).astype("float32")


def sample_photos(size):
    """scikit-learn's bundled photos (china.jpg, flower.jpg), resized to `size` (an int, or
    (height, width)): real images, no download. Pixels in [0, 255], shape (2, height, width, 3)."""
    from PIL import Image
    from sklearn.datasets import load_sample_image

    height, width = (size, size) if isinstance(size, int) else size
    photos = [
        Image.fromarray(load_sample_image(name)).resize((width, height), Image.BILINEAR)
        for name in ("china.jpg", "flower.jpg")
    ]
    return np.stack([np.asarray(p, dtype="float32") for p in photos])


def write_image_folder(root, counts, size=8, seed=0):
    """An image-folder dataset at `root`: for each `(class name, count)` of `counts`, that many
    random `size` x `size` RGB images `0.png`, `1.png`, ... in `root/NAME/`. Returns `root`."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for name, count in counts:
        (root / name).mkdir(parents=True)
        for i in range(count):
            Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(root / name / f"{i}.png")
    return root


def hf_vit_config(**overrides):
    """A small Hugging Face `transformers.ViTConfig` (width 48 in 3 heads, MLP 96, one block, 32x32
    images in 16x16 patches), `overrides` replacing its fields. Import transformers (or skip) first."""
    import transformers

    values = dict(
        hidden_size=48, num_hidden_layers=1, num_attention_heads=3, intermediate_size=96, image_size=32, patch_size=16
    )
    return transformers.ViTConfig(**{**values, **overrides})


def perturbed_torch(module, seed=0):
    """A torch reference `module` with every parameter moved off its initial value (as `perturb`
    does for keras_vit models), in eval mode. Import torch (or skip) first."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    return module.eval()


def max_diff(model, expected, pixels):
    """The largest absolute difference between `model(pixels)` and a reference's `expected` outputs."""
    return float(np.abs(keras.ops.convert_to_numpy(model(pixels)) - expected).max())


def jax_devices_env(devices, base=None):
    """The environment of a fresh JAX process on `devices` virtual CPU devices: `base` (default
    os.environ, less TF_USE_LEGACY_KERAS) with the device count added to its XLA_FLAGS, so the
    test run's own XLA flags (dev.py's) reach the process too."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k != "TF_USE_LEGACY_KERAS"}
    flags = env.get("XLA_FLAGS", "").split()
    flags = [f for f in flags if not f.startswith("--xla_force_host_platform_device_count=")]
    env.update(KERAS_BACKEND="jax", XLA_FLAGS=" ".join([*flags, f"--xla_force_host_platform_device_count={devices}"]))
    return env
