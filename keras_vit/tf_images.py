"""Image files to pixels in TensorFlow ops: what training's tf.data pipelines and an exported
SavedModel's bytes signature run, so that both read a file as `keras-vit predict` (Pillow) does,
RGB or, for a model built with `channels=1`, Pillow's grayscale of it. TensorFlow only: imported by
`keras_vit.training` and `keras_vit.export`."""

import tensorflow as tf

from keras_vit.names import JPEG_DCT_METHOD, LUMA_SCALE, LUMA_WEIGHTS

# BITMAPINFOHEADER and its later versions (40 bytes or more) describe a BMP's palette and pixels
# at these offsets; the OS/2 12-byte header is left to TensorFlow's decoder.
_BMP_HEADER_BYTES = 54
_BMP_PALETTE_BITS = (1, 4, 8)


def decode_image(data):
    """An encoded image (a scalar string) -> uint8 RGB `(H, W, 3)`: JPEG (with `JPEG_DCT_METHOD`,
    as Pillow decodes it), PNG, GIF (its first frame), WebP and BMP; grayscale, palette, RGBA and
    16-bit images become RGB (16 bits scaled to 8). A palette BMP (1, 4 or 8 bits per pixel,
    uncompressed) is looked up in its colour table, which TensorFlow's own BMP decoder ignores
    (it returned the 8-bit indices as gray levels and refused 1- and 4-bit files)."""
    image = tf.case(
        [
            (tf.io.is_jpeg(data), lambda: tf.io.decode_jpeg(data, channels=3, dct_method=JPEG_DCT_METHOD)),
            (_is_palette_bmp(data), lambda: _decode_palette_bmp(data)),
        ],
        default=lambda: tf.io.decode_image(data, channels=3, expand_animations=False),
    )
    image.set_shape([None, None, 3])
    return image


def to_channels(image, channels):
    """An RGB image or batch (`(..., 3)`) as `channels` channels, as `keras_vit.transform.to_channels`
    does in NumPy: 1 is Pillow's integer luma of uint8 pixels (`Image.convert("L")`, value for
    value), the same weights in float arithmetic for float pixels (gray ones, R = G = B, stay
    themselves to float rounding); 3 returns the image as it is."""
    if channels == 3:
        return image
    if channels != 1:
        raise ValueError(f"images convert to 1 (grayscale) or 3 (RGB) channels; the model has {channels}.")
    weights = tf.constant(LUMA_WEIGHTS, tf.int32)
    if image.dtype.is_floating:
        return tf.reduce_sum(image * tf.cast(weights, image.dtype), axis=-1, keepdims=True) / LUMA_SCALE
    luma = tf.reduce_sum(tf.cast(image, tf.int32) * weights, axis=-1, keepdims=True)
    return tf.cast((luma + LUMA_SCALE // 2) // LUMA_SCALE, image.dtype)


def _header(data):
    """The first `_BMP_HEADER_BYTES` bytes of `data` as int64, zero-padded when it is shorter."""
    padded = tf.strings.join([tf.strings.substr(data, 0, _BMP_HEADER_BYTES), b"\0" * _BMP_HEADER_BYTES])
    return tf.cast(tf.io.decode_raw(tf.strings.substr(padded, 0, _BMP_HEADER_BYTES), tf.uint8), tf.int64)


def _field(header, offset, size, signed=False):
    """A little-endian integer of `size` bytes at `offset` of the header."""
    value = tf.reduce_sum(header[offset : offset + size] * (256 ** tf.range(size, dtype=tf.int64)))
    return tf.where(value >= 2 ** (8 * size - 1), value - 2 ** (8 * size), value) if signed else value


def _is_palette_bmp(data):
    header = _header(data)
    return (
        tf.equal(tf.strings.substr(data, 0, 2), b"BM")
        & (_field(header, 14, 4) >= 40)  # the header size
        & tf.reduce_any(tf.equal(_field(header, 28, 2), _BMP_PALETTE_BITS))  # bits per pixel
        & tf.equal(_field(header, 30, 4), 0)  # no compression
    )


def _decode_palette_bmp(data):
    header = _header(data)
    bits, width, height = _field(header, 28, 2), _field(header, 18, 4, signed=True), _field(header, 22, 4, signed=True)
    colours = _field(header, 46, 4)
    colours = tf.where(colours > 0, tf.minimum(colours, 2**bits), 2**bits)
    table = tf.io.decode_raw(tf.strings.substr(data, 14 + _field(header, 14, 4), 4 * colours), tf.uint8)
    rgb = tf.reverse(tf.reshape(table, (-1, 4))[:, :3], axis=[1])  # stored blue, green, red, 0
    rows, row_bytes = tf.abs(height), (width * bits + 31) // 32 * 4  # rows padded to 4 bytes
    packed = tf.io.decode_raw(tf.strings.substr(data, _field(header, 10, 4), rows * row_bytes), tf.uint8)
    packed = tf.reshape(tf.cast(packed, tf.int64), tf.stack([rows, row_bytes, 1]))
    shifts = tf.range(8 - bits, -1, -bits)  # the first pixel of a byte in its high bits
    index = tf.bitwise.bitwise_and(tf.bitwise.right_shift(packed, shifts), 2**bits - 1)
    index = tf.reshape(index, tf.stack([rows, -1]))[:, :width]
    index = tf.cond(height > 0, lambda: tf.reverse(index, axis=[0]), lambda: index)  # stored bottom row first
    return tf.gather(rgb, tf.minimum(index, tf.shape(rgb, out_type=tf.int64)[0] - 1))
