"""AdamW and SGD whose per-variable update is one fused TensorFlow kernel.

Keras's `AdamW` updates each variable with about ten small ops (casts, powers, differences, a
square root, three assignments), which on a 2-core CPU cost about 7% of a ViT-Ti/16 `fit` step.
`FusedAdamW` and `FusedSGD` do the same arithmetic in one `ResourceApplyAdam` /
`ResourceApplyKerasMomentum` kernel per variable (+3.7% float32, +4.6% mixed_bfloat16 Ti/16
`fit`, docs/performance.md). Everything around the update (weight decay, gradient clipping and
accumulation, EMA, loss scaling, tf.distribute) stays Keras's own, except that the decoupled
weight decay is applied in the same per-variable update, just before the step, with the
learning rate evaluated once per step (see `_DecayInUpdateStep`), and the scalars every
variable's update takes (the learning rate, the betas and their powers) are built once per
update, not once per variable (see `_ScalarsOncePerUpdate`). Other backends, AMSGrad, SGD
without momentum and sparse gradients take Keras's update unchanged.

Unlike Keras's optimizers, these keep the `var_names` given to `exclude_from_weight_decay` in
their config, so a model loaded from a `.keras` file trains on with the same weight decay. Both
take `rates`, a learning-rate factor per variable (layer-wise decay and a head scale, see
`_LayerRates`), on every backend.
"""

import keras
import tensorflow as tf


def _fusable(gradient):
    return keras.backend.backend() == "tensorflow" and not isinstance(gradient, tf.IndexedSlices)


def _handle(variable):
    """The resource handle of a Keras or TensorFlow variable (inside `tf.distribute`'s update
    context, a mirrored variable's handle is the current replica's)."""
    return (variable.value if isinstance(variable, keras.Variable) else variable).handle


class _SavedDecayExclusions:
    """Keeps `exclude_from_weight_decay(var_names=...)` in `get_config` (variables given by
    `var_list` are identities and cannot be stored)."""

    def exclude_from_weight_decay(self, var_list=None, var_names=None):
        super().exclude_from_weight_decay(var_list=var_list, var_names=var_names)
        self._decay_excluded_names = sorted(set(var_names or ()))

    def get_config(self):
        names = getattr(self, "_decay_excluded_names", [])
        return {**super().get_config(), **({"exclude_from_weight_decay": names} if names else {})}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        names = config.pop("exclude_from_weight_decay", None)
        optimizer = super().from_config(config, custom_objects=custom_objects)
        if names:
            optimizer.exclude_from_weight_decay(var_names=names)
        return optimizer


class _LayerRates:
    """A learning-rate factor per variable, `rates` ({variable path: factor}; others 1): the
    layer-wise decay and head scale of a fine-tune (`recipes.layer_rates`). A variable's update
    and its decoupled weight decay both take the learning rate times its factor, as a PyTorch
    optimizer's parameter group with its own learning rate does (BEiT, MAE)."""

    def __init__(self, *args, rates=None, **kwargs):
        super().__init__(*args, **kwargs)  # Keras's optimizers set no attribute before it
        self.rates = {str(path): float(factor) for path, factor in (rates or {}).items()}

    def rate(self, variable):
        """The factor of `variable` (a Keras variable, or inside tf.distribute's update its
        replica's TensorFlow variable), found by its place among the trainable variables."""
        if not self.rates:
            return 1.0
        return self.rates.get(self._trainable_variables[self._get_variable_index(variable)].path, 1.0)

    def get_config(self):
        return {**super().get_config(), **({"rates": self.rates} if self.rates else {})}


class _ScalarsOncePerUpdate(_LayerRates):
    """The scalar inputs of the fused kernels, built once per traced update (and device and dtype)
    and shared by every variable's kernel, instead of once per variable.

    Built per variable, they would be about 15 of the 20 ops of ViT-Ti/16's traced update (3012
    ops for 152 variables, against 1104). The arithmetic is the same, but Python builds and the
    graph optimiser reads every copy before the first step: 13.7 s against 10.1 s on 2 CPU cores
    (docs/performance.md).
    """

    _update_scalars = None  # {(name, device, dtype): tensor} while an update is being built

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        self._update_scalars = {}  # this update's tensors: each trace builds its own
        try:
            super()._backend_update_step(grads, trainable_variables, learning_rate)
        finally:
            self._update_scalars = None

    def _scalar(self, name, variable, make):
        """`make()` cast to `variable`'s dtype, built once per update, device, dtype and
        learning-rate factor (once per call outside an update)."""
        if self._update_scalars is None:
            return tf.cast(make(), variable.dtype)
        key = (name, variable.device, variable.dtype, self.rate(variable))
        if key not in self._update_scalars:
            self._update_scalars[key] = tf.cast(make(), variable.dtype)
        return self._update_scalars[key]


class _DecayInUpdateStep(_ScalarsOncePerUpdate):
    """Keras's decoupled weight decay, `var -= var * weight_decay * lr`, applied by `update_step`
    just before the variable's own update instead of in a separate pass over all variables.

    Keras's pass evaluates a learning-rate schedule once per variable. With the recipes'
    warm-up schedule, ViT-Ti/16's traced update had 3012 ops instead of 4188 and traced in
    0.69 s instead of 0.97 s (2 CPU cores); each step saved about 1 ms. The arithmetic is the
    same, the decay still precedes the step, and the decay exclusions still apply.
    """

    def _apply_weight_decay(self, variables):
        if keras.backend.backend() == "tensorflow":
            return  # in `update_step`
        if not self.rates or self.weight_decay is None:
            return super()._apply_weight_decay(variables)
        for variable in variables:  # Keras's loop, each variable at its own learning rate
            if self._use_weight_decay(variable):
                factor = self.learning_rate * self.weight_decay * self.rate(variable)
                variable.assign(variable - variable * keras.ops.cast(factor, variable.dtype))

    def _rated(self, variable, learning_rate):
        """The learning rate of `variable`'s update: times its factor (`_LayerRates`)."""
        rate = self.rate(variable)
        return learning_rate if rate == 1.0 else learning_rate * rate

    def _decay(self, variable, learning_rate):
        if self.weight_decay is None or keras.backend.backend() != "tensorflow":
            return
        if self._use_weight_decay(variable):
            rate = self._scalar(
                "decay",
                variable,
                lambda: tf.cast(self._rated(variable, learning_rate), variable.dtype) * self.weight_decay,
            )
            variable.assign_sub(variable * rate)


@keras.saving.register_keras_serializable(package="keras_vit")
class FusedAdamW(_DecayInUpdateStep, _SavedDecayExclusions, keras.optimizers.AdamW):
    """`keras.optimizers.AdamW` (same arguments and state, results equal to float rounding) with
    each variable's Adam step done by TensorFlow's fused `ResourceApplyAdam` kernel."""

    def update_step(self, gradient, variable, learning_rate):
        self._decay(variable, learning_rate)
        if self.amsgrad or not _fusable(gradient):
            return super().update_step(gradient, variable, self._rated(variable, learning_rate))
        index = self._get_variable_index(variable)

        def scalar(name, make):
            return self._scalar(name, variable, make)

        step = scalar("step", lambda: self.iterations + 1)
        tf.raw_ops.ResourceApplyAdam(
            var=_handle(variable),
            m=_handle(self._momentums[index]),
            v=_handle(self._velocities[index]),
            beta1_power=scalar("beta1_power", lambda: tf.pow(tf.cast(self.beta_1, step.dtype), step)),
            beta2_power=scalar("beta2_power", lambda: tf.pow(tf.cast(self.beta_2, step.dtype), step)),
            lr=scalar("lr", lambda: self._rated(variable, learning_rate)),
            beta1=scalar("beta1", lambda: self.beta_1),
            beta2=scalar("beta2", lambda: self.beta_2),
            epsilon=scalar("epsilon", lambda: self.epsilon),
            grad=tf.cast(gradient, variable.dtype),
        )


@keras.saving.register_keras_serializable(package="keras_vit")
class FusedSGD(_DecayInUpdateStep, _SavedDecayExclusions, keras.optimizers.SGD):
    """`keras.optimizers.SGD` (same arguments and state, results equal to float rounding) with
    each variable's momentum step done by TensorFlow's fused `ResourceApplyKerasMomentum` kernel,
    Nesterov or not."""

    def update_step(self, gradient, variable, learning_rate):
        self._decay(variable, learning_rate)
        if self.momentum == 0 or not _fusable(gradient):
            return super().update_step(gradient, variable, self._rated(variable, learning_rate))
        momentum = self.momentums[self._get_variable_index(variable)]
        tf.raw_ops.ResourceApplyKerasMomentum(
            var=_handle(variable),
            accum=_handle(momentum),
            lr=self._scalar("lr", variable, lambda: self._rated(variable, learning_rate)),
            grad=tf.cast(gradient, variable.dtype),
            momentum=self._scalar("momentum", variable, lambda: self.momentum),
            use_nesterov=self.nesterov,
        )
