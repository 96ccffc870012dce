"""The package as a user installs it: the wheel with the extras setup.cfg declares, in a fresh
virtual environment (no dev extra, no requirements/no-deps.txt), then the README's verbs."""

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

pytestmark = [pytest.mark.install, pytest.mark.tensorflow_only]

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = "tensorflow-cpu,training,export,inspect"


def run(*command, expect=0, env=None, cwd=None, timeout=1200):
    result = subprocess.run(
        [str(c) for c in command], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout
    )
    if result.returncode != expect:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-25:])
        pytest.fail(f"`{' '.join(map(str, command))}` exited {result.returncode}, expected {expect}:\n{tail}")
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh venv with `keras-vit[tensorflow-cpu,training,export,inspect]` from the built wheel,
    its dependencies at the project's pinned versions."""
    home = tmp_path_factory.mktemp("install")
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", home / "dist", ROOT)
    (wheel,) = (home / "dist").glob("keras_vit-*.whl")
    venv.EnvBuilder(with_pip=True).create(home / "venv")
    python = home / "venv" / "bin" / "python"
    run(
        python,
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
        "-c",
        ROOT / "requirements" / "constraints.txt",
        f"{wheel}[{EXTRAS}]",
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_USE_LEGACY_KERAS", "PYTHONPATH", "VIRTUAL_ENV")
    }
    env["KERAS_BACKEND"] = "tensorflow"
    return home, home / "venv" / "bin", env


def test_installed_command_trains_and_exports(installed):
    home, bin_dir, env = installed
    keras_vit = bin_dir / "keras-vit"
    assert "train" in run(keras_vit, "--help", env=env).stdout
    trained = run(
        keras_vit, "train", "--dataset", "digits", "--epochs", "1", "--run-dir", home / "run", env=env, cwd=home
    )
    assert json.loads(trained.stdout.strip().splitlines()[-1])["num_examples"] == 359
    exported = run(
        keras_vit,
        "export",
        home / "run",
        "--saved-model",
        home / "serving",
        "--tflite",
        home / "tflite",
        "--quantize",
        "float32",
        "int8",
        env=env,
    )
    assert "| vit_int8.tflite |" in exported.stdout
    assert (home / "serving" / "vit" / "1" / "saved_model.pb").is_file()
    # tensorflow-serving-api is not in the extras: the SavedModel comes without warm-up requests, said in one line
    extra = home / "serving" / "vit" / "1" / "assets.extra"
    assert sorted(p.name for p in extra.iterdir()) == ["data_split.json"]  # the run's split only
    assert "pip install --no-deps tensorflow-serving-api" in exported.stderr
    # tf-keras and tfmot are not either: one line naming what to install, no traceback
    pruned = run(keras_vit, "export", home / "run", "--tflite", home / "pruned", "--prune", "0.5", env=env, expect=2)
    assert (
        pruned.stderr.strip().splitlines() == [pruned.stderr.strip()]
        and "pip install --no-deps tf-keras" in pruned.stderr
    )
