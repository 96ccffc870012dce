"""Input pipeline throughput: JPEG files decoded, cropped, flipped and batched by the
training application's tf.data pipeline, without a model."""

import tempfile
import time
from pathlib import Path

import numpy as np

from keras_vit.benchmark.timing import median_and_spread, repeated_rates


def write_jpeg_folder(folder, count, size=(375, 500), classes=4, seed=0):
    """`count` JPEG photos of ImageNet's typical size (smooth colour fields plus noise, so
    they compress like photos) in `classes` class folders."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    rows, cols = np.mgrid[0 : size[0], 0 : size[1]]
    for i in range(count):
        base = np.stack(
            [
                np.sin(rows / rng.uniform(20, 80) + rng.uniform(0, 6)) * 80 + 128,
                np.cos(cols / rng.uniform(20, 80)) * 80 + 128,
                (rows + cols) / (size[0] + size[1]) * 255,
            ],
            axis=-1,
        )
        image = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype("uint8")
        target = Path(folder, f"class_{i % classes}")
        target.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(target / f"{i:05d}.jpg", quality=90)


def plant_corrupt_files(folder, count, seed=0):
    """Truncates `count` of the folder's JPEGs to a third of their bytes; returns their paths."""
    files = sorted(Path(folder).rglob("*.jpg"))
    chosen = np.random.default_rng(seed).choice(len(files), size=count, replace=False)
    for i in chosen:
        data = files[i].read_bytes()
        files[i].write_bytes(data[: len(data) // 3])
    return [files[i] for i in chosen]


def run_case(case, against, repeats, log):
    """Images/s of the training pipeline (inception crop + flip at the case's image size, then
    RandAugment at the case's `randaugment` strength where it has one). With `corrupt`: also
    seconds from listing the folder to the first batch, fresh and with the folder's index of
    readable files already written, and the corrupt files planted / found."""
    from keras_vit.training import datasets, pipeline
    from keras_vit.training.config import TrainConfig

    batch, size = case["batch"], tuple(case["image_size"])
    planted = case.get("corrupt", 0)
    with tempfile.TemporaryDirectory() as folder:
        write_jpeg_folder(folder, case["files"])
        plant_corrupt_files(folder, planted)
        config = TrainConfig(dataset=folder, randaugment=case.get("randaugment")).resolved()
        first = []
        for _ in range(2 if planted else 1):  # fresh, then with the index the first run wrote
            start = time.perf_counter()
            source = datasets.folder(folder, validation_fraction=0.1)
            ds = pipeline.train_pipeline(source, config, size, len(source.class_names), batch)
            batches = iter(ds)
            next(batches)
            first.append(time.perf_counter() - start)
        steps = case["batches_per_repeat"]

        def repeat():
            for _ in range(steps):
                next(batches)

        rate, spread = median_and_spread(repeated_rates(repeat, batch * steps, repeats, warmup=1))
    row = dict(case=case["name"], implementation="keras_vit", mode="tf.data", images_per_s=rate, spread=spread)
    if planted:
        row.update(
            files=case["files"],
            first_batch_s=first[0],
            first_batch_indexed_s=first[1],
            corrupt=f"{planted} / {source.skipped}",
        )
    log(row)
    return [row]
