"""`keras_vit.names`, read without importing the keras_vit package (whose `__init__` loads Keras)."""

import importlib.util
import sys
from pathlib import Path


def _load():
    if "keras_vit.names" in sys.modules:
        return sys.modules["keras_vit.names"]
    package = importlib.util.find_spec("keras_vit")  # locates the package; runs none of its code
    if package is None or not package.submodule_search_locations:
        raise ImportError("keras_vit is not installed")
    path = Path(next(iter(package.submodule_search_locations))) / "names.py"
    spec = importlib.util.spec_from_file_location("keras_vit_cli._keras_vit_names", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


names = _load()
