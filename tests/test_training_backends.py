"""The training application under whichever backend this run uses (TensorFlow and JAX)."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import keras
import numpy as np
import pytest
from helpers import jax_devices_env, write_image_folder

from keras_vit.training import TrainConfig, evaluate, fit
from keras_vit.training.strategy import make_placement


def test_fit_runs_on_this_backend(tmp_path):
    model = dict(image_size=16, patch_size=4, hidden_size=32, num_layers=1, num_heads=2, mlp_dim=64)
    result = fit(TrainConfig(run_dir=str(tmp_path / "run"), model=model, epochs=2), verbose=0)
    assert result["num_examples"] == 359 and result["top1"] > 0.15  # above chance after two epochs
    assert json.loads((tmp_path / "run" / "eval.json").read_text())["top1"] == result["top1"]
    placement = make_placement(TrainConfig(strategy="auto"))
    assert placement.replicas == 1  # this machine: one CPU device
    if keras.backend.backend() == "jax":
        assert placement.strategy is None  # Keras distribution API (DataParallel with more devices)


def test_fewer_than_five_classes_train_and_evaluate(tmp_path):
    """Top-5 of 3 classes counts every example (PyTorch's topk refused k=5 above 3 classes and
    stopped the run on that backend)."""
    write_image_folder(tmp_path / "data", (("a", 5), ("b", 5), ("c", 5)), size=16)
    model = dict(image_size=16, patch_size=4, hidden_size=32, num_layers=1, num_heads=2, mlp_dim=64)
    config = TrainConfig(
        dataset=str(tmp_path / "data"), run_dir=str(tmp_path / "run"), model=model, epochs=1, batch_size=4
    )
    result = fit(config, verbose=0)
    assert result["num_examples"] == 3 and result["top5"] == 1.0
    assert evaluate(tmp_path / "run")["top5"] == 1.0


def test_a_run_stopped_mid_epoch_saves_there_and_resumes_to_the_uninterrupted_weights(tmp_path, monkeypatch):
    """SIGTERM (a scheduler's preemption) or Ctrl-C in the middle of an epoch: the resume state
    is written at the step the run stops after, and the resumed run reads the data from there
    on, so it ends with the weights of the run that was never stopped, also resumed with another
    `--steps-per-execution`, and with dropout and stochastic depth (their random generators'
    states are saved too). A stop in an epoch's last call finishes the epoch (validated and
    logged) first."""
    from keras_vit.training.callbacks import Interrupted, StopOnNaN

    model = dict(image_size=16, patch_size=4, hidden_size=32, num_layers=2, num_heads=2, mlp_dim=64)
    model.update(dropout_rate=0.1, attention_dropout_rate=0.1, drop_path_rate=0.1)

    def config(name, **fields):
        run_dir = str(tmp_path / name)
        return TrainConfig(epochs=3, seed=1, run_dir=run_dir, model=model, checkpoint_interval=3600, **fields)

    def weights(name):
        loaded = keras.saving.load_model(tmp_path / name / "last.keras")
        return [keras.ops.convert_to_numpy(w) for w in loaded.weights]

    straight = fit(config("straight"), verbose=0)

    def stop_in_epoch_2(at_its_end):
        def begin(self, batch, logs=None):  # `batch`: the first step of a call of `calls` steps
            calls = getattr(self.model, "steps_per_execution", 1) or 1
            if self.epoch == 1 and (batch + calls >= 44 if at_its_end else batch >= 12):  # 44 steps per epoch
                monkeypatch.setattr(StopOnNaN, "on_train_batch_begin", keras.callbacks.Callback.on_train_batch_begin)
                os.kill(os.getpid(), signal.SIGTERM)  # noted now, raised at the call's end

        return begin

    for name, at_its_end, resumed_with in (("stopped", False, {"steps_per_execution": 1}), ("at_the_end", True, {})):
        monkeypatch.setattr(StopOnNaN, "on_train_batch_begin", stop_in_epoch_2(at_its_end))
        with pytest.raises(Interrupted):
            fit(config(name), verbose=0)
        position = json.loads((tmp_path / name / "backup" / "position.json").read_text())
        if at_its_end:
            assert (position["epoch"], position["step"]) == (2, 0), position
        else:
            assert position["epoch"] == 1 and 12 < position["step"] < 44, position
        assert fit(config(name, **resumed_with), verbose=0)["top1"] == straight["top1"]
        for a, b in zip(weights(name), weights("straight")):
            np.testing.assert_allclose(a, b, atol=1e-6)
        log = [row.split(",")[0] for row in (tmp_path / name / "log.csv").read_text().splitlines()[1:]]
        assert log == ["0", "1", "2"]  # epoch 2 logged once, at its end


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="Keras DataParallel on virtual JAX devices")
@pytest.mark.parametrize("devices, model_parallel", [(3, 1), (4, 2)])
def test_jax_data_parallel_counts_every_held_out_example_once(devices, model_parallel, tmp_path):
    """359 held-out and 144 selection examples divide by neither 2 nor 3 replicas: the padded
    last batches must count each example once, as one device does; also with each replica
    split over 2 devices (model parallel)."""
    run_dir = tmp_path / "run"
    trained = _python(
        f"""
        from keras_vit.training import TrainConfig, fit
        model = dict(image_size=16, patch_size=4, hidden_size=32, num_layers=1, num_heads=2, mlp_dim=64)
        config = TrainConfig(
            run_dir={str(run_dir)!r}, model=model, epochs=1, selection_fraction=0.1, model_parallel={model_parallel}
        )
        print(json.dumps(fit(config, verbose=0)))
        """,
        devices,
    )
    alone = _python(f"from keras_vit.training import evaluate; print(json.dumps(evaluate({str(run_dir)!r})))", 1)
    assert ("ModelParallel" if model_parallel > 1 else "DataParallel") in trained.stderr
    parallel, single = json.loads(trained.stdout.splitlines()[-1]), json.loads(alone.stdout.splitlines()[-1])
    assert parallel["num_examples"] == single["num_examples"] == 359
    assert abs(parallel["top1"] - single["top1"]) < 1e-6 and abs(parallel["top5"] - single["top5"]) < 1e-6
    # Keras averages the loss over batches by their size, a padded batch's blanks included
    assert abs(parallel["loss"] - single["loss"]) < 2e-3


def _python(code, devices):
    env = jax_devices_env(devices)
    script = "import json, logging\nlogging.basicConfig(level=logging.INFO)\n" + textwrap.dedent(code)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_and_sigterm_stop_training_between_steps(tmp_path, signum):
    """Under JAX, Python's own SIGINT handler raised while Keras converted a step's logs to
    NumPy, where the exception was swallowed (jax-ml/jax#18246): training went on to its end.
    SIGTERM (`kill`, a scheduler's preemption) killed the run without a word."""
    if keras.backend.backend() == "torch":
        pytest.skip("PyTorch trains the digits model step by step, eagerly: minutes for these epochs")
    env = {**os.environ, "KERAS_BACKEND": keras.backend.backend(), "TF_CPP_MIN_LOG_LEVEL": "3"}
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "keras_vit_cli", "train", "--run-dir", str(run_dir), "--epochs", "200"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # As a terminal starts it: a test run started in the background ignores SIGINT, and
        # its children inherit that (Python then installs no handler of its own).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines = []
    try:
        for line in process.stdout:  # a line per epoch: stdout is a pipe
            lines.append(line)
            if line.startswith("Epoch 3/"):
                break
        time.sleep(0.4)  # into the epoch's steps, where the main thread waits for each step's logs
        process.send_signal(signum)
        sent = time.monotonic()
        output, _ = process.communicate(timeout=120)
    finally:
        process.kill()  # a run that went on
    lines += output.splitlines(keepends=True)
    assert process.returncode == 128 + signum, "".join(lines)[-3000:]
    assert time.monotonic() - sent < 60  # not the 197 epochs left (about 1 s each)
    how = "interrupted" if signum == signal.SIGINT else "stopped by SIGTERM"
    # Saved where it stopped: in epoch 3 or later (a stop after an epoch's last step ends that epoch).
    where = r"(step \d+ of epoch ([3-9]|\d\d)|epoch ([3-9]|\d\d))"
    assert re.search(rf"keras-vit train: {how}; the same command goes on after {where}\n", "".join(lines))
    assert sum(line.startswith("Epoch ") for line in lines) < 20
