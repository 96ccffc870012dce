"""One harness over every layer of `keras_vit.layers`: build on two input shapes, call, the
output shape it declares, its weights, a config and `.keras` round trip that must be bit-exact,
and mixed_bfloat16 (float32 weights, bfloat16 outputs close to float32's). Runs on every backend
the suite runs."""

import inspect

import keras
import numpy as np
import pytest
from helpers import perturb

from keras_vit import layers

D = 8  # token width of the cases


def _grid(batch):
    return (batch, 2, 2, D)


# name -> (constructor arguments, inputs for two calls as shapes (a list for several inputs),
# trainable weight tensors, trainable parameters)
CASES = {
    "MultiHeadSelfAttention": (dict(num_heads=2), [(2, 5, D), (3, 7, D)], 4, 4 * D * D + 4 * D),
    "AttentionPool": (
        dict(num_heads=2, mlp_dim=16, num_prefix_tokens=1),
        [(2, 5, D), (3, 7, D)],
        13,
        D + (D * D + D) + (D * 2 * D + 2 * D) + (D * D + D) + 2 * D + (D * 16 + 16 + 16 * D + D),
    ),
    "ClassToken": ({}, [(2, 4, D), (3, 6, D)], 1, D),
    "DropPath": (dict(rate=0.5, seed=1), [(2, 4, D), (3, 6, D)], 0, 0),
    "EncoderBlock": (
        dict(num_heads=2, mlp_dim=16),
        [(2, 5, D), (3, 7, D)],
        12,
        2 * 2 * D + 4 * D * D + 4 * D + (D * 16 + 16 + 16 * D + D),
    ),
    "GroupNormalization": (dict(groups=2), [(2, 4, 4, D), (3, 2, 6, D)], 2, 2 * D),
    "LayerNormalization": (dict(epsilon=1e-6), [(2, 5, D), (3, 7, D)], 2, 2 * D),
    "LayerScale": (dict(init_value=0.1), [(2, 5, D), (3, 7, D)], 1, D),
    "MLP": (dict(mlp_dim=16), [(2, 5, D), (3, 7, D)], 4, D * 16 + 16 + 16 * D + D),
    "ImageNormalization": (dict(mean=(127.5,) * 3, std=(127.5,) * 3), [(2, 8, 8, 3), (3, 12, 4, 3)], 0, 0),
    "PatchEmbedding": (dict(hidden_size=D, patch_size=4), [(2, 8, 8, 3), (3, 16, 12, 3)], 2, 4 * 4 * 3 * D + D),
    "TokenPooling": (dict(mode="gap"), [(2, 5, D), (3, 7, D)], 0, 0),
    "PositionEmbedding": (dict(grid_size=(2, 2)), [(2, 5, D), (3, 5, D)], 1, 5 * D),
    "RegisterTokens": (dict(num_tokens=2), [(2, 5, D), (3, 7, D)], 1, 2 * D),
    "RotaryEmbedding": (
        dict(style="eva02", grid_size=(2, 2), num_prefix_tokens=1, reference_grid=(4, 4)),
        [(2, 3, 5, D), (3, 2, 5, D)],
        0,
        0,
    ),
    "StdConv2D": (dict(filters=D, kernel_size=3, padding="same"), [(2, 8, 8, 3), (3, 6, 10, 3)], 1, 27 * D),
    # BiT units (GroupNorm of 32 groups): a 1x1-3x3-1x1 bottleneck of 32 to 128 channels, projected.
    "BottleneckUnit": (
        dict(filters=32, strides=2),
        [(2, 8, 8, 16), (3, 4, 6, 16)],
        12,
        16 * 32 + 9 * 32 * 32 + 32 * 128 + 16 * 128 + 2 * (32 + 32 + 128 + 128),
    ),
    "ResNetStem": (
        dict(stage_sizes=(1,), width=32),
        [(2, 16, 16, 3), (3, 32, 16, 3)],
        15,
        7 * 7 * 3 * 32 + 2 * 32 + 32 * 32 + 9 * 32 * 32 + 32 * 128 + 32 * 128 + 2 * (32 + 32 + 128 + 128),
    ),
    "TokenGrid": (dict(grid_size=(2, 2)), [(2, 5, D), (3, 5, D)], 0, 0),
    "MergeTokenGrid": ({}, [[(2, 5, D), _grid(2)], [(3, 5, D), _grid(3)]], 0, 0),
}


def _inputs(shapes, seed):
    rng = np.random.default_rng(seed)
    if isinstance(shapes, list):
        return [_inputs(s, seed + i) for i, s in enumerate(shapes)]
    return rng.uniform(-2, 2, shapes).astype("float32")


def _numpy(x):
    return keras.ops.convert_to_numpy(keras.ops.cast(x, "float32"))


def _build(name, **extra):
    arguments, shapes, *_ = CASES[name]
    layer = getattr(layers, name)(**arguments, **extra)
    for i, call_shapes in enumerate(shapes):
        layer(_inputs(call_shapes, i))
    return layer


def test_every_layer_has_a_case():
    classes = {n for n, obj in vars(layers).items() if inspect.isclass(obj) and issubclass(obj, keras.layers.Layer)}
    assert classes == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_layer(name, tmp_path):
    arguments, shapes, num_trainable, num_parameters = CASES[name]
    layer = _build(name)
    perturb(layer, seed=1)  # off zero tokens and unit scales, so a dropped weight shows
    assert len(layer.trainable_weights) == num_trainable
    assert not layer.non_trainable_weights
    if num_parameters is not None:
        assert sum(int(np.prod(w.shape)) for w in layer.trainable_weights) == num_parameters

    for i, call_shapes in enumerate(shapes):
        x = _inputs(call_shapes, i)
        out = layer(x)
        assert np.isfinite(_numpy(out)).all()
        try:
            declared = layer.compute_output_shape(call_shapes if isinstance(call_shapes, list) else tuple(call_shapes))
        except NotImplementedError:
            continue
        assert tuple(declared) == tuple(out.shape), (declared, out.shape)

    x = _inputs(shapes[0], 0)
    expected = _numpy(layer(x))

    # Config round trip, through Keras's registry of serialisable objects.
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(clone) is type(layer)
    clone(x)
    clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(_numpy(clone(x)), expected)

    # .keras round trip, in safe mode with nothing but keras_vit imported.
    inputs = [keras.Input(s[1:]) for s in shapes[0]] if isinstance(shapes[0], list) else keras.Input(shapes[0][1:])
    model = keras.Model(inputs, layer(inputs))
    model.save(tmp_path / "layer.keras")
    loaded = keras.saving.load_model(tmp_path / "layer.keras", safe_mode=True)
    assert any(type(inner) is type(layer) for inner in loaded.layers)
    np.testing.assert_array_equal(_numpy(loaded(x)), expected)

    # mixed_bfloat16: float32 variables, bfloat16 outputs, close to float32.
    mixed = getattr(layers, name)(**arguments, dtype="mixed_bfloat16")
    mixed(x)
    mixed.set_weights(layer.get_weights())
    assert all(keras.backend.standardize_dtype(w.dtype) == "float32" for w in mixed.weights)
    out = mixed(x)
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
    tolerance = 0.05 * max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(_numpy(out), expected, atol=tolerance)


@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
def test_layer_normalization_equals_keras_on_every_backend(dtype):
    """The centred form (TensorFlow) and Keras's kernel (JAX, PyTorch) give Keras's outputs, on
    tokens whose mean is far from zero; half precision is normalised in float32 either way."""
    rng = np.random.default_rng(0)
    x = (3.0 + 0.5 * rng.standard_normal((4, 5, 64))).astype("float32")
    ours = layers.LayerNormalization(epsilon=1e-6, dtype=dtype)
    reference = keras.layers.LayerNormalization(epsilon=1e-6, dtype=dtype)
    weights = [rng.standard_normal(64).astype("float32") for _ in range(2)]  # gamma, beta
    for layer in (ours, reference):
        layer.build(x.shape)
        layer.set_weights(weights)
    y, expected = ours(x), reference(x)
    assert keras.backend.standardize_dtype(y.dtype) == ours.compute_dtype
    y, expected = (keras.ops.convert_to_numpy(keras.ops.cast(t, "float32")) for t in (y, expected))
    tolerance = 1e-5 if dtype == "float32" else 2e-2  # bf16 outputs: one rounding of values up to ~4
    np.testing.assert_allclose(y, expected, atol=tolerance)
    assert np.abs(y).max() > 1.0  # not all zeros


def test_layers_take_the_grid_of_each_call():
    """For images whose size is known only in the call (`ViTConfig.dynamic_image_size`): the
    patch embedding's `grid`, and each grid-shaped layer given that grid computes what one built
    for it computes."""
    from keras_vit.resample import resample_position_embeddings

    embed = layers.PatchEmbedding(D, 4, return_grid=True)
    tokens, grid = embed(_inputs((2, 12, 8, 3), 0))
    assert tuple(tokens.shape) == (2, 6, D) and tuple(grid.shape) == (2, 3, 2, 0)
    assert embed.compute_output_shape((2, 12, 8, 3)) == ((2, 6, D), (2, 3, 2, 0))

    position = _build("PositionEmbedding", interpolation="bicubic_antialias")
    perturb(position, seed=1)
    expected = resample_position_embeddings(
        _numpy(position.embedding), (3, 2), (2, 2), num_prefix_tokens=1, method="bicubic_antialias"
    )
    x = _inputs((2, 7, D), 1)
    np.testing.assert_allclose(_numpy(position(x, grid=grid)), x + expected, atol=1e-5)
    np.testing.assert_array_equal(_numpy(position(x[:, :5], grid=np.zeros((2, 2, 2, 0)))), _numpy(position(x[:, :5])))

    rotary = layers.RotaryEmbedding("eva02", (2, 2), num_prefix_tokens=1, reference_grid=(4, 4))
    own = layers.RotaryEmbedding("eva02", (3, 2), num_prefix_tokens=1, reference_grid=(4, 4))
    q = _inputs((2, 3, 7, D), 2)
    np.testing.assert_allclose(_numpy(rotary(q, grid=grid)), _numpy(own(q)), atol=1e-5)

    maps = layers.TokenGrid(None, num_prefix_tokens=1)(x, grid=grid)
    np.testing.assert_array_equal(_numpy(maps), x[:, 1:].reshape(2, 3, 2, D))
    with pytest.raises(ValueError, match="takes the `grid`"):
        layers.TokenGrid(None)(x)
