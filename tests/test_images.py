"""Image files read alike by TensorFlow (training's tf.data, a SavedModel's bytes signature:
`keras_vit.tf_images`) and by Pillow (`keras-vit predict`, visualize, inspect: `cli/images.py`)."""

import io
import struct

import numpy as np
import pytest
from PIL import Image

pytestmark = pytest.mark.tensorflow_only

RNG = np.random.default_rng(0)
PHOTO = Image.fromarray(RNG.integers(0, 256, (9, 13, 3), dtype=np.uint8))


def encoded(image, format, **options):
    buffer = io.BytesIO()
    image.save(buffer, format=format, **options)
    return buffer.getvalue()


def four_bit_bmp(index, palette, top_down=False):
    """A 4-bit palette BMP (Pillow writes none): `index` (H, W) into `palette` (N, 3) RGB."""
    height, width = index.shape
    row_bytes = (width * 4 + 31) // 32 * 4
    rows = []
    for row in index if top_down else index[::-1]:  # bottom row first unless the height is negative
        nibbles = np.zeros(2 * row_bytes, np.uint8)
        nibbles[:width] = row
        rows.append((nibbles[0::2] << 4 | nibbles[1::2]).astype(np.uint8).tobytes())
    table = b"".join(bytes([b, g, r, 0]) for r, g, b in palette)
    pixels = b"".join(rows)
    offset = 14 + 40 + len(table)
    info = struct.pack(
        "<IiiHHIIiiII", 40, width, -height if top_down else height, 1, 4, 0, len(pixels), 0, 0, len(palette), 0
    )
    return b"BM" + struct.pack("<IHHI", offset + len(pixels), 0, 0, offset) + info + table + pixels


FILES = {
    "jpeg": encoded(PHOTO, "JPEG"),
    "png": encoded(PHOTO, "PNG"),
    "png_palette_transparent": encoded(PHOTO.convert("P", palette=Image.ADAPTIVE, colors=7), "PNG", transparency=0),
    "gif": encoded(PHOTO.convert("P", palette=Image.ADAPTIVE), "GIF"),
    "webp_lossless": encoded(PHOTO.convert("RGBA"), "WEBP", lossless=True),
    "bmp_rgb": encoded(PHOTO, "BMP"),
    "bmp_rgba": encoded(PHOTO.convert("RGBA"), "BMP"),
    "bmp_gray": encoded(PHOTO.convert("L"), "BMP"),
    "bmp_palette_8bit": encoded(PHOTO.convert("P", palette=Image.ADAPTIVE, colors=256), "BMP"),
    "bmp_palette_16_colours": encoded(PHOTO.convert("P", palette=Image.ADAPTIVE, colors=16), "BMP"),
    "bmp_1bit": encoded(Image.fromarray(RNG.integers(0, 2, (9, 37)).astype(bool)), "BMP"),
    "bmp_4bit": four_bit_bmp(RNG.integers(0, 11, (6, 9)), RNG.integers(0, 256, (11, 3))),
    "bmp_4bit_top_down": four_bit_bmp(RNG.integers(0, 11, (6, 9)), RNG.integers(0, 256, (11, 3)), top_down=True),
}


@pytest.mark.parametrize("name", sorted(FILES))
def test_tensorflow_decodes_each_format_to_pillows_pixels(name):
    """Palette BMPs included: TensorFlow's own BMP decoder returned their 8-bit colour indices as
    gray levels (training and serving saw other pixels than `predict`) and refused 1 and 4 bits."""
    import tensorflow as tf

    from keras_vit.tf_images import decode_image

    expected = np.asarray(Image.open(io.BytesIO(FILES[name])).convert("RGB"))
    np.testing.assert_array_equal(decode_image(tf.constant(FILES[name])).numpy(), expected)
    traced = tf.function(decode_image, input_signature=[tf.TensorSpec([], tf.string)])  # as tf.data and serving run it
    np.testing.assert_array_equal(traced(tf.constant(FILES[name])).numpy(), expected)


def test_grayscale_is_pillows_luma_in_numpy_and_in_tensorflow():
    """`to_channels(image, 1)`: what a `channels=1` model's predict (NumPy) and its training and
    serving graphs (TensorFlow) make of an RGB image, Pillow's `convert("L")` value for value."""
    import tensorflow as tf

    from keras_vit.tf_images import to_channels as tf_to_channels
    from keras_vit.transform import to_channels

    rgb = RNG.integers(0, 256, (2, 31, 17, 3), dtype=np.uint8)
    expected = np.stack([np.asarray(Image.fromarray(image).convert("L"))[..., None] for image in rgb])
    np.testing.assert_array_equal(to_channels(rgb, 1), expected)
    np.testing.assert_array_equal(tf_to_channels(tf.constant(rgb), 1).numpy(), expected)
    gray = np.repeat(RNG.uniform(0, 255, (5, 7, 1)).astype(np.float32), 3, axis=-1)  # float pixels: no rounding
    np.testing.assert_allclose(to_channels(gray, 1), gray[..., :1], atol=1e-4)
    np.testing.assert_allclose(tf_to_channels(tf.constant(gray), 1).numpy(), gray[..., :1], atol=1e-4)
    with pytest.raises(ValueError, match="1 \\(grayscale\\) or 3 \\(RGB\\) channels; the model has 4"):
        tf_to_channels(tf.constant(rgb), 4)


def test_a_palette_bmp_does_not_read_as_its_indices():
    # The case the test above guards, shown: the indices as gray are far from the colours.
    import tensorflow as tf

    data = FILES["bmp_palette_8bit"]
    indices = tf.io.decode_image(data, channels=3, expand_animations=False).numpy().astype(int)
    assert np.abs(indices - np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))).mean() > 20


def test_a_truncated_bmp_is_an_error_not_pixels():
    import tensorflow as tf

    from keras_vit.tf_images import decode_image

    for data in (FILES["bmp_palette_8bit"][:-20], b"BM12"):
        with pytest.raises(tf.errors.InvalidArgumentError):
            decode_image(tf.constant(data))


@pytest.mark.parametrize(
    "name, as_is",
    [
        ("photo.jpg", True),
        ("photo.png", True),
        ("photo.gif", True),
        ("photo.webp", True),
        ("rgb.bmp", True),
        ("palette.bmp", False),  # SavedModels exported before tf_images took its indices for gray
        ("one_bit.bmp", False),
        ("animated.webp", False),  # TensorFlow refuses animated WebP
        ("tiff_named.png", False),  # the format decides, not the name
        ("photo.tiff", False),
    ],
)
def test_predict_sends_a_saved_model_the_file_only_where_tensorflow_reads_it_as_pillow(tmp_path, name, as_is):
    from keras_vit_cli.images import encoded_image, load_image

    path = tmp_path / name
    if name == "palette.bmp":
        PHOTO.convert("P", palette=Image.ADAPTIVE).save(path)
    elif name == "one_bit.bmp":
        PHOTO.convert("1").save(path)
    elif name == "animated.webp":
        PHOTO.save(path, save_all=True, append_images=[PHOTO.rotate(90)])
    elif name == "tiff_named.png":
        PHOTO.save(path, format="TIFF")
    else:
        PHOTO.save(path)
    pixels, _ = load_image(path)
    data = encoded_image(path, pixels)
    assert (data == path.read_bytes()) is as_is
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")), pixels)


def test_an_image_over_pillows_pixel_limit_is_refused_in_one_line(tmp_path, monkeypatch):
    from keras_vit_cli.images import load_image

    Image.new("L", (40, 30)).save(tmp_path / "huge.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 500)  # 1,200 pixels: over twice the limit
    with pytest.raises(ValueError, match=r"cannot read image \S+huge\.png: Image size \(1200 pixels\) exceeds limit"):
        load_image(tmp_path / "huge.png")


def test_an_image_between_one_and_two_pixel_limits_is_read_with_one_line_of_warning(tmp_path, monkeypatch, caplog):
    # Pillow's DecompressionBombWarning had come out raw: a source line of PIL and `warnings.warn(`
    import warnings

    from keras_vit_cli.images import load_image

    Image.new("L", (30, 25)).save(tmp_path / "big.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 500)  # 750 pixels: over the limit, under twice it
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none escapes as a Python warning
        pixels, _ = load_image(tmp_path / "big.png")
    assert pixels.shape == (25, 30, 3)
    [record] = [r for r in caplog.records if r.name == "keras_vit"]
    assert "big.png has 750 pixels, over Pillow's decompression-bomb warning limit; read all the same" in record.message


def test_a_folder_argument_stands_for_its_images_not_hidden_ones(tmp_path):
    from keras_vit_cli.images import image_files

    for name in ("b.png", "sub/a.JPG", ".hidden/c.png", "sub/._a.JPG", "notes.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    assert image_files([tmp_path]) == [(tmp_path / "b.png", True), (tmp_path / "sub" / "a.JPG", True)]
