"""Reading images for the command line (Pillow; any format it decodes), from files or URLs."""

import collections
import io
import logging
import os
import warnings
from pathlib import Path

from keras_vit_cli.names import names


def load_image(path, transform=None, sample="china.jpg", channels=3):
    """Returns (pixels `(H, W, channels)`, description): uint8 as decoded, or through `transform`
    (a model's `image_transform`: float32 at the model's size) when given. `channels`: 3 (RGB)
    or 1 (grayscale, for a model built with `channels=1`).

    Without `path`, the photo `sample` bundled with scikit-learn is used (no download)."""
    from PIL import Image, UnidentifiedImageError

    if path is None:
        try:
            from sklearn.datasets import load_sample_image
        except ImportError:
            raise ValueError("no --image given and scikit-learn (with its bundled photos) is not installed.") from None
        image, source = Image.fromarray(load_sample_image(sample)), f"scikit-learn's {sample}"
    else:
        if is_url(path):
            file = io.BytesIO(download(path))
        elif Path(path).is_symlink() and not Path(path).exists():
            raise ValueError(f"cannot read image {path}: a link to nothing ({os.readlink(path)})")
        elif not Path(path).is_file():
            raise FileNotFoundError(f"image file not found: {path}")
        elif Path(path).stat().st_size == 0:
            raise ValueError(f"cannot read image {path}: an empty file (0 bytes)")
        else:
            file = path
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", Image.DecompressionBombWarning)
                image, source = Image.open(file), str(path)
                image.load()
            for warning in caught:  # Pillow's one as a line of ours, others as they were
                if not issubclass(warning.category, Image.DecompressionBombWarning):
                    warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
            if any(issubclass(w.category, Image.DecompressionBombWarning) for w in caught):
                logging.getLogger("keras_vit").warning(
                    "keras_vit: %s has %s pixels, over Pillow's decompression-bomb warning limit; read all the same",
                    path,
                    f"{image.width * image.height:,}",
                )
        except UnidentifiedImageError:
            raise ValueError(f"cannot read image {path}: not an image format Pillow reads") from None
        except (OSError, Image.DecompressionBombError) as error:  # truncated or corrupt; too many pixels
            raise ValueError(f"cannot read image {path}: {error}") from None
    from keras_vit.transform import pillow_pixels, to_channels  # imports Keras

    pixels = pillow_pixels(image)  # grayscale, CMYK, palette, RGBA, 16-bit -> RGB as training reads them
    if channels != 3:
        pixels = to_channels(pixels, channels)
    if transform is not None:
        import keras

        pixels = keras.ops.convert_to_numpy(transform(pixels))
    return pixels, source


def is_url(path):
    """Whether an image argument is an http(s) URL rather than a file."""
    return isinstance(path, str) and path.lower().startswith(("http://", "https://"))


def download(url, timeout=30.0, limit=64 << 20):
    """The bytes at `url` (at most `limit`); one-line errors for what the network refuses."""
    import urllib.error
    import urllib.request

    from keras_vit_cli import installed_version

    request = urllib.request.Request(url, headers={"User-Agent": f"keras-vit/{installed_version()}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            data = response.read(limit + 1)
    except urllib.error.HTTPError as error:
        raise ValueError(f"cannot download {url}: HTTP {error.code} {error.reason}") from None
    except OSError as error:  # URLError (no such host, refused), timeouts
        raise ValueError(f"cannot download {url}: {getattr(error, 'reason', error)}") from None
    if len(data) > limit:
        raise ValueError(f"cannot read {url}: larger than {limit >> 20} MiB")
    return data


def encoded_image(path, pixels):
    """An image file's bytes for TensorFlow's decoder (`keras_vit.tf_images.decode_image`, as in a
    SavedModel's bytes signature): the file itself where that decoder reads it as Pillow does
    (`_served_as_is`), else (other files, and URLs, which are not fetched twice) `pixels` encoded
    as PNG."""
    if not is_url(path) and _served_as_is(path):
        return Path(path).read_bytes()
    return png_bytes(pixels)


def _served_as_is(path):
    """Whether TensorFlow decodes the file at `path` to the pixels Pillow gives: JPEG, PNG, GIF, a
    still WebP and a 24- or 32-bit BMP. Not palette BMPs, which SavedModels exported before the
    decoder read their colour table took for gray, nor animated WebP, TIFF and the other formats
    Pillow alone reads, whatever their file names say."""
    from PIL import Image

    with Image.open(path) as image:
        if image.format in ("JPEG", "MPO", "PNG", "GIF"):
            return True
        if image.format == "WEBP":
            return not getattr(image, "is_animated", False)
    if image.format == "BMP":
        with open(path, "rb") as file:
            header = file.read(34)
        return len(header) == 34 and int.from_bytes(header[28:30], "little") in (24, 32)
    return False


def png_bytes(pixels):
    """uint8 pixels `(H, W, 3)` encoded as PNG (lossless: decoded, the same pixels)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def folder_images(folder):
    """The image files a folder argument stands for, sorted: those in it and its sub-folders whose
    suffix is one of `names.IMAGE_EXTENSIONS`, hidden ones (a name starting with a dot) left out,
    links followed, as training lists its class folders (`keras_vit.folders`). A link to nothing
    is listed: reading it says so. Files in `names.UNREAD_IMAGE_EXTENSIONS` are left out with a
    warning that counts them."""
    from keras_vit.folders import walk  # here: `keras_vit` imports Keras, which --help does not need

    found, unread = [], collections.Counter()
    for root, files in walk(folder):
        for name in files:
            path = Path(root, name)
            suffix = path.suffix.lower()
            if not name.startswith(".") and suffix in names.UNREAD_IMAGE_EXTENSIONS:
                unread[suffix] += 1
            elif not name.startswith(".") and suffix in names.IMAGE_EXTENSIONS:
                if path.is_file() or (path.is_symlink() and not path.exists()):  # not a FIFO or socket
                    found.append(path)
    if unread:
        logging.getLogger("keras_vit").warning(
            names.UNREAD_IMAGES_WARNING,
            sum(unread.values()),
            folder,
            ", ".join(sorted(unread)),
        )
    return sorted(found)


def image_files(arguments, folders=True):
    """`(path, in_folder)` for each image argument: a file or an http(s) URL as given, a folder as
    the files in it and its sub-folders whose suffix is one of `names.IMAGE_EXTENSIONS`, sorted
    (hidden ones left out).
    Raises FileNotFoundError, naming the first, for arguments that do not exist and folders
    without images, and IsADirectoryError for any folder when `folders` is False."""
    files = []
    for given in arguments:
        if is_url(given):
            files.append((given, False))
            continue
        argument = Path(given)
        if argument.is_dir() and not folders:
            raise IsADirectoryError(f"{given} is a folder: name its image files")
        if argument.is_dir():
            found = folder_images(argument)
            if not found:
                raise FileNotFoundError(f"{argument} holds no images ({', '.join(names.IMAGE_EXTENSIONS)}).")
            files += [(path, True) for path in found]
        elif argument.is_file():
            files.append((argument, False))
        else:
            raise FileNotFoundError(f"image file not found: {argument}")
    return files
