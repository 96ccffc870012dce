"""RandAugment (Cubuk et al., 2020) as stateless TensorFlow ops: each image gets `num_ops`
operations drawn uniformly from `OPS`, every choice taken from the seed it is given, so the
pipeline's per-example seeds make it reproducible with parallel maps and exact on resume.

Images are float32 (H, W, 3) in [0, 255]. The photometric operations follow PIL's `ImageOps`
and `ImageEnhance`, with which the policy was defined; the geometric ones move the image about
its centre and fill what they uncover with grey (128), as the reference implementations do.

`strength` s in (0, 1] sets every operation at s of its largest change: rotation by 30 degrees,
shear by 0.3, translation by 0.45 of the side, colour / contrast / brightness / sharpness
factors 1 +- 0.9, solarizing from 256 (1 - s) up, posterizing to 8 - round(4s) bits. The
direction of the signed ones (rotation, shear, translation, the enhancement factors) is drawn
per operation.
"""

import math

import tensorflow as tf

OPS = (
    "identity",
    "auto_contrast",
    "equalize",
    "rotate",
    "solarize",
    "color",
    "posterize",
    "contrast",
    "brightness",
    "sharpness",
    "shear_x",
    "shear_y",
    "translate_x",
    "translate_y",
)
FILL = 128.0
MAX_ROTATION = math.pi / 6
MAX_SHEAR = 0.3
MAX_TRANSLATION = 0.45
MAX_ENHANCE = 0.9


def rand_augment(image, strength, seed, num_ops=2):
    """`image` after `num_ops` operations of `OPS` at `strength`, all drawn from `seed` (a
    stateless seed, shape [2])."""
    ops, signs = choices(seed, num_ops)
    for i in range(num_ops):
        branches = _branches(image, strength, tf.cast(signs[i], tf.float32))
        image = tf.ensure_shape(tf.switch_case(ops[i], [branches[name] for name in OPS]), image.shape)
    return image


def choices(seed, num_ops):
    """The indices into `OPS` and the directions (+-1) of an image's `num_ops` operations."""
    ops = tf.random.stateless_uniform([num_ops], seed, 0, len(OPS), dtype=tf.int32)
    signs = 2 * tf.random.stateless_uniform([num_ops], seed + 1, 0, 2, dtype=tf.int32) - 1
    return ops, signs


def _branches(image, s, sign):
    """Each operation of `OPS` on `image` at strength `s` in direction `sign`, by name, as
    branches for `tf.switch_case`."""
    size = tf.cast(tf.shape(image)[:2], tf.float32)
    enhance = 1.0 + sign * MAX_ENHANCE * s
    return {
        "identity": lambda: image,
        "auto_contrast": lambda: auto_contrast(image),
        "equalize": lambda: equalize(image),
        "rotate": lambda: rotate(image, sign * MAX_ROTATION * s),
        "solarize": lambda: solarize(image, 256.0 * (1.0 - s)),
        "color": lambda: color(image, enhance),
        "posterize": lambda: posterize(image, 8 - round(4 * s)),
        "contrast": lambda: contrast(image, enhance),
        "brightness": lambda: brightness(image, enhance),
        "sharpness": lambda: sharpness(image, enhance),
        "shear_x": lambda: shear(image, sign * MAX_SHEAR * s, 0.0),
        "shear_y": lambda: shear(image, 0.0, sign * MAX_SHEAR * s),
        "translate_x": lambda: translate(image, sign * MAX_TRANSLATION * s * size[1], 0.0),
        "translate_y": lambda: translate(image, 0.0, sign * MAX_TRANSLATION * s * size[0]),
    }


def warp(image, transform, fill_value):
    """Bilinear projective warp of one (H, W, C) image: output pixel (x, y) reads the input at
    (a0 x + a1 y + a2, b0 x + b1 y + b2), `transform` = [a0, a1, a2, b0, b1, b2, 0, 0];
    outside the input reads `fill_value`."""
    return tf.raw_ops.ImageProjectiveTransformV3(
        images=image[None],
        transforms=tf.cast(transform, tf.float32)[None],
        output_shape=tf.shape(image)[:2],
        fill_value=fill_value,
        interpolation="BILINEAR",
        fill_mode="CONSTANT",
    )[0]


def _about_centre(image, a0, a1, b0, b1, dx=0.0, dy=0.0):
    """`warp` by the linear map [[a0, a1], [b0, b1]] about the image's centre, then by (dx, dy)."""
    size = tf.cast(tf.shape(image)[:2], tf.float32)
    cy, cx = (size[0] - 1) / 2, (size[1] - 1) / 2
    ox, oy = cx + dx, cy + dy
    transform = tf.stack([a0, a1, cx - a0 * ox - a1 * oy, b0, b1, cy - b0 * ox - b1 * oy, 0.0, 0.0])
    return warp(image, transform, FILL)


def rotate(image, angle):
    """Rotation by `angle` radians about the centre (clockwise on screen for angle > 0)."""
    cos, sin = tf.cos(angle), tf.sin(angle)
    return _about_centre(image, cos, sin, -sin, cos)


def shear(image, kx, ky):
    """Shear about the centre: output (x, y) reads input (x + kx y, y + ky x), centred."""
    return _about_centre(image, 1.0, kx, ky, 1.0)


def translate(image, dx, dy):
    """The image moved by (dx, dy) pixels."""
    return _about_centre(image, 1.0, 0.0, 0.0, 1.0, dx, dy)


def _grey(image):
    """PIL's luma ("L"): 0.299 R + 0.587 G + 0.114 B, shape (H, W, 1)."""
    return tf.tensordot(image, tf.constant([0.299, 0.587, 0.114]), 1)[..., None]


def _blend(degenerate, image, factor):
    """PIL's `ImageEnhance`: `degenerate` at factor 0, `image` at 1, extrapolated beyond."""
    return tf.clip_by_value(degenerate + factor * (image - degenerate), 0.0, 255.0)


def color(image, factor):
    """Saturation: grey at factor 0 (`ImageEnhance.Color`)."""
    return _blend(_grey(image), image, factor)


def contrast(image, factor):
    """Contrast: the mean grey at factor 0 (`ImageEnhance.Contrast`)."""
    return _blend(tf.reduce_mean(_grey(image)), image, factor)


def brightness(image, factor):
    """Brightness: black at factor 0 (`ImageEnhance.Brightness`)."""
    return _blend(tf.zeros_like(image), image, factor)


def sharpness(image, factor):
    """Sharpness: PIL's 3x3 smoothing (centre 5, the rest 1, over 13) at factor 0, the border
    pixels kept (`ImageEnhance.Sharpness`)."""
    kernel = tf.constant([[1.0, 1.0, 1.0], [1.0, 5.0, 1.0], [1.0, 1.0, 1.0]]) / 13.0
    kernel = tf.tile(kernel[:, :, None, None], [1, 1, 3, 1])
    inner = tf.nn.depthwise_conv2d(image[None], kernel, [1, 1, 1, 1], "VALID")[0]
    smooth = tf.pad(inner, [[1, 1], [1, 1], [0, 0]])
    border = tf.pad(tf.zeros_like(inner), [[1, 1], [1, 1], [0, 0]], constant_values=1.0)
    return _blend(smooth + border * image, image, factor)


def solarize(image, threshold):
    """Every value at or above `threshold` inverted (`ImageOps.solarize`)."""
    return tf.where(image < threshold, image, 255.0 - image)


def _levels(image):
    """The image as integer levels 0-255, as PIL holds it."""
    return tf.cast(tf.round(tf.clip_by_value(image, 0.0, 255.0)), tf.int32)


def posterize(image, bits):
    """Each level kept to its top `bits` bits (`ImageOps.posterize`)."""
    step = 2 ** (8 - bits)
    return tf.cast(_levels(image) // step * step, tf.float32)


def auto_contrast(image):
    """Each channel stretched linearly to span 0-255; flat channels kept (`ImageOps.autocontrast`)."""
    low = tf.reduce_min(image, axis=[0, 1])
    high = tf.reduce_max(image, axis=[0, 1])
    scale = tf.where(high > low, 255.0 / tf.maximum(high - low, 1e-6), 1.0)
    offset = tf.where(high > low, low, 0.0)
    return tf.clip_by_value((image - offset) * scale, 0.0, 255.0)


def equalize(image):
    """Histogram equalization of each channel by PIL's table (`ImageOps.equalize`): level i
    maps to (step // 2 + pixels below i) // step, step = (pixels - those at the top level
    present) // 255; a channel with one level, or a step of 0, is kept."""
    levels = _levels(image)
    channels = []
    for c in range(3):
        level = levels[..., c]
        histogram = tf.math.bincount(tf.reshape(level, [-1]), minlength=256, maxlength=256)
        top = tf.gather(histogram, tf.reduce_max(level))
        step = (tf.reduce_sum(histogram) - top) // 255
        below = tf.cumsum(histogram, exclusive=True)
        table = tf.minimum((step // 2 + below) // tf.maximum(step, 1), 255)
        equalized = tf.cast(tf.gather(table, level), tf.float32)
        channels.append(tf.where(step > 0, equalized, image[..., c]))
    return tf.stack(channels, axis=-1)
