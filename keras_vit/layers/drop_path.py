"""Stochastic depth: drop a whole residual branch per sample during training."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class DropPath(keras.layers.Layer):
    """Zeroes the branch for a `rate` fraction of samples and rescales the rest by 1/(1-rate)."""

    def __init__(self, rate=0.0, seed=None, **kwargs):
        super().__init__(**kwargs)
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"DropPath rate must be in [0, 1); got {rate}.")
        self.rate = float(rate)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def call(self, x, training=None):
        if not training or self.rate == 0.0:
            return x
        keep = 1.0 - self.rate
        shape = (ops.shape(x)[0],) + (1,) * (len(x.shape) - 1)
        mask = keras.random.uniform(shape, seed=self.seed_generator, dtype=x.dtype) < keep
        return x * ops.cast(mask, x.dtype) / ops.cast(keep, x.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "rate": self.rate, "seed": self.seed}
