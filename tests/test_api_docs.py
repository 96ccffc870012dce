"""The API reference (`python3 dev.py docs`, docs/make_api.py): pdoc builds it from the public
API's docstrings, and every public module, class, function and method has one."""

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _make_api():
    spec = importlib.util.spec_from_file_location("make_api", ROOT / "docs" / "make_api.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.tensorflow_only  # it imports the training and export applications
def test_the_api_reference_builds_and_documents_every_public_name(tmp_path):
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "make_api.py"), "--out", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    pages = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.html")}
    for module in ("keras_vit", "keras_vit/layers", "keras_vit/training", "keras_vit/export", "keras_vit/benchmark"):
        assert f"{module}.html" in pages, sorted(pages)
    assert "keras_vit/benchmark/torchvision_stub.html" not in pages
    # The public names with their docstrings' text.
    library = (tmp_path / "keras_vit.html").read_text()
    assert "from_preset" in library and "count_params" in library
    assert "Vision Transformer (Dosovitskiy et al., ICLR 2021), built from a" in library
    training = (tmp_path / "keras_vit" / "training.html").read_text()
    assert "TrainConfig" in training and "as a generator: each image" in training


def test_a_public_name_without_a_docstring_is_named(tmp_path, monkeypatch):
    pdoc_doc = pytest.importorskip("pdoc.doc")
    (tmp_path / "apidemo.py").write_text(
        textwrap.dedent(
            '''
            """A module."""

            LIMIT = 3


            def documented():
                """Does one thing."""


            def bare():
                pass


            def _private():
                pass


            class Layer:
                """A class."""

                def call(self, x):
                    return x

                def method(self):
                    pass

                def explained(self):
                    """Says what it does."""
            '''
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    make_api = _make_api()
    module = pdoc_doc.Module(__import__("apidemo"))
    assert make_api.undocumented([module]) == ["apidemo.Layer.method", "apidemo.bare"]
