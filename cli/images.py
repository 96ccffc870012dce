"""Reading images for the command line (Pillow; any format it decodes)."""

from pathlib import Path

import numpy as np

from keras_vit_cli.names import names

# Pillow's modes of 16-bit grayscale images (PNG, TIFF).
SIXTEEN_BIT_MODES = ("I;16", "I;16B", "I;16L", "I;16N")


def load_image(path, transform=None, sample="china.jpg"):
    """Returns (pixels `(H, W, 3)`, description): uint8 as decoded, or through `transform` (a
    model's `image_transform`: float32 at the model's size) when given.

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
    if image.mode in SIXTEEN_BIT_MODES:
        # As TensorFlow's decoders (training, the SavedModel) read them: the high byte. Pillow's
        # own conversion clips at 255, which turned 16-bit grayscale images white.
        image = Image.fromarray((np.asarray(image).astype(np.int64).clip(0, 65535) >> 8).astype(np.uint8))
    pixels = np.asarray(image.convert("RGB"), dtype=np.uint8)  # grayscale, CMYK, palette, RGBA -> RGB
    if transform is not None:
        import keras

        pixels = keras.ops.convert_to_numpy(transform(pixels))
    return pixels, source


def encoded_image(path, pixels):
    """An image file's bytes for a decoder that reads `names.IMAGE_EXTENSIONS` (TensorFlow's, as in
    a SavedModel's bytes signature): the file itself, else `pixels` encoded as PNG."""
    if Path(path).suffix.lower() in names.IMAGE_EXTENSIONS:
        return Path(path).read_bytes()
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def image_files(arguments):
    """`(path, in_folder)` for each image argument: a file as given, a folder as the files in it and
    its sub-folders whose suffix is one of `names.IMAGE_EXTENSIONS`, sorted. Raises
    FileNotFoundError, naming the first, for arguments that do not exist and folders without images."""
    files = []
    for argument in map(Path, arguments):
        if argument.is_dir():
            found = sorted(p for p in argument.rglob("*") if p.suffix.lower() in names.IMAGE_EXTENSIONS and p.is_file())
            if not found:
                raise FileNotFoundError(f"{argument} holds no images ({', '.join(names.IMAGE_EXTENSIONS)}).")
            files += [(path, True) for path in found]
        elif argument.is_file():
            files.append((argument, False))
        else:
            raise FileNotFoundError(f"image file not found: {argument}")
    return files
