"""The package as a user installs it: `python -m build` makes the sdist and, from it, the wheel; the
wheel goes into a fresh virtual environment with the extras of the README's install line (no
dev extra, no checkout), then the README's verbs run there: `keras-vit --help`, `doctor`, a
1-epoch digits `train` and `export` (default suite, about 3 minutes on 2 cores, most of it pip).
Marked slow as well (about 2 minutes more): `inspect`, and `keras-vit doctor --install-optional`
bringing the no-deps packages from the list shipped in the wheel, after which the export's
warm-up requests and pruning work; and the onnx and openvino extras, exporting and answering
`predict` (about 100 MB of packages more)."""

import configparser
import json
import os
import re
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

# One worker builds and installs once for the module's tests.
pytestmark = [pytest.mark.install, pytest.mark.tensorflow_only, pytest.mark.xdist_group("install")]

ROOT = Path(__file__).resolve().parents[1]


def _metadata():
    options = configparser.ConfigParser()
    options.read(ROOT / "setup.cfg")
    return options["metadata"]


NAME = _metadata()["name"]
VERSION = re.search(r'__version__ = "([^"]+)"', (ROOT / "keras_vit" / "__init__.py").read_text()).group(1)
# The extras of the README's install line, as a user copies it (the first: the CPU install; the
# GPU lines after it add a CUDA build of the backend).
EXTRAS = re.findall(rf'pip install "{re.escape(NAME)}\[([a-z,-]+)\]"', (ROOT / "README.md").read_text())[0]


def run(*command, expect=0, env=None, cwd=None, timeout=1200):
    result = subprocess.run(
        [str(c) for c in command], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout
    )
    if result.returncode != expect:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-25:])
        pytest.fail(f"`{' '.join(map(str, command))}` exited {result.returncode}, expected {expect}:\n{tail}")
    return result


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The sdist and the wheel `python -m build` makes (the wheel built from the sdist, so a file
    the sdist leaves out is missing from the wheel too)."""
    dist = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, ROOT, timeout=600)
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")
    return sdist, wheel


@pytest.fixture(scope="module")
def installed(built, tmp_path_factory):
    """A fresh venv with the README's `pip install "NAME[EXTRAS]"` from the built wheel, its
    dependencies at the project's pinned versions."""
    _, wheel = built
    home = tmp_path_factory.mktemp("install")
    venv.EnvBuilder(with_pip=True).create(home / "venv")
    python = home / "venv" / "bin" / "python"
    constraints = ROOT / "requirements" / "constraints.txt"
    run(python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "-c", constraints, f"{wheel}[{EXTRAS}]")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_USE_LEGACY_KERAS", "PYTHONPATH", "VIRTUAL_ENV")
    }
    env["KERAS_BACKEND"] = "tensorflow"
    return home, home / "venv" / "bin", env


def test_the_distributions_carry_the_licence_metadata_and_the_no_deps_list(built):
    sdist, wheel = built
    version = VERSION
    assert wheel.name == f"{NAME.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as files:
        names = set(files.namelist())
        info = f"{NAME.replace('-', '_')}-{version}.dist-info"
        metadata = files.read(f"{info}/METADATA").decode()
        shipped = files.read("keras_vit_cli/no-deps.txt").decode()
        assert files.read(f"{info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
    assert shipped == (ROOT / "cli" / "no-deps.txt").read_text()
    assert {"keras_vit/__init__.py", "keras_vit/training/__init__.py", "keras_vit_cli/__init__.py"} <= names
    assert f"Name: {NAME}\n" in metadata and f"Version: {version}\n" in metadata
    assert "License: Apache-2.0" in metadata or "License-Expression: Apache-2.0" in metadata
    urls = dict(re.findall(r"^Project-URL: ([^,]+), (\S+)$", metadata, re.MULTILINE))
    assert {"Source", "Issues", "Changelog", "Documentation"} <= set(urls), urls
    with tarfile.open(sdist) as archive:
        members = {m.split("/", 1)[1] for m in archive.getnames() if "/" in m}
    assert {"LICENSE", "README.md", "setup.cfg", "pyproject.toml", "cli/no-deps.txt"} <= members


def test_installed_command_trains_and_exports(installed):
    home, bin_dir, env = installed
    keras_vit = bin_dir / "keras-vit"
    assert "train" in run(keras_vit, "--help", env=env).stdout
    assert run(keras_vit, "--version", env=env).stdout.strip() == f"keras-vit {VERSION}"
    doctor = run(keras_vit, "doctor", env=env).stdout
    assert "tf-keras: missing" in doctor and "[training] tensorflow-datasets" in doctor, doctor
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
    # nor the onnx extra, which these extras leave out: one line naming it
    onnx = run(keras_vit, "export", home / "run", "--onnx", home / "onnx", env=env, expect=2)
    assert onnx.stderr.strip().splitlines() == [
        "keras-vit export: error: ONNX files need onnx, onnxruntime and tf2onnx, which are not installed: pip install "
        '"keras3-vit[onnx]".'
    ]


@pytest.mark.slow
def test_installed_inspect_and_the_optional_packages_from_the_package(installed):
    home, bin_dir, env = installed
    keras_vit = bin_dir / "keras-vit"
    run(keras_vit, "train", "--dataset", "digits", "--epochs", "1", "--run-dir", home / "run2", env=env, cwd=home)
    run(keras_vit, "inspect", home / "run2", "--out", home / "figures", env=env)
    assert (home / "figures" / "rollout.png").is_file()
    # The no-deps step from the installed package alone (no checkout, no requirements/ folder).
    run(keras_vit, "doctor", "--install-optional", env=env, cwd=home, timeout=1800)
    doctor = run(keras_vit, "doctor", env=env).stdout
    assert "missing" not in doctor.split("optional,")[1], doctor
    served = run(keras_vit, "export", home / "run2", "--saved-model", home / "serving2", env=env)
    warmup = home / "serving2" / "vit" / "1" / "assets.extra" / "tf_serving_warmup_requests"
    assert warmup.is_file() and "tensorflow-serving-api" not in served.stderr
    run(
        keras_vit,
        "export",
        home / "run2",
        "--tflite",
        home / "pruned2",
        "--quantize",
        "float32",
        "--prune",
        "0.5",
        "--finetune-epochs",
        "1",
        env=env,
    )
    assert (home / "pruned2" / "vit_pruned50_float32.tflite").is_file()


@pytest.mark.slow
def test_installed_onnx_and_openvino_extras_export_and_predict(built, installed):
    """The onnx and openvino extras from the wheel (about 100 MB of packages, NNCF's int8 included)
    export the digits run and answer `predict`."""
    _, wheel = built
    home, bin_dir, env = installed
    constraints = ROOT / "requirements" / "constraints.txt"
    run(
        bin_dir / "python",
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
        "-c",
        constraints,
        f"{wheel}[{EXTRAS},onnx,openvino]",
    )
    keras_vit = bin_dir / "keras-vit"
    if not (home / "run" / "best.keras").is_file():
        run(keras_vit, "train", "--dataset", "digits", "--epochs", "1", "--run-dir", home / "run", env=env, cwd=home)
    exported = run(
        keras_vit,
        "export",
        home / "run",
        "--onnx",
        home / "onnx",
        "--onnx-quantize",
        "float32",
        "int8",
        "--openvino",
        home / "openvino",
        "--openvino-precision",
        "float32",
        "int8",
        env=env,
    )
    for row in ("vit_int8.onnx", "vit_float32.xml (OpenVINO, f32)", "vit_int8.xml (OpenVINO, int8)"):
        assert f"| {row} |" in exported.stdout, row
    digit = home / "digit.png"
    from PIL import Image

    Image.new("RGB", (8, 8)).save(digit)
    for model in (home / "onnx" / "vit_int8.onnx", home / "openvino" / "vit_int8.xml"):
        answer = run(keras_vit, "predict", model, digit, "--json", env=env).stdout
        assert len(json.loads(answer)["top_k"]) == 5
