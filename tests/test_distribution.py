"""Scale-out under JAX, proven on one machine: virtual CPU devices
(`--xla_force_host_platform_device_count`) and several local processes talking over Gloo.
Each case runs in fresh processes, as a user's job would."""

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import keras
import numpy as np
import pytest
import yaml
from helpers import jax_devices_env

import keras_vit

pytestmark = pytest.mark.skipif(keras.backend.backend() != "jax", reason="Keras distribution API on JAX devices")

# The console script installed beside this Python (CI runs without the environment on PATH).
KERAS_VIT = str(Path(sys.executable).parent / "keras-vit")
TINY = dict(image_size=16, patch_size=4, hidden_size=32, num_layers=2, num_heads=4, mlp_dim=64)


def _env(devices):
    return jax_devices_env(devices, {k: v for k, v in os.environ.items() if not k.startswith("KERAS_DISTRIBUTION")})


def _python(code, devices):
    """Runs `code` in a fresh Python on `devices` virtual CPU devices; its last stdout line, as JSON."""
    script = "import json\nimport numpy as np\nimport keras\n" + textwrap.dedent(code)
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=_env(devices), timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


MODEL_SETUP = f"""
from keras_vit import ViT, ViTConfig
config = ViTConfig(**{TINY!r}, num_classes=10)
images = np.random.RandomState(0).uniform(0, 255, (8, 16, 16, 3)).astype("float32")
labels = keras.utils.to_categorical(np.arange(8) % 10, 10)

def build():
    keras.utils.set_random_seed(1)
    model = ViT(config)
    model.compile(optimizer=keras.optimizers.AdamW(1e-2), loss=keras.losses.CategoricalCrossentropy(from_logits=True))
    return model

def difference(model, values):
    return float(max(np.abs(keras.ops.convert_to_numpy(v.value) - values[v.path]).max() for v in model.weights))

reference = build()
initial = {{v.path: keras.ops.convert_to_numpy(v.value) for v in reference.weights}}
reference_logits = reference.predict(images, verbose=0)
reference.train_on_batch(images, labels)
stepped = {{v.path: keras.ops.convert_to_numpy(v.value) for v in reference.weights}}
"""


# (8, 4): the same code on a larger mesh, with -m slow
@pytest.mark.parametrize("devices, ways", [(4, 2), pytest.param(8, 4, marks=pytest.mark.slow)])
def test_model_parallel_splits_the_blocks_and_changes_no_number(devices, ways, tmp_path):
    """`ViT.get_layout_map`: the qkv/out/fc1/fc2 kernels sharded over the model axis, 1/ways of
    their bytes per device; logits and one AdamW step as the unsharded model; `.keras` files
    move between sharded and unsharded models both ways."""
    result = _python(
        MODEL_SETUP
        + f"""
import jax
unsharded_file = {str(tmp_path / "unsharded.keras")!r}
sharded_file = {str(tmp_path / "sharded.keras")!r}
reference.save(unsharded_file)
mesh = keras.distribution.DeviceMesh(({devices // ways}, {ways}), ("batch", "model"), jax.devices())
distribution = keras.distribution.ModelParallel(layout_map=ViT.get_layout_map(mesh), batch_dim_name="batch")
out = {{}}
with distribution.scope():
    model = build()
    for v in model.weights:
        v.assign(initial[v.path])
    out["logits"] = float(np.abs(model.predict(images, verbose=0) - reference_logits).max())
    out["specs"] = {{v.path: list(v.value.sharding.spec) for v in model.weights if v.path.startswith("block_0/")}}
    out["bytes"] = {{
        v.path: [v.value.addressable_shards[0].data.nbytes, v.value.nbytes]
        for v in model.weights
        if v.path.startswith("block_0/") and v.path.endswith("kernel")
    }}
    model.train_on_batch(images, labels)
    out["step"] = difference(model, stepped)
    out["slots"] = {{
        v.path: list(v.value.sharding.spec) for v in model.optimizer.variables if "block_0_mlp_fc1_kernel" in v.path
    }}
    model.save(sharded_file)
    loaded = keras.saving.load_model(unsharded_file)  # an unsharded file into the sharded layout
    out["loaded_spec"] = list(loaded.get_layer("block_1").mlp.fc2.kernel.value.sharding.spec)
    out["loaded"] = difference(loaded, stepped)
plain = keras.saving.load_model(sharded_file)  # a sharded model's file, loaded on one device
out["plain_devices"] = len(plain.weights[0].value.sharding.device_set)
out["plain"] = difference(plain, stepped)
print(json.dumps(out))
""",
        devices,
    )
    assert result["logits"] <= 1e-5 and result["step"] <= 1e-5, result
    specs = result["specs"]
    assert specs["block_0/attention/qkv/kernel"] == specs["block_0/mlp/fc1/kernel"] == [None, "model"]
    assert specs["block_0/attention/out/kernel"] == specs["block_0/mlp/fc2/kernel"] == ["model", None]
    assert specs["block_0/attention/qkv/bias"] == specs["block_0/mlp/fc1/bias"] == ["model"]
    assert "model" not in specs["block_0/norm1/gamma"] + specs["block_0/mlp/fc2/bias"]
    for path, (per_device, total) in result["bytes"].items():
        assert per_device * ways == total, path
    assert all("model" in spec for spec in result["slots"].values()) and len(result["slots"]) == 2
    assert result["loaded_spec"] == ["model", None] and result["loaded"] <= 1e-6
    assert result["plain_devices"] == 1 and result["plain"] <= 1e-6


# 4 devices: the same code and 7 images over another device count, with -m slow
@pytest.mark.parametrize("devices", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_data_parallel_step_and_predict_match_one_device(devices, tmp_path):
    """One AdamW step of a global batch split over the devices equals the one-device step;
    `keras_vit.training.predict` of 7 images (dividing by no device count) matches too."""
    result = _python(
        MODEL_SETUP
        + f"""
import jax
from keras_vit.training import predict
path = {str(tmp_path / "model.keras")!r}
keras.saving.save_model(reference, path)
pictures = list(np.random.RandomState(1).randint(0, 256, (7, 20, 20, 3)).astype("uint8"))
alone = predict(path, pictures, top_k=3)
keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices()))
model = build()
for v in model.weights:
    v.assign(initial[v.path])
model.train_on_batch(images, labels)
parallel = predict(path, pictures, top_k=3)
print(json.dumps({{
    "step": difference(model, stepped),
    "same_labels": [[l for l, _ in a] for a in alone] == [[l for l, _ in p] for p in parallel],
    "probabilities": max(abs(x[1] - y[1]) for a, p in zip(alone, parallel) for x, y in zip(a, p)),
    "count": len(parallel),
}}))
""",
        devices,
    )
    assert result["step"] <= 1e-5, result
    assert result["count"] == 7 and result["same_labels"] and result["probabilities"] <= 1e-5, result


def test_accumulation_makes_the_whole_batch_step_over_data_and_model_parallel():
    """Two accumulated micro-batches of 4 make the recipe's AdamW step of the batch of 8, with
    the batch split over 4 devices (DataParallel) and over a 2 x 2 mesh (ModelParallel)."""
    result = _python(
        MODEL_SETUP
        + """
import jax
from keras_vit.training import TrainConfig, recipes

def optimizer(accumulate, batch):
    config = TrainConfig(
        dataset="x", accumulate=accumulate, learning_rate=1e-2, base_batch_size=8, warmup_fraction=0.0
    ).resolved()
    return recipes.build_optimizer(config, steps_per_epoch=accumulate, global_batch=batch, epochs=1)

mesh = keras.distribution.DeviceMesh((2, 2), ("batch", "model"), jax.devices())
distributions = {
    "data": keras.distribution.DataParallel(devices=jax.devices()),
    "model": keras.distribution.ModelParallel(layout_map=ViT.get_layout_map(mesh), batch_dim_name="batch"),
}
# Off the initial values (a zero head would leave the blocks without gradients).
noise = np.random.RandomState(2)
perturbed = {k: (v + 0.05 * noise.standard_normal(v.shape)).astype(v.dtype) for k, v in initial.items()}
out = {}
for name, distribution in distributions.items():
    with distribution.scope():
        weights = []
        for accumulate, batch in ((2, 4), (1, 8)):
            model = build()
            for v in model.weights:
                v.assign(perturbed[v.path])
            model.compile(optimizer=optimizer(accumulate, batch), loss=keras.losses.MeanSquaredError())
            for first in range(0, 8, batch):
                model.train_on_batch(images[first : first + batch], labels[first : first + batch])
            weights.append({v.path: keras.ops.convert_to_numpy(v.value) for v in model.weights})
        moved = max(float(np.abs(weights[1][k] - perturbed[k]).max()) for k in perturbed)
        out[name] = [difference(model, weights[0]), moved]
print(json.dumps(out))
""",
        4,
    )
    for name, (difference, moved) in result.items():
        assert moved > 5e-3 and difference <= 1e-5, (name, result)


def test_train_accumulates_and_rematerialises_on_a_model_parallel_mesh(tmp_path):
    """`train --accumulate 2 --remat --model-parallel 2` on 4 devices: micro-batches of 64,
    optimizer steps of 128, blocks rematerialised, every held-out digit counted once."""
    (job,) = _train(tmp_path, tmp_path / "run", 4, extra=("--accumulate", "2", "--remat", "--model-parallel", "2"))
    ((out, err),) = _finish([job])
    assert "mesh 2 x 2 (batch x model), global batch 128 (2 x 64), XLA, blocks rematerialised" in err, err[-2000:]
    assert "2 epochs of 22 steps (11 optimizer updates of 2 accumulated)" in err
    assert json.loads(out.splitlines()[-1])["num_examples"] == 359


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _train(tmp_path, run_dir, devices, processes=1, extra=()):
    """Starts `keras-vit train` on `devices` virtual devices per process, `processes` processes."""
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({"model": TINY, "epochs": 2, "checkpoint_interval": 0}))
    command = [KERAS_VIT, "train", "--config", str(config), "--run-dir", str(run_dir), *extra]
    if processes == 1:
        return [subprocess.Popen(command, env=_env(devices), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
    address = f"localhost:{_free_port()}"
    return [
        subprocess.Popen(
            [*command, "--num-processes", str(processes), "--process-id", str(i), "--job-addresses", address],
            env=_env(devices),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(processes)
    ]


def _finish(jobs):
    outputs = [job.communicate(timeout=600) for job in jobs]
    for job, (_, err) in zip(jobs, outputs):
        assert job.returncode == 0, err[-3000:]
    return outputs


def _weights(path):
    model = keras_vit.saving.load_model(path)
    return {v.path: keras.ops.convert_to_numpy(v.value) for v in model.weights}


# Model parallel over processes: each process holds one replica split over its 2 devices, the
# batch axis runs over the processes (a 2 x 2 mesh). Slow (about 70 s on 2 cores), as is its resume.
PROCESS_MESHES = [
    pytest.param((), "DataParallel over 4 cpu devices in 2 processes", id="data"),
    pytest.param(
        ("--model-parallel", "2"),
        "ModelParallel over 4 cpu devices in 2 processes, mesh 2 x 2 (batch x model)",
        id="model",
        marks=pytest.mark.slow,
    ),
]


@pytest.mark.parametrize("flags, placement", PROCESS_MESHES)
def test_two_processes_train_as_one_four_device_job(flags, placement, tmp_path):
    """Two processes of two devices each (Gloo on localhost) end with the weights and the
    evaluation of one process with four devices; only process 0 writes the run directory."""
    together, alone = tmp_path / "processes", tmp_path / "one"
    outputs = _finish(_train(tmp_path, together, 2, processes=2, extra=flags) + _train(tmp_path, alone, 4, extra=flags))
    assert placement in outputs[0][1]
    # process 1 reports nothing (Gloo's own connection lines aside)
    assert all(line.startswith("[Gloo]") for line in outputs[1][0].splitlines()), outputs[1][0][-2000:]
    first, second = json.loads(outputs[0][0].splitlines()[-1]), json.loads(outputs[2][0].splitlines()[-1])
    assert first["num_examples"] == second["num_examples"] == 359
    assert abs(first["top1"] - second["top1"]) < 1e-6
    a, b = _weights(together / "best.keras"), _weights(alone / "best.keras")
    assert max(float(np.abs(a[k] - b[k]).max()) for k in a) <= 1e-5
    assert not list(together.glob("worker_*"))  # process 1's resume state is gone at the end


# Both meshes with the slow tests (CI runs them after the suite): the default suite's two-process
# job above proves the processes train as one, and a killed single-process run's resume is
# tested in test_training.
@pytest.mark.slow
@pytest.mark.parametrize("flags, placement", PROCESS_MESHES)
def test_processes_resume_after_one_is_killed(flags, placement, tmp_path):
    """SIGKILL one process after its first epoch; the job, started again, goes on from the
    last saved epoch instead of starting over."""
    run_dir = tmp_path / "run"
    extra = ("--epochs", "4", *flags)
    jobs = _train(tmp_path, run_dir, 2, processes=2, extra=extra)
    log = run_dir / "log.csv"
    deadline = time.monotonic() + 300
    while not (log.is_file() and len(log.read_text().splitlines()) >= 2):  # header + 1 epoch
        assert time.monotonic() < deadline and all(job.poll() is None for job in jobs), "no epoch finished"
        time.sleep(0.2)
    jobs[1].send_signal(signal.SIGKILL)
    jobs[0].send_signal(signal.SIGKILL)  # what a cluster scheduler does to the rest of a failed job
    for job in jobs:
        job.communicate(timeout=60)
    done_before = len(log.read_text().splitlines()) - 1
    assert done_before < 4
    outputs = _finish(_train(tmp_path, run_dir, 2, processes=2, extra=extra))
    assert placement in outputs[0][1] and "resuming after epoch" in outputs[0][1]
    with log.open(newline="") as file:
        epochs = [int(row["epoch"]) for row in csv.DictReader(file)]
    # Each epoch once (resumed, not restarted); a kill between an epoch's resume state and its
    # log line may leave that one epoch out of log.csv.
    assert len(set(epochs)) == len(epochs) >= 3 and epochs == sorted(epochs) and epochs[-1] == 3, epochs
    assert json.loads(outputs[0][0].splitlines()[-1])["num_examples"] == 359
