"""A stand-in for torchvision, so timm imports beside a CPU-only torch.

PyPI has no CPU build of torchvision and the CUDA wheel's compiled ops fail to load
against CPU torch ("operator torchvision::nms does not exist"). timm imports torchvision
at start-up for data transforms and feature extraction, none of which is on the ViT path:
every `torchvision.*` module here is an empty shell whose attributes are inert classes.
The benchmark falls back to it (`models.import_timm`); the parity tests install it first.
"""

import importlib.abc
import importlib.machinery
import sys
import types


class _Inert(type):
    """A class whose every attribute is another inert class (enum members, constants)."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert(name, (), {})


class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert(name, (), {})


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Module(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0+stub"
        return module

    def exec_module(self, module):
        pass


def install():
    """Shadows any installed torchvision for this process."""
    for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
        del sys.modules[name]
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
