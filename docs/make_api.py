"""Builds the API reference from the docstrings of the public API, with pdoc, and checks that
every public name has one.

    python docs/make_api.py                 # HTML in build/api/ (git-ignored); open build/api/index.html
    python docs/make_api.py --out DIR       # elsewhere

`python3 dev.py docs` runs it in the project's environment. The public API is what the modules in
`MODULES` export (their `__all__`, and the submodules `keras_vit.__all__` names: checkpoints,
distribution, layers, saving), with the public methods each class defines. Every module, class,
function and method there needs a docstring (a method overriding a documented one takes the
docstring it overrides, as pdoc shows it); constants and the Keras methods a layer overrides for
Keras to call (`KERAS_PROTOCOL`) may go without.
Exits 1, naming them, when some have none. Imports the training and export applications, so it
runs on Keras's TensorFlow backend.
"""

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The library (with the submodules its __all__ names), the inspection modules the docs show, and
# the applications' entry points.
MODULES = (
    "keras_vit",
    "keras_vit.inspect",
    "keras_vit.plot",
    "keras_vit.saliency",
    "keras_vit.training",
    "keras_vit.export",
    "keras_vit.benchmark",
)
# Left out: the benchmark's child-process entry point and its torchvision stand-in (importing the
# stand-in registers it as torchvision).
EXCLUDED = ("!keras_vit.benchmark.torchvision_stub", "!keras_vit.benchmark.isolated")
# Keras's protocol methods, which a layer or model overrides and Keras calls (users call the layer):
# Keras documents what each does, so an override needs no docstring of its own.
KERAS_PROTOCOL = ("build", "call", "compute_output_shape", "compute_output_spec", "convolution_op", "predict_step")


def documented_modules():
    """The pdoc `Module`s of the reference: `MODULES` and the public submodules they name."""
    import pdoc.doc
    import pdoc.extract

    return [pdoc.doc.Module.from_name(name) for name in pdoc.extract.walk_specs([*MODULES, *EXCLUDED])]


def undocumented(modules):
    """Qualified names of the public modules, classes, functions and methods with no docstring."""
    import pdoc.doc

    missing = []

    def check(doc):
        if not (doc.docstring or "").strip():
            missing.append(doc.fullname)

    for module in modules:
        check(module)
        for member in module.members.values():
            if member.name.startswith("_") or isinstance(member, pdoc.doc.Variable):
                continue
            check(member)
            if isinstance(member, pdoc.doc.Class):
                for method in member.own_members:
                    if (
                        isinstance(method, pdoc.doc.Function)
                        and not method.name.startswith("_")
                        and method.name not in KERAS_PROTOCOL
                    ):
                        check(method)
    return sorted(set(missing))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "build" / "api"), help="folder for the HTML (default build/api)")
    args = parser.parse_args(argv)
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import warnings

    import pdoc
    import pdoc.render

    warnings.filterwarnings("ignore", message="Suppressed execution")  # pdoc keeps imports from running programs

    pdoc.render.configure(docformat="markdown", show_source=False, footer_text="keras3-vit")
    modules = documented_modules()
    pdoc.pdoc(*MODULES, *EXCLUDED, output_directory=Path(args.out))
    print(f"API reference of {len(modules)} modules: {Path(args.out) / 'index.html'}")
    missing = undocumented(modules)
    if missing:
        print(f"{len(missing)} public names without a docstring:", *missing, sep="\n  ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
