"""The image transform: how an image of any size becomes a model's input."""

import keras
import numpy as np

from keras_vit.names import EVAL_CROP, INTERPOLATIONS, LUMA_SCALE, LUMA_WEIGHTS


class ImageTransform:
    """Resizes an image so that its centre `crop` fraction becomes `size` (height, width), then
    crops that centre (`crop=1`: resize only), with `interpolation`; float32 pixels in [0, 255]
    out (the model normalises them itself).

    Takes one image `(H, W, C)` or a batch, of any dtype. Built from Keras preprocessing layers,
    it runs eagerly on every backend and inside `tf.data` or a `tf.function` (the training
    pipelines, the SavedModel's bytes signature) whatever the backend. `ImageTransform.of(config)`
    is a model's own: its `ViTConfig` holds the crop fraction and interpolation it was evaluated
    with.
    """

    def __init__(self, size, crop=EVAL_CROP, interpolation="bilinear"):
        self.size = (size, size) if isinstance(size, int) else tuple(int(s) for s in size)
        self.crop = float(crop)
        self.interpolation = interpolation
        if not 0.0 < self.crop <= 1.0:
            raise ValueError(f"the crop fraction must be in (0, 1]; got {crop}.")
        if interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {INTERPOLATIONS}; got {interpolation!r}.")
        resized = self.size if self.crop == 1.0 else tuple(int(round(s / self.crop)) for s in self.size)
        self._layers = [
            keras.layers.Rescaling(1.0, dtype="float32"),  # any dtype -> float32, before resizing rounds
            keras.layers.Resizing(*resized, interpolation=interpolation, dtype="float32"),
        ]
        if resized != self.size:
            self._layers.append(keras.layers.CenterCrop(*self.size, dtype="float32"))

    @classmethod
    def of(cls, config):
        """The transform of a model with this `ViTConfig`."""
        return cls(config.image_size, config.crop_fraction, config.interpolation)

    def __call__(self, images):
        rank = getattr(getattr(images, "shape", None), "rank", None) or len(getattr(images, "shape", ()) or ()) or None
        if rank is not None and rank not in (3, 4):
            raise ValueError(
                f"an image is (height, width, channels) and a batch (batch, height, width, channels); got shape "
                f"{tuple(images.shape)} (a grayscale image takes a channel axis: image[..., None])."
            )
        for layer in self._layers:
            images = layer(images)
        return images

    def __repr__(self):
        return f"ImageTransform(size={self.size}, crop={self.crop}, interpolation={self.interpolation!r})"


# Pillow's 16-bit grayscale modes.
SIXTEEN_BIT_MODES = ("I;16", "I;16B", "I;16L", "I;16N")


def pillow_pixels(image):
    """A Pillow image's pixels as uint8 RGB `(H, W, 3)`, as the training pipelines decode its
    file: grayscale, CMYK, palette and RGBA converted by Pillow, 16-bit images by their high byte
    (Pillow's own conversion clips at 255, which turns 16-bit grayscale images white)."""
    from PIL import Image

    if image.mode in SIXTEEN_BIT_MODES:
        image = Image.fromarray((np.asarray(image).astype(np.int64).clip(0, 65535) >> 8).astype(np.uint8))
    return np.asarray(image.convert("RGB"), dtype=np.uint8)


def to_channels(image, channels):
    """An image `(H, W, C)` (or `(H, W)`) or batch as `channels` channels: RGB to grayscale with
    Pillow's integer luma for integer pixels (`Image.convert("L")`, value for value) and its
    weights in float arithmetic for float ones; grayscale repeated to RGB; other
    combinations are returned as they are, for the model to refuse."""
    image = np.asarray(image)
    if image.ndim == 2:  # grayscale without a channel axis
        image = image[..., None]
    if image.shape[-1] == 3 and channels == 1:
        if np.issubdtype(image.dtype, np.floating):  # gray pixels (R = G = B) stay themselves to float rounding
            return (image @ np.asarray(LUMA_WEIGHTS, image.dtype) / LUMA_SCALE)[..., None].astype(image.dtype)
        luma = image.astype(np.int64) @ np.asarray(LUMA_WEIGHTS, np.int64)
        return ((luma + LUMA_SCALE // 2) // LUMA_SCALE).astype(image.dtype)[..., None]
    if image.shape[-1] == 1 and channels == 3:
        return np.repeat(image, 3, axis=-1)
    return image
