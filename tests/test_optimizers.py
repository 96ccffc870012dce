"""The fused optimizers: Keras's results from one TensorFlow kernel per variable, Keras's update
where the kernel does not apply, and `.keras` round trips."""

import keras
import numpy as np
import pytest
from helpers import tiny_config

import keras_vit

pytestmark = pytest.mark.tensorflow_only
tf = pytest.importorskip("tensorflow")

from keras_vit.training.optimizers import FusedAdamW, FusedSGD  # noqa: E402
from keras_vit.training.recipes import NO_DECAY, WarmupDecay, build_optimizer  # noqa: E402


def _adamw(cls, **kwargs):
    optimizer = cls(WarmupDecay(1e-2, 2, 8), weight_decay=0.1, global_clipnorm=1.0, **kwargs)
    optimizer.exclude_from_weight_decay(var_names=NO_DECAY)
    return optimizer


CASES = {
    "adamw": (lambda cls: _adamw(cls), keras.optimizers.AdamW, FusedAdamW, "ResourceApplyAdam"),
    "sgd-momentum": (
        lambda cls: cls(0.1, momentum=0.9, weight_decay=1e-3),
        keras.optimizers.SGD,
        FusedSGD,
        "ResourceApplyKerasMomentum",
    ),
    "sgd-nesterov": (
        lambda cls: cls(0.1, momentum=0.9, nesterov=True),
        keras.optimizers.SGD,
        FusedSGD,
        "ResourceApplyKerasMomentum",
    ),
    # the weight decay, applied inside the update step, still only on the steps that update
    "adamw-accumulated": (
        lambda cls: _adamw(cls, gradient_accumulation_steps=2),
        keras.optimizers.AdamW,
        FusedAdamW,
        "ResourceApplyAdam",
    ),
    # where the fused kernel does not apply, Keras's own update runs (after the same decay)
    "adamw-amsgrad": (lambda cls: _adamw(cls, amsgrad=True), keras.optimizers.AdamW, FusedAdamW, None),
    "sgd-plain": (lambda cls: cls(0.1, weight_decay=1e-2), keras.optimizers.SGD, FusedSGD, None),
}


def _data():
    rng = np.random.default_rng(1)
    return rng.uniform(0, 255, (16, 32, 32, 3)).astype("float32"), rng.integers(0, 7, 16)


def _trained(optimizer, jit_compile, epochs=1):
    keras.utils.set_random_seed(0)
    model = keras_vit.ViT(tiny_config(dropout_rate=0.0))
    model.compile(
        optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=jit_compile
    )
    x, y = _data()
    model.fit(x, y, batch_size=4, epochs=epochs, shuffle=False, verbose=0)
    return model


def _update_ops(optimizer, count=2):
    """The op types of one traced `apply` of `optimizer` to `count` variables, in any branch, one
    entry per op."""
    variables = [keras.Variable(np.full((3, i + 1), i, "float32")) for i in range(count)]
    optimizer.build(variables)
    gradients = [tf.fill(v.shape, 0.5) for v in variables]
    graph = tf.function(lambda: optimizer.apply(gradients, variables)).get_concrete_function().graph.as_graph_def()
    # with gradient accumulation the update sits in a `cond` branch, a function of the library
    return [node.op for node in graph.node] + [node.op for f in graph.library.function for node in f.node_def]


def _update_op_types(optimizer):
    return set(_update_ops(optimizer))


# Every case in graph mode (how `fit` runs on a TensorFlow CPU); under XLA (the digits default,
# GPUs), the cases that no recipe's defaults choose run with the slow tests.
XLA_IN_SLOW = ("sgd-nesterov", "adamw-accumulated", "adamw-amsgrad", "sgd-plain")


@pytest.mark.parametrize(
    "case, jit_compile",
    [pytest.param(case, False, id=f"{case}-graph") for case in CASES]
    + [
        pytest.param(case, True, id=f"{case}-xla", marks=[pytest.mark.slow] if case in XLA_IN_SLOW else [])
        for case in CASES
    ],
)
def test_fused_optimizer_trains_a_vit_exactly_as_keras_does(case, jit_compile):
    make, keras_cls, fused_cls, kernel = CASES[case]
    reference, fused = _trained(make(keras_cls), jit_compile), _trained(make(fused_cls), jit_compile)
    # 4 batches: 4 updates, or 2 when gradients are accumulated over 2
    assert type(fused.optimizer) is fused_cls
    assert int(fused.optimizer.iterations) == 4 // (fused.optimizer.gradient_accumulation_steps or 1)
    # atol: biases near zero differ in float rounding (3.3e-6 under XLA on AMD Zen 3); a wrong update
    # moves them by the learning rate's order, 1e-3
    for a, b in zip(reference.weights + reference.optimizer.variables, fused.weights + fused.optimizer.variables):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-5, err_msg=a.path)
    # the weights moved: equal results are not two untouched models
    assert not np.allclose(
        np.asarray(fused.weights[0]), np.asarray(_trained(make(fused_cls), jit_compile, 0).weights[0])
    )
    fused_ops, keras_ops = _update_op_types(make(fused_cls)), _update_op_types(make(keras_cls))
    if kernel:
        assert kernel in fused_ops and kernel not in keras_ops
    else:
        assert not {"ResourceApplyAdam", "ResourceApplyKerasMomentum"} & fused_ops


@pytest.mark.parametrize(
    "cls, make, per_variable",
    [
        (FusedAdamW, _adamw, 16),  # 13 (27 when each variable built its own scalars)
        (FusedSGD, lambda cls: cls(0.1, momentum=0.9, weight_decay=1e-3), 10),  # 8 (13)
    ],
)
def test_the_kernels_scalars_are_built_once_per_update(cls, make, per_variable):
    # the learning rate, betas and their powers: one set shared by every variable's kernel
    two, five = _update_ops(make(cls), 2), _update_ops(make(cls), 5)
    assert two.count("Pow") == (2 if cls is FusedAdamW else 0) and five.count("Pow") == two.count("Pow")
    kernel = "ResourceApplyAdam" if cls is FusedAdamW else "ResourceApplyKerasMomentum"
    assert (two.count(kernel), five.count(kernel)) == (2, 5)
    # what each further variable adds: its kernel, its weight decay, its share of the clipping
    assert (len(five) - len(two)) / 3 <= per_variable


def test_sparse_gradients_take_keras_update():
    rows = tf.IndexedSlices(tf.constant([[1.0, -2.0]]), tf.constant([1]), tf.constant([3, 2]))
    results = []
    for cls in (keras.optimizers.AdamW, FusedAdamW, keras.optimizers.SGD, FusedSGD):
        variable = keras.Variable(np.arange(6, dtype="float32").reshape(3, 2))
        optimizer = cls(0.1, momentum=0.9) if "SGD" in cls.__name__ else cls(0.1)
        for _ in range(2):
            optimizer.apply([rows], [variable])
        results.append(np.asarray(variable))
    np.testing.assert_array_equal(results[1], results[0])
    np.testing.assert_array_equal(results[3], results[2])
    assert not np.array_equal(results[0], np.arange(6).reshape(3, 2))


def test_recipes_build_fused_optimizers_that_round_trip_through_keras_files(tmp_path):
    from keras_vit.training import TrainConfig

    pretrain = build_optimizer(TrainConfig(dataset="x", recipe="pretrain").resolved(), 10, 64)
    finetune = build_optimizer(TrainConfig(dataset="x", recipe="finetune").resolved(), 10, 64)
    assert type(pretrain) is FusedAdamW and type(finetune) is FusedSGD
    model = _trained(_adamw(FusedAdamW), jit_compile=False)
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert type(loaded.optimizer) is FusedAdamW
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    # Keras's own optimizers drop the exclusions on saving; the decay would then reach biases and norms
    assert loaded.optimizer.get_config()["exclude_from_weight_decay"] == sorted(NO_DECAY)
    for a, b in zip(model.optimizer.variables, loaded.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
    # training goes on from the stored state as it does in the original
    x, y = _data()
    for m in (model, loaded):
        m.fit(x[:4], y[:4], batch_size=4, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(model.weights, loaded.weights):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-6, atol=1e-7)
