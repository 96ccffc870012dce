"""The random initial weights of every keras_vit model: Keras's initializers, drawn with NumPy
under JAX.

Keras draws each weight with a backend random op, and under JAX every new weight shape compiles
its own program: building ViT-B/16 took 3.3 s, 2.2 s of it compiling, R26+S/32 7.1 s and H/14
10.3 s (2 cores of an AMD EPYC Zen 4). Loading a checkpoint or a `.keras` file builds the model
first, so every JAX command paid that for weights it then overwrote. Under JAX these subclasses
draw Keras's distributions with NumPy, which compiles nothing (B/16 1.3 s, R26+S/32 1.5 s, H/14
4.3 s); they keep Keras's arguments, config and seeding (an integer seed, or one Keras draws at
construction from Python's `random`, which `keras.utils.set_random_seed` seeds). TensorFlow and
PyTorch draw as Keras does: their random ops compile nothing and use every core (NumPy made
H/14 build 3.8 -> 6.5 s under PyTorch), and their seeded runs keep their weights.
"""

import math

import keras
import numpy as np

# Keras and JAX cut a truncated normal at two standard deviations; its standard deviation is
# then this fraction of the untruncated one.
_TRUNCATED_STDDEV = 0.87962566103423978


def _generator(initializer):
    """A NumPy generator for `initializer`'s integer seed under JAX; None where Keras's own draw
    serves: other backends, a SeedGenerator seed, and a draw traced into a JAX program (Keras
    compiles the initializer of a large sharded variable, so each device makes its own shard)."""
    if keras.backend.backend() != "jax" or isinstance(initializer.seed, keras.random.SeedGenerator):
        return None
    import jax

    if isinstance(jax.numpy.zeros(()), jax.core.Tracer):
        return None
    return np.random.default_rng(initializer.seed)


def _tensor(values, dtype):
    dtype = keras.backend.standardize_dtype(dtype or keras.config.floatx())
    values = keras.ops.convert_to_tensor(values)
    return values if dtype == "float32" else keras.ops.cast(values, dtype)


def _fans(shape):
    """(fan_in, fan_out) of a kernel: a Dense (in, out) or a convolution (..., in, out)."""
    if len(shape) < 2:
        size = shape[0] if shape else 1
        return size, size
    receptive_field = math.prod(shape[:-2])
    return shape[-2] * receptive_field, shape[-1] * receptive_field


def _truncated_normal(generator, shape):
    """Standard normal values, each beyond two standard deviations drawn again."""
    values = generator.standard_normal(shape, dtype=np.float32)
    outside = np.abs(values) > 2
    while outside.any():
        values[outside] = generator.standard_normal(int(outside.sum()), dtype=np.float32)
        outside = np.abs(values) > 2
    return values


@keras.saving.register_keras_serializable(package="keras_vit")
class RandomNormal(keras.initializers.RandomNormal):
    """`keras.initializers.RandomNormal`, drawn with NumPy under JAX."""

    def __call__(self, shape, dtype=None):
        generator = _generator(self)
        if generator is None:
            return super().__call__(shape, dtype)
        return _tensor(generator.standard_normal(shape, dtype=np.float32) * self.stddev + self.mean, dtype)


@keras.saving.register_keras_serializable(package="keras_vit")
class VarianceScaling(keras.initializers.VarianceScaling):
    """`keras.initializers.VarianceScaling`, drawn with NumPy under JAX."""

    def __call__(self, shape, dtype=None):
        generator = _generator(self)
        if generator is None:
            return super().__call__(shape, dtype)
        fan_in, fan_out = _fans(tuple(shape))
        fan = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2}[self.mode]
        scale = self.scale / max(1.0, fan)
        if self.distribution == "uniform":
            limit = math.sqrt(3.0 * scale)
            values = generator.random(shape, dtype=np.float32)
            values *= np.float32(2 * limit)
            values -= np.float32(limit)
        elif self.distribution == "truncated_normal":
            values = _truncated_normal(generator, shape) * np.float32(math.sqrt(scale) / _TRUNCATED_STDDEV)
        else:
            values = generator.standard_normal(shape, dtype=np.float32) * np.float32(math.sqrt(scale))
        return _tensor(values, dtype)


def glorot_uniform():
    """Xavier-uniform: `keras.initializers.GlorotUniform`'s distribution."""
    return VarianceScaling(1.0, "fan_avg", "uniform")


def lecun_normal():
    """`keras.initializers.LecunNormal`'s truncated normal (flax's `nn.Conv` default)."""
    return VarianceScaling(1.0, "fan_in", "truncated_normal")
