"""`keras-vit doctor`: what this installation holds, and the optional packages no extra can bring.

It reads package metadata only (`importlib.metadata`), never importing Keras or TensorFlow, so it
answers where they are missing or broken.
"""

import importlib.metadata
import importlib.resources
import re
import subprocess
import sys

# This project's name on the package index. `keras-vit` there is another project, which also
# installs a `keras_vit` module: the two overwrite each other's files.
DISTRIBUTION = "keras3-vit"
OTHER_DISTRIBUTION = "keras-vit"
# The optional packages installed without their dependency pins (cli/no-deps.txt, shipped as
# package data): their declared requirements clash with tensorflow-cpu although the code works.
NO_DEPS_FILE = "no-deps.txt"
# Extras a user installs (setup.cfg); `dev` is the test suite's.
USER_EXTRAS = ("tensorflow", "tensorflow-cpu", "jax", "training", "export", "onnx", "openvino", "inspect")
BACKEND_EXTRAS = ("tensorflow", "tensorflow-cpu", "jax")


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "doctor",
        help="show what is installed; install the optional packages no extra brings",
        description=f"Lists the installed {DISTRIBUTION} version, each extra's packages and the optional "
        "packages (tf-keras, tensorflow-model-optimization, tensorflow-serving-api) that are installed "
        "without their dependency pins, which clash with tensorflow-cpu although the code works with "
        "them. Reads package metadata only: Keras and TensorFlow are not imported.",
    )
    parser.add_argument(
        "--install-optional",
        action="store_true",
        help="run `pip install --no-deps` on the optional packages' pinned list shipped in the package",
    )
    parser.set_defaults(run=run, standalone=True)


def no_deps_requirements():
    """The pinned optional requirements (`name==version` lines) shipped with the package."""
    text = importlib.resources.files("keras_vit_cli").joinpath(NO_DEPS_FILE).read_text()
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def extras_requirements():
    """{extra: [package names]} from the installed distribution's metadata."""
    extras = {}
    for requirement in importlib.metadata.requires(DISTRIBUTION) or []:
        extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", requirement)
        if extra:
            name = re.match(r"[A-Za-z0-9._-]+", requirement).group(0)
            extras.setdefault(extra.group(1), []).append(name)
    return extras


def report():
    """The lines `keras-vit doctor` prints."""
    version = _version(DISTRIBUTION)
    lines = [f"{DISTRIBUTION} {version or '(not installed)'}, Python {sys.version.split()[0]} ({sys.executable})"]
    other = _version(OTHER_DISTRIBUTION)
    if other:
        lines.append(
            f"warning: {OTHER_DISTRIBUTION} {other}, another project, is installed and also provides the "
            f"keras_vit module: pip uninstall {OTHER_DISTRIBUTION}, then pip install --force-reinstall {DISTRIBUTION}"
        )
    extras = extras_requirements()
    # The backends are alternatives (and PyTorch has no extra): one line, a gap only if none is there.
    backends = [f"{name} {_version(name)}" for name in (*BACKEND_EXTRAS, "torch") if _version(name)]
    lines.append("  Keras backends: " + (", ".join(backends) or "none"))
    missing_extras = [] if backends else ["tensorflow-cpu"]
    for extra in (e for e in USER_EXTRAS if e in extras and e not in BACKEND_EXTRAS):
        found = [f"{name} {_version(name)}" if _version(name) else f"{name}: missing" for name in extras[extra]]
        lines.append(f"  [{extra}] " + ", ".join(found))
        if not all(_version(name) for name in extras[extra]):
            missing_extras.append(extra)
    optional = no_deps_requirements()
    lines.append("optional, installed without their dependency pins (keras-vit doctor --install-optional):")
    for requirement in optional:
        name, _, pinned = requirement.partition("==")
        have = _version(name)
        state = "missing" if have is None else have if have == pinned else f"{have} (the tested version is {pinned})"
        lines.append(f"  {name}: {state}")
    if missing_extras:
        lines.append(f'to add the missing extras: pip install "{DISTRIBUTION}[{",".join(missing_extras)}]"')
    return lines


def install_optional():
    """Runs pip on the shipped list, without dependencies; returns pip's exit status."""
    with importlib.resources.as_file(importlib.resources.files("keras_vit_cli").joinpath(NO_DEPS_FILE)) as path:
        command = [sys.executable, "-m", "pip", "install", "--no-deps", "-r", str(path)]
        print("+ " + " ".join(command), flush=True)
        return subprocess.call(command)


def run(args):
    if args.install_optional:
        return install_optional()
    print("\n".join(report()))
    return 0
