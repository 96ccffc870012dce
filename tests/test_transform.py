"""The image transform a model carries in its config (keras_vit.transform), on every backend."""

import keras
import numpy as np
import pytest
from helpers import tiny_config

import keras_vit
from keras_vit.transform import ImageTransform


def _image(height=37, width=53, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3)).astype("uint8")


def _numpy(x):
    return keras.ops.convert_to_numpy(x)


def test_resize_only_and_centre_crop():
    image = _image()
    resized = _numpy(ImageTransform((16, 16), crop=1.0)(image))
    expected = _numpy(keras.ops.image.resize(image.astype("float32"), (16, 16), interpolation="bilinear"))
    assert resized.shape == (16, 16, 3) and resized.dtype == np.float32
    np.testing.assert_allclose(resized, expected, atol=1e-3)
    # crop 0.8: resized to 20x20 (16 / 0.8), then its centre 16x16 kept.
    cropped = _numpy(ImageTransform((16, 16), crop=0.8)(image))
    big = _numpy(keras.ops.image.resize(image.astype("float32"), (20, 20), interpolation="bilinear"))
    np.testing.assert_allclose(cropped, big[2:18, 2:18], atol=1e-3)
    batch = _numpy(ImageTransform((16, 16), crop=0.8)(np.stack([image, image])))
    np.testing.assert_allclose(batch[1], cropped, atol=1e-3)


def test_the_same_inside_tf_data_whatever_the_backend():
    tf = pytest.importorskip("tensorflow")
    transform = ImageTransform((12, 20), crop=0.875, interpolation="nearest")
    image = _image()
    inside = next(iter(tf.data.Dataset.from_tensors(image).map(transform))).numpy()
    np.testing.assert_allclose(inside, _numpy(transform(image)), atol=1e-3)


def test_a_model_carries_its_transform_through_a_keras_file(tmp_path):
    model = keras_vit.ViT(tiny_config(crop_fraction=1.0, interpolation="nearest"))
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras", safe_mode=True)
    transform = loaded.image_transform
    assert (transform.size, transform.crop, transform.interpolation) == ((32, 32), 1.0, "nearest")
    # A config written before the transform was part of it: the default, Inception's 0.875.
    config = model.config.to_dict()
    del config["crop_fraction"], config["interpolation"]
    assert keras_vit.ViTConfig(**config).crop_fraction == 0.875


@pytest.mark.parametrize("bad", [dict(crop_fraction=0.0), dict(crop_fraction=1.5), dict(interpolation="bicubic")])
def test_bad_transform_settings_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        tiny_config(**bad)
    with pytest.raises(ValueError):
        ImageTransform(16, bad.get("crop_fraction", 1.0), bad.get("interpolation", "bilinear"))
