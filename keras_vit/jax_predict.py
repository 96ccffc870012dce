"""`ViT.predict_on_batch` on the JAX backend without Keras's per-call state round trip.

Keras's JAX `predict_on_batch` walks the model for its trainable and non-trainable variables,
donates their values to the compiled step and assigns every one back afterwards. For a 12-block
ViT that is about 1 ms per call on 2 Zen 4 cores and 2.0-2.7 ms on an H100 machine's host: a
fifth to a quarter of a ViT-S/16 bf16 batch of 256 on that GPU (docs/performance.md). `StatelessPredict`
runs `jax.jit` of the model's `call` in a `keras.StatelessScope` with the weights' values as
arguments: nothing is donated or written back, so a call costs one walk over the weights.
"""

import keras
import numpy as np


def applies(model, x):
    """Whether `StatelessPredict` may serve `model.predict_on_batch(x)`: the JAX backend, no
    `keras.distribution` set (Keras's own step places the data then), XLA not switched off by
    `compile(jit_compile=False)`, and `x` one NumPy or JAX array."""
    if keras.backend.backend() != "jax" or keras.distribution.distribution() is not None:
        return False
    import jax

    return bool(model.jit_compile) and isinstance(x, (np.ndarray, jax.Array))


class StatelessPredict:
    """`model(x, training=False)` as NumPy, jitted with the weights as arguments. The compiled
    function is kept for the model's current weight variables and rebuilt when they change
    (e.g. after `model.quantize`); new input shapes retrace as under `jax.jit`."""

    def __init__(self, model):
        self.model = model
        self.key = None
        self.forward = None

    def __call__(self, x):
        import jax

        weights = self.model.weights
        key = tuple(map(id, weights))
        if key != self.key:
            model = self.model

            def forward(values, images):
                with keras.StatelessScope(state_mapping=list(zip(weights, values))):
                    return model.call(images, training=False)

            self.key, self.forward = key, jax.jit(forward)
        return keras.tree.map_structure(np.array, self.forward([w.value for w in weights], x))
