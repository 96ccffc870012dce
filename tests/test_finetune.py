"""The fine-tune controls under whichever backend this run uses: per-layer learning rates (layer
decay, head scale) in the optimizers' update, the linear probe (`freeze_backbone`), and both under
the data-parallel distributions (JAX virtual devices, TensorFlow's mirrored strategy); and the
one-line refusal of a from-scratch run on a folder, before Keras loads."""

import json
import os
import subprocess
import sys
import textwrap
import time

import keras
import numpy as np
import pytest
from helpers import jax_devices_env, write_image_folder

import keras_vit
from keras_vit.training import TrainConfig, fit
from keras_vit.training.optimizers import FusedAdamW, FusedSGD
from keras_vit.training.recipes import layer_rates

TINY = dict(image_size=16, patch_size=4, hidden_size=32, num_layers=2, num_heads=2, mlp_dim=64)


def _weights(model):
    return {v.path: keras.ops.convert_to_numpy(v) for v in model.weights}


def test_layer_rates_follow_beit_layer_ids():
    model = keras_vit.ViT(keras_vit.ViTConfig(**TINY, num_classes=3))
    rates = layer_rates(model.trainable_variables, 2, layer_decay=0.5, head_scale=10.0)
    assert rates["patch_embedding/projection/kernel"] == rates["position_embedding/embedding"] == 0.5**3
    assert rates["block_0/attention/qkv/kernel"] == 0.25 and rates["block_1/mlp/fc2/bias"] == 0.5
    assert rates["head/kernel"] == rates["head/bias"] == 10.0
    assert "encoder_norm/gamma" not in rates  # the top layer learns at the rate itself
    assert layer_rates(model.trainable_variables, 2) == {}


@pytest.mark.parametrize("optimizer_class", [FusedSGD, FusedAdamW])
def test_each_variable_steps_at_its_own_rate_with_its_weight_decay(optimizer_class):
    """The first step of SGD (momentum) moves a variable by lr x factor x gradient, of AdamW by
    lr x factor (its normalised gradient is 1), plus AdamW's decay of lr x factor x wd x value:
    the factor applies on every backend (TensorFlow's fused kernels, Keras's update elsewhere)."""
    fast, slow, plain = (keras.Variable(np.full((3,), 2.0, "float32"), name=n) for n in ("fast", "slow", "plain"))
    variables = [fast, slow, plain]
    # The factors are found by path among the optimizer's variables: these have their own names.
    rates = {fast.path: 3.0, slow.path: 0.25}
    decay = dict(weight_decay=0.1) if optimizer_class is FusedAdamW else {}
    extra = dict(momentum=0.9) if optimizer_class is FusedSGD else {}
    optimizer = optimizer_class(learning_rate=0.01, rates=rates, **decay, **extra)
    optimizer.build(variables)
    optimizer.apply([keras.ops.ones((3,))] * 3, variables)
    for variable, factor in ((fast, 3.0), (slow, 0.25), (plain, 1.0)):
        moved = 2.0 - keras.ops.convert_to_numpy(variable)
        expected = 0.01 * factor * (1.0 + (0.1 * 2.0 if decay else 0.0))
        np.testing.assert_allclose(moved, expected, rtol=1e-3)
    config = optimizer.get_config()
    assert config["rates"] == rates and optimizer_class.from_config(config).rates == rates


def test_a_linear_probe_trains_the_head_alone_on_features_computed_once(tmp_path, caplog):
    """A probe of a checkpoint: `best.keras` keeps the backbone bit for bit and holds a trained
    head, which classifies the held-out digits well above chance; the features were computed
    once (one log line), not per epoch."""
    keras.utils.set_random_seed(0)
    backbone = keras_vit.ViT(keras_vit.ViTConfig(**TINY, num_classes=10), class_names=list("0123456789"))
    backbone.save(tmp_path / "backbone.keras")
    config = TrainConfig(
        run_dir=str(tmp_path / "probe"), weights=str(tmp_path / "backbone.keras"), freeze_backbone=True, epochs=10
    )
    with caplog.at_level("INFO", logger="keras_vit"):
        result = fit(config, verbose=0)
    assert caplog.text.count("features of 1438 training images computed once") == 1, caplog.text
    assert "linear probe (backbone frozen)" in caplog.text
    probed = _weights(keras.saving.load_model(tmp_path / "probe" / "best.keras"))
    for path, value in _weights(backbone).items():
        if not path.startswith("head/"):
            np.testing.assert_array_equal(probed[path], value, err_msg=path)
    assert np.abs(probed["head/kernel"]).max() > 0.01
    assert result["top1"] > 0.25, result  # random features of a small ViT, a linear head; chance: 0.1


def test_a_probe_needs_weights_and_no_augmentation():
    with pytest.raises(ValueError, match="give the weights to start from"):
        TrainConfig(freeze_backbone=True)
    with pytest.raises(ValueError, match="without augmentation: randaugment, mixup cannot apply"):
        TrainConfig(freeze_backbone=True, weights="w.keras", mixup=0.2, randaugment=0.5)
    with pytest.raises(ValueError, match=r"layer decay must be in \(0, 1\]"):
        TrainConfig(layer_decay=1.5)
    adamw = TrainConfig(dataset="x", weights="w", recipe="finetune-adamw").resolved()
    assert (adamw.layer_decay, adamw.learning_rate, adamw.base_batch_size, adamw.weight_decay) == (
        0.65,
        5e-4,
        256,
        0.05,
    )
    assert adamw.clip_norm is None and adamw.label_smoothing == 0.1
    probe = TrainConfig(dataset="x", weights="w", freeze_backbone=True).resolved()
    assert (probe.recipe, probe.learning_rate, probe.base_batch_size, probe.epochs) == ("finetune", 0.1, 256, 90)
    assert probe.layer_decay is None and probe.clip_norm is None


@pytest.mark.tensorflow_only
def test_a_folder_without_weights_or_preset_is_refused_in_one_line_before_keras_loads(tmp_path):
    write_image_folder(tmp_path / "photos", (("cat", 2), ("dog", 2)))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    began = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "keras_vit_cli", "train", "--dataset", str(tmp_path / "photos")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    took = time.monotonic() - began
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert "would train ViT-B/16 (86M parameters) from random weights, the paper's worst case" in result.stderr
    assert f"`keras-vit train --dataset {tmp_path / 'photos'} --weights vit_s16.augreg_in21k_ft_in1k`" in result.stderr
    assert took < 1.5, took  # Keras and TensorFlow take seconds to import
    assert not (tmp_path / "photos" / ".keras_vit_index.json").exists()  # the folder was not read
    with pytest.raises(ValueError, match="the paper's worst case"):  # the Python API refuses it too
        fit(TrainConfig(dataset=str(tmp_path / "photos"), run_dir=str(tmp_path / "run")))


# The probe or the layer-decay fine-tune of a tiny checkpoint, under a data-parallel distribution.
# One run per process: two tf.distribute strategies in one process may reuse collective keys.
_DATA_PARALLEL = """
import json, keras, keras_vit
from keras_vit.training import TrainConfig, fit
keras.utils.set_random_seed(0)
tiny = keras_vit.ViT(keras_vit.ViTConfig(**{tiny!r}, num_classes=10), class_names=list("0123456789"))
tiny.save({checkpoint!r})
options = dict(
    probe=dict(freeze_backbone=True, epochs=10),
    decay=dict(recipe="finetune-adamw", learning_rate=2e-3, base_batch_size=32, epochs=2),
)
config = TrainConfig(run_dir={run_dir!r}, weights={checkpoint!r}, **options[{name!r}], **{extra!r})
print("RESULT", json.dumps(fit(config, verbose=0)))
"""


def _data_parallel(tmp_path, name, env, extra, prelude=""):
    """`(result, log)` of the run `name` ("probe" or "decay") in a fresh process."""
    checkpoint, run_dir = str(tmp_path / f"{name}.keras"), str(tmp_path / name)
    code = prelude + _DATA_PARALLEL.format(tiny=TINY, checkpoint=checkpoint, run_dir=run_dir, name=name, extra=extra)
    script = "import logging\nlogging.basicConfig(level=logging.INFO)\n" + textwrap.dedent(code)
    env = {**{k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}, "TF_CPP_MIN_LOG_LEVEL": "3", **env}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT ")), result.stderr


@pytest.mark.slow  # two fresh processes: about a minute
@pytest.mark.skipif(keras.backend.backend() != "jax", reason="Keras DataParallel on virtual JAX devices")
def test_probe_and_layer_decay_train_data_parallel_on_two_jax_devices(tmp_path):
    env = jax_devices_env(2)
    probe, probe_log = _data_parallel(tmp_path, "probe", env, {})
    decay, decay_log = _data_parallel(tmp_path, "decay", env, {})
    assert "DataParallel" in probe_log and "linear probe (backbone frozen)" in probe_log
    assert "DataParallel" in decay_log and "layer decay 0.65" in decay_log
    assert probe["num_examples"] == decay["num_examples"] == 359
    assert probe["top1"] > 0.25 and decay["top1"] > 0.15, (probe, decay)  # chance: 0.1


@pytest.mark.slow  # two fresh processes: about a minute
@pytest.mark.tensorflow_only
def test_probe_and_layer_decay_train_mirrored_on_two_logical_cpus(tmp_path):
    prelude = """
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
"""
    env, extra = {"KERAS_BACKEND": "tensorflow"}, {"strategy": "mirrored"}
    probe, probe_log = _data_parallel(tmp_path, "probe", env, extra, prelude)
    decay, decay_log = _data_parallel(tmp_path, "decay", env, extra, prelude)
    assert "training on mirrored over" in probe_log and "training on mirrored over" in decay_log, probe_log[-2000:]
    assert "linear probe (backbone frozen)" in probe_log and "layer decay 0.65" in decay_log
    assert probe["top1"] > 0.25 and decay["top1"] > 0.15, (probe, decay)  # chance: 0.1
