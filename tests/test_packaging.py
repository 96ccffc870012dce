import configparser
import importlib
import os
import platform
import re
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


@pytest.mark.backend_independent
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


def test_every_module_with_a_shared_fixture_keeps_it_on_one_worker():
    """A module- or session-scoped fixture in a module without an `xdist_group` is set up again on
    each worker that runs one of its tests (test_transfer.py trained its runs twice, about 55 s
    each): such a module names a group, as the test above proves keeps it on one worker."""
    ungrouped = [
        path.name
        for path in sorted((ROOT / "tests").glob("test_*.py"))
        if re.search(r"scope=\"(module|session)\"", text := path.read_text()) and "xdist_group(" not in text
    ]
    assert ungrouped == []


def _setup_cfg():
    options = configparser.ConfigParser()
    options.read(ROOT / "setup.cfg")
    return options


def _code_files():
    for folder in ("keras_vit", "cli", "training", "export", "benchmark"):
        yield from (ROOT / folder).rglob("*.py")


def test_one_distribution_name_in_setup_cfg_the_command_and_every_install_hint():
    """The package index's `keras-vit` is another project: every `pip install 'NAME[extra]'` the
    code prints, `keras-vit --version` and `doctor` name this one's, as setup.cfg does."""
    from keras_vit_cli import doctor_command

    name = _setup_cfg()["metadata"]["name"]
    assert name == doctor_command.DISTRIBUTION == "keras3-vit"
    hints = []
    for path in _code_files():
        hints += [(path.name, n) for n in re.findall(r"pip install ['\"]?([A-Za-z0-9_.{}-]+)\[", path.read_text())]
    assert hints and all(n in (name, "{DISTRIBUTION}", "{doctor_command.DISTRIBUTION}") for _, n in hints), hints
    readme = (ROOT / "README.md").read_text()
    assert f'pip install "{name}[' in readme and 'pip install "keras-vit[' not in readme


def test_the_no_deps_pins_ship_in_the_package_and_agree_with_the_hints():
    """`keras-vit doctor --install-optional` reads cli/no-deps.txt (package data); the checkout's
    requirements/no-deps.txt includes it, and the one-line hints of export pin the same versions."""
    from keras_vit_cli import doctor_command

    options = _setup_cfg()
    assert "no-deps.txt" in options["options.package_data"]["keras_vit_cli"]
    pins = dict(line.split("==") for line in doctor_command.no_deps_requirements())
    assert set(pins) == {"tf-keras", "tensorflow-model-optimization", "tensorflow-serving-api"}
    assert "-r ../cli/no-deps.txt" in (ROOT / "requirements" / "no-deps.txt").read_text().splitlines()
    hints = (ROOT / "export" / "tfmot_bridge.py").read_text() + (ROOT / "export" / "serving.py").read_text()
    for name, version in pins.items():
        assert f"{name}=={version}" in hints, name


def test_licence_urls_and_changelog_versions():
    metadata = _setup_cfg()["metadata"]
    assert metadata["license"] == "Apache-2.0" and metadata["license_files"] == "LICENSE"
    licence = (ROOT / "LICENSE").read_text()
    assert "Apache License" in licence and "Version 2.0, January 2004" in licence and "END OF TERMS" in licence
    urls = dict(line.split(" = ") for line in metadata["project_urls"].strip().splitlines())
    assert {"Source", "Documentation", "Changelog", "Issues"} <= set(urls)
    assert urls["Issues"] in (ROOT / "README.md").read_text()  # the README's Help points to the tracker
    changelog = (ROOT / "CHANGELOG.md").read_text()
    sections = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", changelog, re.MULTILINE)
    version = re.search(r'__version__ = "([^"]+)"', (ROOT / "keras_vit" / "__init__.py").read_text()).group(1)
    assert sections[0] == ("Unreleased", "") and sections[1][0] == version and sections[1][1], sections
    assert all(re.fullmatch(r"\d+\.\d+\.\d+", v) and date for v, date in sections[1:]), sections
    for kind in re.findall(r"^### (.+)$", changelog, re.MULTILINE):
        assert kind in ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"), kind


def test_doctor_reads_metadata_only_and_installs_the_shipped_list(monkeypatch, capsys):
    """`keras-vit doctor` imports neither Keras nor TensorFlow; `--install-optional` runs pip
    without dependencies on the list shipped in the package."""
    code = (
        "import sys; from keras_vit_cli import main; status = main(['doctor']); "
        "print('loaded:', sorted(m for m in ('keras', 'tensorflow', 'keras_vit') if m in sys.modules)); "
        "sys.exit(status)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert "loaded: []" in done.stdout and done.stdout.startswith("keras3-vit "), done.stdout
    assert "tf-keras:" in done.stdout and "Keras backends:" in done.stdout

    from keras_vit_cli import doctor_command, main

    calls = []
    monkeypatch.setattr(doctor_command.subprocess, "call", lambda command: calls.append(command) or 0)
    assert main(["doctor", "--install-optional"]) == 0
    (command,) = calls
    assert command[:6] == [sys.executable, "-m", "pip", "install", "--no-deps", "-r"]
    assert Path(command[6]).name == "no-deps.txt" and "tf-keras==" in Path(command[6]).read_text()
