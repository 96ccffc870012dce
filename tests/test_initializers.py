"""keras_vit.initializers: Keras's distributions, seeding and config; NumPy draws under JAX."""

import math

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import initializers

SHAPE = (96, 384)  # a Dense kernel: fan_in 96, fan_out 384, 36,864 values
CASES = [
    (lambda: initializers.glorot_uniform(), lambda: keras.initializers.GlorotUniform()),
    (lambda: initializers.lecun_normal(), lambda: keras.initializers.LecunNormal()),
    (
        lambda: initializers.VarianceScaling(2.0, "fan_avg", "uniform"),
        lambda: keras.initializers.VarianceScaling(2.0, "fan_avg", "uniform"),
    ),
    (
        lambda: initializers.VarianceScaling(0.5, "fan_out", "untruncated_normal"),
        lambda: keras.initializers.VarianceScaling(0.5, "fan_out", "untruncated_normal"),
    ),
    (lambda: initializers.RandomNormal(stddev=0.02), lambda: keras.initializers.RandomNormal(stddev=0.02)),
]


def _values(initializer, shape=SHAPE):
    return keras.ops.convert_to_numpy(initializer(shape, dtype="float32"))


@pytest.mark.parametrize("ours, theirs", CASES, ids=["glorot", "lecun", "fan_avg2", "fan_out_normal", "normal"])
def test_each_draws_keras_distribution_and_is_seeded_as_keras(ours, theirs):
    keras.utils.set_random_seed(3)
    mine = ours()
    keras.utils.set_random_seed(3)
    reference = theirs()
    assert mine.seed == reference.seed  # the seed Keras drew at construction
    values, expected = _values(mine), _values(reference)
    np.testing.assert_array_equal(values, _values(mine))  # an instance draws the same values each call
    if keras.backend.backend() != "jax":
        np.testing.assert_array_equal(values, expected)  # Keras's own draw, value for value
        return
    # NumPy's draw: the distribution Keras draws, checked on 36,864 values with wide margins
    # (the standard error of the standard deviation is under 0.4%).
    assert not np.array_equal(values, expected)
    assert abs(values.mean()) < 0.05 * expected.std()
    assert values.std() == pytest.approx(expected.std(), rel=0.03)
    if isinstance(reference, keras.initializers.VarianceScaling):
        fan = {"fan_in": SHAPE[0], "fan_out": SHAPE[1], "fan_avg": sum(SHAPE) / 2}[reference.mode]
        if reference.distribution == "uniform":  # within the limit, and reaching it
            limit = math.sqrt(3 * reference.scale / fan)
            assert 0.99 * limit < np.abs(values).max() <= limit
        elif reference.distribution == "truncated_normal":  # cut at two standard deviations
            cut = 2 * math.sqrt(reference.scale / fan) / 0.87962566103423978
            assert 0.99 * cut < np.abs(values).max() <= cut * (1 + 1e-6)


def test_config_round_trips_to_the_same_draw():
    initializer = initializers.VarianceScaling(2.0, "fan_avg", "uniform", seed=7)
    again = keras.initializers.deserialize(keras.initializers.serialize(initializer))
    assert type(again) is initializers.VarianceScaling
    assert again.get_config() == initializer.get_config()
    np.testing.assert_array_equal(_values(again), _values(initializer))


def test_a_jax_model_is_built_without_jax_random_programs(monkeypatch):
    """Under JAX each weight shape a JAX random op draws compiles a program (2.2 of the 3.3 s
    that building ViT-B/16 took): the model's random weights come from NumPy, seeded by
    `keras.utils.set_random_seed`."""
    if keras.backend.backend() != "jax":
        pytest.skip("the NumPy draw is JAX's")
    import jax

    def refuse(*args, **kwargs):
        raise AssertionError("a JAX random op drew an initial weight")

    for name in ("normal", "uniform", "truncated_normal"):
        monkeypatch.setattr(jax.random, name, refuse)
    config = keras_vit.ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_layers=1, num_heads=2, mlp_dim=64, num_classes=3
    )
    hybrid = keras_vit.get_config("vit_r_ti16", image_size=32, num_classes=3)
    weights = []
    for _ in range(2):
        keras.utils.set_random_seed(0)
        weights.append(keras_vit.ViT(config).get_weights() + keras_vit.ViT(hybrid).get_weights())
    for first, second in zip(*weights):
        np.testing.assert_array_equal(first, second)
    assert len({float(np.std(w)) for w in weights[0] if w.size > 1 and np.std(w) > 0}) > 5  # random, not constant


def test_a_draw_traced_into_a_jax_program_is_keras_own():
    """Keras compiles the initializer of a large sharded variable (each device makes its shard):
    there the draw is Keras's, not a NumPy constant baked into the program."""
    if keras.backend.backend() != "jax":
        pytest.skip("JAX compiles initializers")
    import jax

    ours, theirs = initializers.glorot_uniform(), keras.initializers.GlorotUniform(seed=0)
    ours.seed = theirs.seed
    traced = jax.jit(ours.__call__, static_argnames=["shape", "dtype"])(shape=SHAPE, dtype="float32")
    np.testing.assert_array_equal(np.asarray(traced), _values(theirs))
    assert not np.array_equal(np.asarray(traced), _values(ours))  # called eagerly: NumPy's draw
