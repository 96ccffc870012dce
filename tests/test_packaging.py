import configparser
import importlib
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_install_names_map_to_project_folders():
    for name, folder in [
        ("keras_vit", "keras_vit"),
        ("keras_vit.training", "training"),
        ("keras_vit.export", "export"),
    ]:
        module = importlib.import_module(name)
        assert Path(module.__file__).resolve() == ROOT / folder / "__init__.py"


def test_setup_cfg_lists_every_package():
    """A wheel holds only the packages setup.cfg names (an editable install hides a missing one)."""
    options = configparser.ConfigParser()
    options.read(ROOT / "setup.cfg")
    listed = set(options["options"]["packages"].split())
    folders = dict(line.split(" = ") for line in options["options"]["package_dir"].strip().splitlines())
    found = set()
    for name, folder in folders.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            found.add(".".join([name, *init.parent.relative_to(ROOT / folder).parts]))
    assert found - listed == set() and "keras_vit.checkpoints" in found


# Modules that import a framework lazily, only where it is there: the torch checkpoint reader
# (torch.load reads a file format), JAX's stateless `predict_on_batch` and GPU training attention,
# the initializers' check for a JAX trace, TensorFlow's training kernels and frozen inference
# (each taken on its own backend only), and the TensorFlow image decoder of training and export.
ALLOWED = {
    "keras_vit/checkpoints/files.py": ("import torch",),
    "keras_vit/initializers.py": ("import jax",),
    "keras_vit/jax_attention.py": ("import jax",),
    "keras_vit/jax_predict.py": ("import jax",),
    "keras_vit/tf_images.py": ("import tensorflow",),
    "keras_vit/tf_kernels.py": ("import tensorflow",),
    "keras_vit/tf_predict.py": ("import tensorflow", "from tensorflow"),
}


def test_library_uses_keras_ops_only():
    """keras_vit/ must run on every Keras backend: no backend framework imports."""
    banned = ("import tensorflow", "from tensorflow", "import jax", "from jax", "import torch", "from torch")
    offenders = []
    for path in (ROOT / "keras_vit").rglob("*.py"):
        name = str(path.relative_to(ROOT))
        for line in path.read_text().splitlines():
            statement = line.strip().split("  #")[0]
            if statement.startswith(banned) and not statement.startswith(ALLOWED.get(name, ())):
                offenders.append(f"{name}: {statement}")
    assert offenders == []


@pytest.mark.tensorflow_only
@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="oneDNN is asked for on x86-64 only")
@pytest.mark.parametrize("setting, enabled", [(None, "True"), ("1", "True"), ("0", "False")])
def test_import_asks_tensorflow_for_onednn(setting, enabled):
    """`import keras_vit` before TensorFlow turns TensorFlow's oneDNN CPU kernels on (TensorFlow
    leaves them off on AVX2-only CPUs) unless TF_ENABLE_ONEDNN_OPTS says otherwise."""
    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    env.update({"KERAS_BACKEND": "tensorflow"}, **({"TF_ENABLE_ONEDNN_OPTS": setting} if setting else {}))
    code = (
        "import os, keras_vit; from tensorflow.python.util import _pywrap_util_port as port; "
        "print(os.environ['TF_ENABLE_ONEDNN_OPTS'], port.IsMklEnabled())"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split()[-2:] == [setting or "1", enabled]


GROUPED_MODULE = """
import os
import pytest

pytestmark = pytest.mark.xdist_group("shared")


@pytest.fixture(scope="module")
def shared():
    with open("setups.txt", "a") as log:
        log.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")


@pytest.mark.parametrize("i", range(6))
def test_grouped(shared, i):
    pass
"""


def test_xdist_groups_keep_their_tests_on_one_worker(tmp_path):
    """The suite's heavy module fixtures (a trained digits run, every export) are set up once
    because `--dist loadgroup` sends an `xdist_group` to one worker: with pytest 9.2 and
    pytest-xdist 3.8 it no longer did, and each worker trained and exported again."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_grouped.py").write_text(GROUPED_MODULE)
    (tmp_path / "test_other.py").write_text(
        "import pytest\n\n@pytest.mark.parametrize('i', range(12))\ndef test_other(i):\n    pass\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:]
    assert "18 passed" in result.stdout
    assert len((tmp_path / "setups.txt").read_text().split()) == 1
