"""`WeightsKeptOnError`: `fit`, `evaluate` and `predict` that leave a model its weights when
they fail on the JAX backend.

Keras's JAX loops take the variables' values into the loop's state and clear them on the
variables until the loop ends (`_purge_model_variables`, undone by `jax_state_sync`). An error
inside the loop (a wrong image size met when a generator's first batch is traced, an input
that raises) leaves them cleared: the model has no weights left. Here the cleared values are
remembered, and on an error the loop's last state is written back, or, before any step ran,
the values the loop cleared.
"""

import weakref

import keras

_CLEARED = weakref.WeakKeyDictionary()  # model -> [(variable, value it held before being cleared)]


class WeightsKeptOnError:
    """A mixin for `keras.Model` subclasses (see the module docstring)."""

    def fit(self, *args, **kwargs):
        return _kept(self, super().fit, args, kwargs)

    def evaluate(self, *args, **kwargs):
        return _kept(self, super().evaluate, args, kwargs)

    def predict(self, *args, **kwargs):
        return _kept(self, super().predict, args, kwargs)

    def _purge_model_variables(self, *args, **kwargs):
        held = [(v, v._value) for v in _state_variables(self) if v._value is not None]
        super()._purge_model_variables(*args, **kwargs)
        if self in _CLEARED:
            _CLEARED[self].extend((v, value) for v, value in held if v._value is None)


def _kept(model, loop, args, kwargs):
    if keras.backend.backend() != "jax":
        return loop(*args, **kwargs)
    model._jax_state = None  # what a step of this loop leaves, not of an earlier one
    _CLEARED[model] = []
    try:
        return loop(*args, **kwargs)
    except BaseException:
        try:
            model.jax_state_sync()
        finally:
            for variable, value in _CLEARED[model]:
                if variable._value is None:
                    variable._value = value
            model._jax_state = None
        raise
    finally:
        _CLEARED.pop(model, None)


def _state_variables(model):
    optimizer = getattr(model, "optimizer", None)
    return list(model.variables) + list(optimizer.variables if optimizer else []) + list(model.metrics_variables)
