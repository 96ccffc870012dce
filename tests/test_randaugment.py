"""RandAugment's operations against PIL's, its choices from the seed, and the training
pipeline's RandAugment: reproducible and exact on resume."""

import numpy as np
import pytest
from PIL import Image, ImageEnhance, ImageOps

pytestmark = pytest.mark.tensorflow_only  # tf.data ops
tf = pytest.importorskip("tensorflow")

from keras_vit.training import TrainConfig, datasets, pipeline  # noqa: E402
from keras_vit.training import randaugment as ra  # noqa: E402


def _photo(seed=0, shape=(23, 31, 3)):
    """An image with smooth areas, edges and noise, levels 0-255 (the channels differ)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[: shape[0], : shape[1]]
    base = np.stack([x * 5.0, y * 7.0 + 20, (x + y) * 3.0 + 60], -1)
    return np.clip(base + rng.normal(0, 25, shape), 0, 255).round().astype(np.uint8)


def _ours(op, image, *args):
    return op(tf.constant(image, tf.float32), *args).numpy()


@pytest.mark.parametrize("factor", [0.1, 0.55, 1.0, 1.45, 1.9])
def test_enhancements_match_pil(factor):
    image = _photo()
    for op, enhancer in (
        (ra.color, ImageEnhance.Color),
        (ra.contrast, ImageEnhance.Contrast),
        (ra.brightness, ImageEnhance.Brightness),
        (ra.sharpness, ImageEnhance.Sharpness),
    ):
        expected = np.asarray(enhancer(Image.fromarray(image)).enhance(factor), np.float32)
        got = _ours(op, image, factor)
        # PIL's degenerate images hold whole levels and its output is truncated to uint8
        assert np.abs(np.floor(got + 1e-3) - expected).max() <= 1, op.__name__
        np.testing.assert_allclose(got, expected, atol=1.5, err_msg=op.__name__)
        assert np.abs(got - expected).mean() < 0.8, op.__name__


def test_level_operations_match_pil():
    image = _photo(1)
    pil = Image.fromarray(image)
    for threshold in (0, 77, 128, 256):
        expected = np.asarray(ImageOps.solarize(pil, threshold), np.float32)
        np.testing.assert_array_equal(_ours(ra.solarize, image, float(threshold)), expected)
    for bits in (1, 4, 7, 8):
        np.testing.assert_array_equal(_ours(ra.posterize, image, bits), np.asarray(ImageOps.posterize(pil, bits)))
    np.testing.assert_array_equal(_ours(ra.equalize, image), np.asarray(ImageOps.equalize(pil)))
    narrow = (image // 4 + 90).astype(np.uint8)  # levels 90-153: autocontrast stretches them
    expected = np.asarray(ImageOps.autocontrast(Image.fromarray(narrow)), np.float32)
    np.testing.assert_allclose(_ours(ra.auto_contrast, narrow), expected, atol=1.0)  # PIL truncates
    # a flat channel: autocontrast and equalize keep it
    flat = image.copy()
    flat[..., 1] = 40
    np.testing.assert_array_equal(_ours(ra.equalize, flat), np.asarray(ImageOps.equalize(Image.fromarray(flat))))
    np.testing.assert_array_equal(_ours(ra.auto_contrast, flat)[..., 1], flat[..., 1])


def test_geometric_operations_move_the_image_about_its_centre():
    image = _photo(2, (20, 20, 3)).astype(np.float32)
    np.testing.assert_allclose(_ours(ra.rotate, image, np.pi / 2), np.rot90(image, -1), atol=1e-3)
    np.testing.assert_allclose(_ours(ra.rotate, image, 0.0), image, atol=1e-4)
    moved = _ours(ra.translate, image, 3.0, -2.0)  # 3 right, 2 up; what comes in is grey
    np.testing.assert_allclose(moved[:-2, 3:], image[2:, :-3], atol=1e-4)
    assert (moved[:, :3] == ra.FILL).all() and (moved[-2:] == ra.FILL).all()
    sheared = _ours(ra.shear, image, 0.5, 0.0)  # row y reads from x + 0.5 (y - 9.5)
    np.testing.assert_allclose(sheared[10, 5:15], image[10, 5:15] * 0.75 + image[10, 6:16] * 0.25, atol=1e-3)
    np.testing.assert_allclose(sheared[8, 3:14], image[8, 2:13] * 0.75 + image[8, 3:14] * 0.25, atol=1e-3)


def test_choices_come_from_the_seed_and_cover_every_operation():
    seeds = [tf.constant([7, i]) for i in range(1400)]
    drawn = [ra.choices(s, 2) for s in seeds[:3]]
    for (ops, signs), s in zip(drawn, seeds):
        again = ra.choices(s, 2)
        np.testing.assert_array_equal(ops, again[0])
        np.testing.assert_array_equal(signs, again[1])
    ops = np.concatenate([ra.choices(s, 2)[0].numpy() for s in seeds])
    signs = np.concatenate([ra.choices(s, 2)[1].numpy() for s in seeds])
    counts = np.bincount(ops, minlength=len(ra.OPS))
    assert len(counts) == len(ra.OPS) and counts.min() > 140 and counts.max() < 260, counts  # 200 each expected
    assert set(signs) == {-1, 1} and abs(signs.mean()) < 0.1


def test_rand_augment_applies_the_chosen_operations():
    image = tf.constant(_photo(3, (24, 24, 3)), tf.float32)
    out = []
    for i in range(40):
        seed = tf.constant([5, i])
        got = ra.rand_augment(image, 0.6, seed)
        np.testing.assert_array_equal(got, ra.rand_augment(image, 0.6, seed))
        assert got.shape == image.shape and 0.0 <= float(tf.reduce_min(got)) and float(tf.reduce_max(got)) <= 255.0
        ops, signs = ra.choices(seed, 2)
        expected = image
        for op, sign in zip(ops.numpy(), signs.numpy()):
            expected = ra._branches(expected, 0.6, float(sign))[ra.OPS[op]]()
        np.testing.assert_allclose(got, expected, atol=1e-4)
        out.append(got.numpy())
    changed = sum(not np.array_equal(o, image.numpy()) for o in out)
    assert changed >= 30  # only identity twice (1 in 196) or posterize at 8 bits leave it


def test_pipeline_rand_augment_is_reproducible_and_exact_on_resume():
    source = datasets.digits()
    config = TrainConfig(seed=3, randaugment=0.7)

    def batches(config, start_step=0, count=1):
        ds = pipeline.train_pipeline(source, config, (16, 16), 10, 8, start_step=start_step)
        return [x.numpy() for x, _ in ds.take(count)]

    stream = batches(config, count=8)
    for step in (0, 5):
        np.testing.assert_array_equal(batches(config, start_step=step)[0], stream[step])
    plain = batches(TrainConfig(seed=3), count=8)
    differ = [not np.array_equal(a[i], b[i]) for a, b in zip(stream, plain) for i in range(8)]
    assert 0.8 < np.mean(differ) < 1.0  # identity is 1 of 14 choices, twice
    other = batches(TrainConfig(seed=4, randaugment=0.7))[0]
    assert not np.array_equal(other, stream[0])
