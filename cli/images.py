"""Reading images for the command line (Pillow; any format it decodes)."""

from pathlib import Path

import numpy as np


def load_image(path, size, sample="china.jpg"):
    """Returns (uint8 array `(H, W, 3)` resized to `size` = (H, W) unless None, description).

    Without `path`, the photo `sample` bundled with scikit-learn is used (no download)."""
    from PIL import Image, UnidentifiedImageError

    if path is None:
        try:
            from sklearn.datasets import load_sample_image
        except ImportError:
            raise ValueError("no --image given and scikit-learn (with its bundled photos) is not installed.") from None
        image, source = Image.fromarray(load_sample_image(sample)), f"scikit-learn's {sample}"
    else:
        if not Path(path).is_file():
            raise FileNotFoundError(f"image file not found: {path}")
        try:
            image, source = Image.open(path), str(path)
            image.load()
        except (UnidentifiedImageError, OSError) as error:
            raise ValueError(f"cannot read image {path}: {error}") from None
    image = image.convert("RGB")  # grayscale, CMYK, palette, RGBA -> RGB
    if size is not None:
        image = image.resize((size[1], size[0]), Image.BILINEAR)
    return np.asarray(image, dtype=np.uint8), source
