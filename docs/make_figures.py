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
"""

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

IMAGES = Path(__file__).resolve().parent / "images"
DIGITS = (0, 3, 7)


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


def small_png(path):
    """Rewrites a PNG with a 256-colour palette (figures of flat colours lose nothing visible)."""
    with Image.open(path) as image:
        reduced = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    reduced.save(path, optimize=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", default="runs/docs_digits", help="digits run (trained here if it has no model)")
    parser.add_argument("--benchmark", help="a `keras-vit benchmark` JSON result to chart as docs/images/benchmark.png")
    args = parser.parse_args(argv)

    run_dir = Path(args.run_dir)
    if not (run_dir / "best.keras").exists():
        keras_vit("train", "--dataset", "digits", "--run-dir", run_dir)
    IMAGES.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        files = digit_files(tmp)
        keras_vit("inspect", run_dir, "--out", tmp / "inspect", "--images", *files)
        for figure in sorted((tmp / "inspect").glob("*.png")):
            shutil.copy(figure, IMAGES / f"digits_{figure.name}")
        keras_vit("visualize", run_dir, *files, "--method", "gradcam++", "--out", IMAGES / "digits_gradcam.png")
    if args.benchmark:
        import json

        from keras_vit.benchmark.report import chart

        chart(json.loads(Path(args.benchmark).read_text()), IMAGES / "benchmark.png")
    for path in sorted(IMAGES.glob("*.png")):
        small_png(path)
        print(f"{path.relative_to(IMAGES.parent.parent)}: {path.stat().st_size // 1024} KiB")


if __name__ == "__main__":
    main()
