#!/usr/bin/env python3
"""Developer entry point: creates .venv if needed, installs the pinned environment, runs a job.

    python3 dev.py demo    # set up, then the main job: train on digits, export SavedModel + int8 LiteRT
    python3 dev.py test    # set up, then ruff (lint + format check) and the test suite under TensorFlow, JAX, PyTorch
    python3 dev.py lint    # set up, then only ruff check and ruff format --check
    python3 dev.py docs    # set up, then the API reference (pdoc) in build/api/index.html
    python3 dev.py setup   # only set up
Extra arguments after `test` go to pytest (e.g. `python3 dev.py test -m slow`).
"""

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / "python"
INPUTS = ("setup.cfg", "pyproject.toml", "requirements/constraints.txt", "requirements/no-deps.txt", "cli/no-deps.txt")
# The project's name on the package index until 0.2.0, which is another project's there.
OLD_DISTRIBUTION = "keras-vit"


def run(*cmd, env=None):
    print("+", " ".join(str(c) for c in cmd), flush=True)
    return subprocess.call([str(c) for c in cmd], cwd=ROOT, env=env)


def setup():
    """Creates the virtual environment and installs the project with pinned dependencies,
    skipped when nothing that decides the environment has changed."""
    if sys.version_info < (3, 11):  # noqa: UP036 (dev.py runs under any python3)
        sys.exit(f"dev.py: Python 3.11+ is needed; this is {sys.version.split()[0]}.")
    digest = hashlib.sha256(b"".join((ROOT / f).read_bytes() for f in INPUTS)).hexdigest()
    stamp = VENV / ".keras-vit-installed"
    if stamp.exists() and stamp.read_text() == digest:
        return
    if not PYTHON.exists():
        print(f"creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    # A checkout installed as keras-vit (before 0.2.0) holds that editable install and its
    # metadata folder: both would still answer for the old name beside the new one.
    shutil.rmtree(ROOT / "keras_vit.egg-info", ignore_errors=True)
    if (
        PYTHON.exists()
        and subprocess.call([PYTHON, "-m", "pip", "show", "-q", OLD_DISTRIBUTION], cwd=VENV, stderr=subprocess.DEVNULL)
        == 0
    ):
        run(PYTHON, "-m", "pip", "uninstall", "--disable-pip-version-check", "-q", "-y", OLD_DISTRIBUTION)
    pip = [PYTHON, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    if run(*pip, "-c", "requirements/constraints.txt", "-e", ".[dev]") or run(
        *pip, "--no-deps", "-r", "requirements/no-deps.txt"
    ):
        sys.exit("dev.py: installing the environment failed (see pip's output above).")
    stamp.write_text(digest)


def backend_env(backend):
    return {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2"}


def test_env(backend, cache_dir):
    """A pass's environment: one OpenMP thread per test worker (two workers share the cores):
    PyTorch's OpenMP threads spin while they wait, and two workers' teams on 2 cores ran its
    tests up to 7x slower. Under JAX, whose eager ops each compile an XLA kernel per shape, the
    kernels compile with LLVM's optimisations off and are shared through a compilation cache in
    `cache_dir` by the workers and the processes the tests start (virtual devices, two-process
    jobs): about a quarter less time for the JAX pass, whose tests keep their margins."""
    env = {**backend_env(backend), "OMP_NUM_THREADS": "1"}
    if backend == "jax":
        env.update(
            XLA_FLAGS=" ".join([os.environ.get("XLA_FLAGS", ""), "--xla_backend_optimization_level=0"]).strip(),
            JAX_COMPILATION_CACHE_DIR=str(cache_dir),
            JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
            JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        )
    return env


def lint():
    """ruff's lint rules and formatting (pyproject.toml), checked, not applied."""
    return run(BIN / "ruff", "check", ".") | run(BIN / "ruff", "format", "--check", ".")


def docs():
    """The API reference from the public API's docstrings (pdoc), as HTML in build/api/
    (git-ignored); fails naming any public name without a docstring (docs/make_api.py)."""
    return run(PYTHON, "docs/make_api.py", env=backend_env("tensorflow"))


def test(pytest_args):
    """ruff, then the whole suite under TensorFlow, then the backend-agnostic tests under JAX and
    PyTorch (all of them, whatever ruff says)."""
    # A test worker that dies fails the test it ran and ends the pass: pytest-xdist's replacement
    # workers once left a run waiting until it was killed.
    base = [PYTHON, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "--max-worker-restart=0"]
    base += ["-p", "no:cacheprovider", "--durations=15"]
    marks = pytest_args if any(a.startswith("-m") for a in pytest_args) else ["-m", "not slow", *pytest_args]
    status = lint()
    with tempfile.TemporaryDirectory(prefix="keras-vit-xla-cache-") as cache_dir:
        for backend in ("tensorflow", "jax", "torch"):
            status |= run(*base, *marks, env=test_env(backend, cache_dir))
    return status


def main(argv):
    if not argv or argv[0] not in ("setup", "demo", "test", "lint", "docs"):
        print(__doc__)
        return 2
    setup()
    if argv[0] == "demo":
        # As a user runs the command: without TF_CPP_MIN_LOG_LEVEL, which would show TensorFlow's
        # start-up lines (keras-vit hides them unless the variable or --verbose asks for them).
        env = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
        env["KERAS_BACKEND"] = "tensorflow"
        return run(
            BIN / "keras-vit", "train", "--dataset", "digits", "--run-dir", "runs/digits", *argv[1:], env=env
        ) or run(
            BIN / "keras-vit",
            "export",
            "runs/digits",
            "--saved-model",
            "runs/digits/export/serving",
            "--tflite",
            "runs/digits/export/tflite",
            "--quantize",
            "float32",
            "int8",
            "--overwrite",
            env=env,
        )
    if argv[0] == "test":
        return test(argv[1:])
    if argv[0] == "lint":
        return lint()
    if argv[0] == "docs":
        return docs()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
