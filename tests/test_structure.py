"""The code's shape, checked statically from the source: facts with one home."""

import ast
from pathlib import Path

from keras_vit import names

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("keras_vit", "training", "export", "cli", "benchmark")


def _sources():
    for folder in SOURCE_DIRS:
        yield from sorted((ROOT / folder).rglob("*.py"))


def test_each_shared_name_and_list_is_defined_once_in_keras_vit_names():
    """No module spells out a list of `keras_vit.names` (or one of its file names or the
    evaluation crop) as a literal of its own: it imports it."""
    constants = {k: v for k, v in vars(names).items() if k.isupper()}
    lists = {v for v in constants.values() if isinstance(v, tuple)}
    scalars = {v for v in constants.values() if isinstance(v, float)}
    scalars |= {v for v in constants.values() if isinstance(v, str) and "." in v}  # file names
    scalars |= {f for v in constants.values() if isinstance(v, tuple) for f in v if str(f).endswith(".keras")}
    copies = []
    for path in _sources():
        if path == ROOT / "keras_vit" / "names.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            value = None
            if isinstance(node, ast.Tuple | ast.List | ast.Set):
                try:
                    value = tuple(ast.literal_eval(node))
                except (ValueError, TypeError):
                    continue
                if any(value == known for known in lists):
                    copies.append(f"{path.relative_to(ROOT)}:{node.lineno} {value}")
            elif isinstance(node, ast.Constant) and node.value in scalars and not isinstance(node.value, bool):
                copies.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert not copies, "defined again outside keras_vit/names.py:\n" + "\n".join(copies)


# Folder -> the packages its modules may not import, lazily inside a function or not: the core
# knows no application and no command line; training and export do not know each other; the
# command line and the benchmark suite sit on top.
FORBIDDEN = {
    "keras_vit": ("keras_vit.training", "keras_vit.export", "keras_vit.benchmark", "keras_vit_cli"),
    "training": ("keras_vit.export", "keras_vit.benchmark", "keras_vit_cli"),
    "export": ("keras_vit.training", "keras_vit.benchmark", "keras_vit_cli"),
    "benchmark": ("keras_vit_cli",),
}


def _imported(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def test_imports_go_only_down_the_three_floors():
    wrong = []
    for folder, forbidden in FORBIDDEN.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            for name in set(_imported(ast.parse(path.read_text(), str(path)))):
                if any(name == f or name.startswith(f + ".") for f in forbidden):
                    wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not wrong, "\n".join(sorted(wrong))
