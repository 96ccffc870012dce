"""Gradient accumulation, rematerialisation and the scale-out flags' errors, on one device of the
current backend (several devices and processes: tests/test_distribution.py, under JAX)."""

import keras
import numpy as np
import pytest
from helpers import perturb, tiny_config

import keras_vit
from keras_vit.training import TrainConfig, recipes
from keras_vit_cli import main


def _accumulating_optimizer(accumulate, batch):
    """The pretrain recipe's AdamW (weight decay, no warm-up) at 1e-2 for an effective batch of 8."""
    config = TrainConfig(
        dataset="x", accumulate=accumulate, learning_rate=1e-2, base_batch_size=8, warmup_fraction=0.0
    ).resolved()
    return recipes.build_optimizer(config, steps_per_epoch=accumulate, global_batch=batch, epochs=1)


def test_accumulated_micro_batches_make_the_adamw_step_of_their_whole_batch(tmp_path):
    """Two micro-batches of 4 with `accumulate` 2: nothing moves after the first, and after the
    second the weights are those of one step on the batch of 8 (the recipe's AdamW), also when
    the second runs in a model restored from weights saved between them (a resume state)."""
    images = np.random.default_rng(0).uniform(0, 255, (8, 32, 32, 3)).astype("float32")
    labels = keras.utils.to_categorical(np.arange(8) % 7, 7)
    models = []
    for accumulate, batch in ((2, 4), (1, 8)):
        keras.utils.set_random_seed(1)
        model = perturb(keras_vit.ViT(tiny_config(num_layers=1)))
        optimizer = _accumulating_optimizer(accumulate, batch)
        assert optimizer.gradient_accumulation_steps == (accumulate if accumulate > 1 else None)
        model.compile(optimizer, keras.losses.MeanSquaredError())
        models.append(model)
    initial = [keras.ops.convert_to_numpy(w) for w in models[0].weights]
    models[0].train_on_batch(images[:4], labels[:4])
    assert max(float(np.abs(keras.ops.convert_to_numpy(w) - i).max()) for w, i in zip(models[0].weights, initial)) == 0
    models[0].save_weights(tmp_path / "between.weights.h5")  # with the optimizer's accumulated gradients
    keras.utils.set_random_seed(2)
    restored = keras_vit.ViT(tiny_config(num_layers=1))
    restored.compile(_accumulating_optimizer(2, 4), keras.losses.MeanSquaredError())
    restored.optimizer.build(restored.trainable_variables)
    restored.load_weights(tmp_path / "between.weights.h5")
    for model in (models[0], restored):
        model.train_on_batch(images[4:], labels[4:])
    models[1].train_on_batch(images, labels)
    models.append(restored)
    accumulated, whole, resumed = ([keras.ops.convert_to_numpy(w) for w in m.weights] for m in models)
    moved = max(float(np.abs(w - i).max()) for w, i in zip(whole, initial))
    assert moved > 5e-3  # a real step (1e-2 per weight for Adam), so 1e-5 below is tight
    assert max(float(np.abs(a - w).max()) for a, w in zip(accumulated, whole)) <= 1e-5
    assert max(float(np.abs(r - w).max()) for r, w in zip(resumed, whole)) <= 1e-5
    assert [int(keras.ops.convert_to_numpy(m.optimizer.iterations)) for m in models] == [1, 1, 1]


def test_schedule_and_learning_rate_follow_the_effective_batch():
    c = TrainConfig(dataset="digits", accumulate=2).resolved()
    assert recipes.schedule(c, 1437, 64) == (22, 130)  # 11 optimizer steps of 128 per epoch
    whole = TrainConfig(dataset="digits").resolved()
    assert recipes.peak_learning_rate(c, 64) == pytest.approx(recipes.peak_learning_rate(whole, 128))
    steps = TrainConfig(dataset="digits", accumulate=2, steps=5).resolved()
    assert recipes.schedule(steps, 1437, 64) == (10, 1)  # --steps counts optimizer steps
    schedule = recipes.build_optimizer(c, 22, 64, epochs=2).get_config()["learning_rate"]["config"]
    assert (schedule["total_steps"], schedule["warmup_steps"], schedule["accumulate"]) == (22, 2, 2)  # in updates
    warmup = recipes.WarmupDecay(1.0, 2, 22, accumulate=2)  # Keras calls it with its count of batches
    np.testing.assert_allclose([float(warmup(s)) for s in range(6)], [0, 0, 0.5, 0.5, 1, 1], atol=1e-6)
    with pytest.raises(ValueError, match=r"the effective batch 128 \(2 accumulated micro-batches of 64\) is larger"):
        recipes.schedule(c, 100, 64)


def test_accumulate_and_remat_refuse_bad_input_in_one_line(tmp_path, capsys):
    with pytest.raises(ValueError, match="accumulate .* must be positive; got 0"):
        TrainConfig(accumulate=0)
    with pytest.raises(ValueError, match="ema and accumulate are one or the other"):
        TrainConfig(accumulate=2, ema=0.99)
    run_dir = tmp_path / "r"
    backend = keras.backend.backend()
    if backend != "jax":
        assert main(["train", "--remat", "--epochs", "1", "--run-dir", str(run_dir)]) == 2
        assert f"--remat (rematerialisation) runs under the JAX backend (KERAS_BACKEND=jax); this is {backend}" in (
            capsys.readouterr().err
        )
    if backend == "torch":
        assert main(["train", "--model-parallel", "2", "--epochs", "1", "--run-dir", str(run_dir)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--model-parallel 2: the PyTorch backend trains on one device" in err
        assert "KERAS_BACKEND=jax" in err and "--strategy mirrored" in err
    if backend == "jax":
        import jax

        local = jax.local_device_count()
        assert main(["train", "--model-parallel", str(local * 3), "--epochs", "1", "--run-dir", str(run_dir)]) == 2
        assert f"--model-parallel {local * 3} must divide the {local} device" in capsys.readouterr().err
    assert not run_dir.exists()


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="rematerialisation runs under JAX")
@pytest.mark.parametrize("dynamic", [False, True], ids=["fixed", "dynamic_rope"])
def test_remat_gives_the_gradients_of_the_plain_model(dynamic):
    """Each block under `jax.checkpoint`: the same loss, gradients and dropout generator states
    (dropout, attention dropout and stochastic depth on) as without; also for a model of any
    image size with rotary embeddings, whose blocks take the batch's patch grid."""
    import jax

    from keras_vit.training.remat import rematerialize_blocks

    size = 40 if dynamic else 32  # the dynamic model at another size than its own
    images = np.random.default_rng(0).uniform(0, 255, (4, size, size, 3)).astype("float32")
    labels = keras.utils.to_categorical(np.arange(4) % 7, 7)
    extra = dict(dynamic_image_size=True, rope="eva02") if dynamic else {}
    config = tiny_config(dropout_rate=0.1, attention_dropout_rate=0.1, drop_path_rate=0.2, **extra)
    results = []
    for remat in (False, True):
        keras.utils.set_random_seed(1)
        model = perturb(keras_vit.ViT(config))
        if remat:
            assert rematerialize_blocks(model) == config.num_layers
        weights = [v.value for v in model.trainable_variables]
        states = [v.value for v in model.non_trainable_variables]

        def loss(weights, states, model=model):
            logits, states = model.stateless_call(weights, states, images, training=True)
            return keras.ops.mean(keras.losses.categorical_crossentropy(labels, logits, from_logits=True)), states

        results.append(jax.jit(jax.value_and_grad(loss, has_aux=True))(weights, states))
    (plain_loss, plain_states), plain_grads = results[0]
    (remat_loss, remat_states), remat_grads = results[1]
    assert abs(float(plain_loss) - float(remat_loss)) <= 1e-6
    assert max(float(np.abs(g).max()) for g in plain_grads) > 1e-3  # gradients that say something
    assert max(float(np.abs(a - b).max()) for a, b in zip(plain_grads, remat_grads)) <= 1e-6
    assert all(np.array_equal(a, b) for a, b in zip(plain_states, remat_states))


def test_a_run_stored_before_accumulate_and_remat_is_the_same_run(tmp_path):
    """A config.yaml written before a field existed holds its default: the run resumes."""
    import yaml

    from keras_vit.training.run import _config_text, _run_changes

    c = TrainConfig(run_dir=str(tmp_path)).resolved()
    stored = {k: v for k, v in yaml.safe_load(_config_text(c)).items() if k not in ("accumulate", "remat")}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(stored))
    assert _run_changes(c, tmp_path)[:2] == ([], [])
    assert _run_changes(TrainConfig(run_dir=str(tmp_path), accumulate=2).resolved(), tmp_path)[0] == ["accumulate"]
    assert _run_changes(TrainConfig(run_dir=str(tmp_path), remat=True).resolved(), tmp_path)[:2] == ([], ["remat"])
