"""Makes the figures of docs/images/ from one digits run, with the `keras-vit` command itself.

    python docs/make_figures.py                          # trains runs/docs_digits first if it has no model
    python docs/make_figures.py --run-dir /tmp/docs_run  # any finished `keras-vit train --dataset digits` run
    python docs/make_figures.py --benchmark results.json # also the bar chart of a `keras-vit benchmark` result

Writes docs/images/digits_*.png: `keras-vit inspect` (patch-embedding filter components, position
embedding similarity, mean attention distance, attention rollout, class-token attention) and
`keras-vit visualize --method gradcam++` on three digits of scikit-learn's set (the last 0, 3 and
7 of it) written as 8x8 PNG files, the form a user would pass. PNGs are reduced to a 256-colour
palette to keep the repository small. Needs the project installed with its `training` and
`inspect` extras (`python3 dev.py setup`).

Each PNG it writes records, in a text chunk (`TITLE_CODE_KEY`), a hash of the code that draws its
title and labels (`TITLE_CODE`): tests/test_docs.py recomputes it and fails when a committed figure
is older than that code, as docs/images/digits_class_token_attention.png once was (titled
"Class-token attention" for a model without a class token, after the code had been fixed).
"""

import argparse
import ast
import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image, PngImagePlugin

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "docs" / "images"
DIGITS = (0, 3, 7)

# The functions (file, name) that draw each figure's title, panel titles and labels. The hash is
# of their code as Python reads it (`ast.unparse` of each function without its docstring), so
# comments, docstrings and formatting do not count, and a change to anything else does.
TITLE_CODE = {
    "digits_rollout.png": [("keras_vit/plot.py", "heatmap_overlays")],
    "digits_class_token_attention.png": [("keras_vit/plot.py", "class_token_attention")],
    "digits_attention_distance.png": [("keras_vit/plot.py", "attention_distance")],
    "digits_position_similarity.png": [("keras_vit/plot.py", "position_similarity")],
    "digits_patch_embedding_components.png": [("keras_vit/plot.py", "patch_components")],
    "digits_gradcam.png": [("keras_vit/plot.py", "heatmap_overlays"), ("cli/visualize_command.py", "map_labels")],
    "benchmark.png": [("benchmark/report.py", "chart")],
}
TITLE_CODE_KEY = "keras-vit title code"


def _function_code(file, name, root=ROOT):
    tree = ast.parse((root / file).read_text())
    (function,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        function.body = body[1:] or [ast.Pass()]  # the docstring
    return ast.unparse(function)


def title_code_hash(figure, root=ROOT):
    """The hash of the code that draws `figure`'s (a file name in docs/images) titles, as the
    files under `root` hold it."""
    digest = hashlib.sha256()
    for file, name in TITLE_CODE[figure]:
        digest.update(f"{file}:{name}\n{_function_code(file, name, root)}\n".encode())
    return digest.hexdigest()[:16]


def keras_vit(*args):
    command = [sys.executable, "-m", "keras_vit_cli", *map(str, args)]
    print("+ keras-vit", " ".join(map(str, args)), flush=True)
    subprocess.run(command, check=True)


def digit_files(folder):
    from sklearn.datasets import load_digits

    digits = load_digits()
    files = []
    for label in DIGITS:
        index = int(np.flatnonzero(digits.target == label)[-1])
        files.append(folder / f"digit{label}.png")
        Image.fromarray(np.round(digits.images[index] * 255.0 / 16.0).astype(np.uint8)).save(files[-1])
    return files


def finish_png(path):
    """Rewrites a figure just drawn with a 256-colour palette (figures of flat colours lose nothing
    visible) and the hash of the code that drew its titles."""
    with Image.open(path) as image:
        reduced = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    info = PngImagePlugin.PngInfo()
    info.add_text(TITLE_CODE_KEY, title_code_hash(path.name))
    reduced.save(path, optimize=True, pnginfo=info)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", default="runs/docs_digits", help="digits run (trained here if it has no model)")
    parser.add_argument("--benchmark", help="a `keras-vit benchmark` JSON result to chart as docs/images/benchmark.png")
    args = parser.parse_args(argv)

    run_dir = Path(args.run_dir)
    if not (run_dir / "best.keras").exists():
        keras_vit("train", "--dataset", "digits", "--run-dir", run_dir)
    IMAGES.mkdir(exist_ok=True)
    drawn = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        files = digit_files(tmp)
        keras_vit("inspect", run_dir, "--out", tmp / "inspect", "--images", *files)
        for figure in sorted((tmp / "inspect").glob("*.png")):
            drawn.append(Path(shutil.copy(figure, IMAGES / f"digits_{figure.name}")))
        drawn.append(IMAGES / "digits_gradcam.png")
        keras_vit("visualize", run_dir, *files, "--method", "gradcam++", "--out", drawn[-1])
    if args.benchmark:
        import json

        from keras_vit.benchmark.report import chart

        if chart(json.loads(Path(args.benchmark).read_text()), IMAGES / "benchmark.png"):
            drawn.append(IMAGES / "benchmark.png")
    for path in drawn:
        finish_png(Path(path))
        print(f"{path.relative_to(ROOT)}: {path.stat().st_size // 1024} KiB")


if __name__ == "__main__":
    main()
