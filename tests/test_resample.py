import keras
import numpy as np
import pytest
from helpers import images, perturb, tiny_config

import keras_vit
from keras_vit import resample_position_embeddings


def test_same_grid_is_identity_and_prefix_is_kept():
    posemb = np.random.default_rng(0).standard_normal((1, 1 + 16, 8)).astype("float32")
    np.testing.assert_array_equal(resample_position_embeddings(posemb, (4, 4)), posemb)
    out = resample_position_embeddings(posemb, (6, 5))
    assert out.shape == (1, 31, 8)
    np.testing.assert_array_equal(out[:, :1], posemb[:, :1])


def test_a_grid_of_no_rows_is_refused():
    posemb = np.zeros((1, 17, 8), "float32")
    for grid in ((0, 4), (4, -1), 0, (4,)):
        with pytest.raises(ValueError, match="new_grid must be positive"):
            resample_position_embeddings(posemb, grid)


def test_bilinear_reproduces_an_affine_grid_and_constants():
    rows, cols = np.meshgrid(np.arange(4.0), np.arange(4.0), indexing="ij")
    grid = np.stack([np.ones_like(rows), 2 * rows + 3 * cols], axis=-1).reshape(1, 16, 2)
    out = resample_position_embeddings(grid, (8, 8), num_prefix_tokens=0)[0].reshape(8, 8, 2)
    np.testing.assert_allclose(out[..., 0], 1.0, atol=1e-6)
    # half-pixel centres: output index i samples input position (i + 0.5) / 2 - 0.5 (clamped)
    src = np.clip((np.arange(8) + 0.5) / 2 - 0.5, 0, 3)
    np.testing.assert_allclose(out[..., 1], 2 * src[:, None] + 3 * src[None, :], atol=1e-5)


def test_needs_old_grid_for_non_square():
    posemb = np.zeros((1, 1 + 12, 4))
    with pytest.raises(ValueError, match="not a square"):
        resample_position_embeddings(posemb, (4, 4))
    assert resample_position_embeddings(posemb, (4, 4), old_grid=(3, 4)).shape == (1, 17, 4)


@pytest.mark.tensorflow_only
def test_matches_tensorflow_bilinear_resize():
    import tensorflow as tf

    posemb = np.random.default_rng(1).standard_normal((1, 1 + 14 * 14, 6)).astype("float32")
    for new in [(24, 24), (7, 10), (16, 12)]:
        ours = resample_position_embeddings(posemb, new)[0, 1:].reshape(*new, 6)
        theirs = tf.image.resize(posemb[0, 1:].reshape(1, 14, 14, 6), new, method="bilinear", antialias=False)
        np.testing.assert_allclose(ours, theirs.numpy()[0], atol=1e-5)


def test_resized_model_carries_weights_and_resamples():
    model = perturb(keras_vit.ViT(tiny_config()))
    bigger = model.resized((48, 64))
    assert bigger.config.image_size == (48, 64) and bigger.config.grid_size == (6, 8)
    source = keras.ops.convert_to_numpy(model.get_layer("position_embedding").embedding)
    expected = resample_position_embeddings(source, (6, 8))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(bigger.get_layer("position_embedding").embedding), expected)
    for name in ("patch_embedding", "block_1", "head"):
        for a, b in zip(model.get_layer(name).get_weights(), bigger.get_layer(name).get_weights()):
            np.testing.assert_array_equal(a, b)
    assert bigger(images(size=(48, 64))).shape == (2, 7)
    # Same size: the copy computes the same function.
    to_numpy = keras.ops.convert_to_numpy
    np.testing.assert_allclose(to_numpy(model.resized(32)(images())), to_numpy(model(images())), atol=1e-6)


def test_resized_model_keeps_what_was_frozen():
    # A frozen backbone came back trainable at the new size (every flag was reset)
    model = keras_vit.ViT(tiny_config())
    for layer in model.layers[:-1]:
        layer.trainable = False
    model.get_layer("block_1").mlp.trainable = True
    bigger = model.resized(48)
    flags = [layer.trainable for layer in model._flatten_layers()]
    assert [layer.trainable for layer in bigger._flatten_layers()] == flags and False in flags and True in flags
    assert [w.path for w in bigger.trainable_weights] == [w.path for w in model.trainable_weights]
    assert len(bigger.trainable_weights) == 6  # block_1's MLP (2 Dense) and the head


def test_load_weights_saved_at_another_resolution(tmp_path):
    small = perturb(keras_vit.ViT(tiny_config()))
    path = tmp_path / "small.weights.h5"
    small.save_weights(path)
    big = keras_vit.ViT(tiny_config(image_size=64))
    big.load_weights(path)
    source = keras.ops.convert_to_numpy(small.get_layer("position_embedding").embedding)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(big.get_layer("position_embedding").embedding),
        resample_position_embeddings(source, (8, 8)),
    )


def test_assign_resampled_accepts_big_vision_layout_without_class_slot():
    """No class slot in the source (it adds no position embedding to the class token): zero."""
    layer = keras_vit.layers.PositionEmbedding((4, 4), num_prefix_tokens=1)
    layer.build((None, 17, 8))
    grid_only = np.random.default_rng(2).standard_normal((1, 4, 8)).astype("float32")
    layer.assign_resampled(grid_only)
    after = keras.ops.convert_to_numpy(layer.embedding)
    np.testing.assert_array_equal(after[:, :1], 0.0)
    np.testing.assert_allclose(after[:, 1:], resample_position_embeddings(grid_only, (4, 4), num_prefix_tokens=0)[:, :])
    with pytest.raises(ValueError, match="embedding width"):
        layer.assign_resampled(np.zeros((1, 17, 5)))


@pytest.mark.parametrize("old, new", [((7, 8), (12, 10)), ((12, 10), (7, 5)), ((14, 14), (24, 24))])
@pytest.mark.parametrize("antialias", [False, True])
def test_bicubic_matches_torch(old, new, antialias):
    torch = pytest.importorskip("torch")
    posemb = np.random.default_rng(0).standard_normal((1, 1 + old[0] * old[1], 5)).astype("float32")
    method = "bicubic_antialias" if antialias else "bicubic"
    ours = resample_position_embeddings(posemb, new, old, 1, method=method)
    grid = torch.from_numpy(posemb[0, 1:].reshape(*old, 5)).permute(2, 0, 1)[None]
    theirs = torch.nn.functional.interpolate(grid, size=new, mode="bicubic", align_corners=False, antialias=antialias)
    np.testing.assert_allclose(ours[0, 1:], theirs[0].permute(1, 2, 0).reshape(-1, 5).numpy(), atol=1e-5)
    np.testing.assert_array_equal(ours[:, :1], posemb[:, :1])
    with pytest.raises(ValueError, match="unknown interpolation 'area'"):
        resample_position_embeddings(posemb, new, old, 1, method="area")
