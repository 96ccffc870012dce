"""The training application: data sources, pipelines, recipes, run directories, faults."""

import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import write_image_folder
from PIL import Image

pytestmark = pytest.mark.tensorflow_only  # tf.data and tf.distribute
tf = pytest.importorskip("tensorflow")

from keras_vit.training import TrainConfig, TrainingError, datasets, evaluate, fit, pipeline  # noqa: E402
from keras_vit.training.recipes import WarmupDecay, peak_learning_rate, steps_per_call  # noqa: E402
from keras_vit.transform import ImageTransform  # noqa: E402
from keras_vit_cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMALL_MODEL = dict(image_size=16, patch_size=4, hidden_size=32, num_layers=1, num_heads=2, mlp_dim=64)


@pytest.fixture
def small(tmp_path):
    """A `--config` file of SMALL_MODEL: command-line runs whose model size the test does not need."""
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump({"model": SMALL_MODEL}))
    return str(path)


def test_warmup_decay_schedule_and_lr_scaling():
    schedule = WarmupDecay(1.0, warmup_steps=10, total_steps=110, decay="cosine")
    values = [float(schedule(s)) for s in (0, 5, 10, 60, 110)]
    np.testing.assert_allclose(values, [0.0, 0.5, 1.0, 0.5, 0.0], atol=1e-6)
    linear = WarmupDecay(2.0, 0, 100, decay="linear")
    np.testing.assert_allclose([float(linear(s)) for s in (0, 50, 100)], [2.0, 1.0, 0.0], atol=1e-6)
    c = TrainConfig(dataset="x", recipe="pretrain").resolved()
    assert (c.learning_rate, c.base_batch_size, c.weight_decay) == (1e-3, 4096, 0.1)
    # AdamW by the square root of the batch ratio, SGD linearly; each exact at its base batch.
    assert peak_learning_rate(c, 512) == pytest.approx(1e-3 / 8**0.5)
    assert peak_learning_rate(c, 32) == pytest.approx(1e-3 * (32 / 4096) ** 0.5)
    assert peak_learning_rate(c, 4096) == pytest.approx(1e-3)
    f = TrainConfig(dataset="x", recipe="finetune").resolved()
    assert (f.base_batch_size, f.clip_norm, f.weight_decay) == (512, 1.0, 0.0)
    assert peak_learning_rate(f, 64) == pytest.approx(0.01 / 8) and peak_learning_rate(f, 512) == pytest.approx(0.01)


def test_steps_per_call_divides_the_epoch_so_each_epoch_trains_its_own_steps():
    """Keras runs whole calls of `steps_per_execution` steps on a repeated dataset: the call
    size a run chooses must divide the epoch, or every epoch trains past its schedule."""
    assert [steps_per_call(None, n, fused=True) for n in (44, 40, 43, 12)] == [11, 10, 1, 12]
    assert steps_per_call(None, 44, fused=False) == 1 and steps_per_call(4, 44, fused=True) == 4
    with pytest.raises(ValueError, match=r"would train 48 per epoch; choose one of 1, 2, 4, 11, 22, 44\."):
        steps_per_call(8, 44, fused=True)
    import keras

    data = tf.data.Dataset.from_tensor_slices((np.ones((64, 3), "float32"), np.ones((64, 1), "float32")))
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", steps_per_execution=steps_per_call(None, 44, fused=True), jit_compile=True)
    model.fit(data.batch(1).repeat(), steps_per_epoch=44, epochs=2, shuffle=False, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 2 * 44


def test_pipeline_is_deterministic_and_shapes(tmp_path):
    source = datasets.digits()
    config = TrainConfig(crop_scale=(0.5, 1.0), mixup=0.2, cutmix=1.0, seed=3)

    def batches(start_step=0, count=1):
        ds = pipeline.train_pipeline(source, config, (16, 16), 10, 8, start_step=start_step)
        return [(x.numpy(), y.numpy()) for x, y in ds.take(count)]

    (a, la), (b, _) = batches()[0], batches()[0]
    np.testing.assert_array_equal(a, b)
    assert a.shape == (8, 16, 16, 3) and la.shape == (8, 10)
    # A run resumed at a step reads the batches the uninterrupted run read there, across the
    # end of a pass (179 steps of 8 per pass of the 1,438 training digits) too.
    stream = batches(count=183)
    for step in (5, 178, 180):
        resumed = batches(start_step=step, count=2)
        for (x, y), (x0, y0) in zip(resumed, stream[step : step + 2]):
            np.testing.assert_array_equal(x, x0)
            np.testing.assert_array_equal(y, y0)
    order = [np.concatenate([y.argmax(-1) for _, y in stream[i : i + 20]]) for i in (0, 179)]
    assert not np.array_equal(*order)  # each pass in its own order
    np.testing.assert_allclose(la.sum(-1), 1.0, atol=1e-5)  # mixed one-hot labels still sum to 1
    images, _ = next(iter(pipeline.eval_pipeline(source.eval, ImageTransform((16, 16), 0.875), 10, 4)))
    assert images.shape == (4, 16, 16, 3)
    # A grayscale model's batches (channels=1): the digits are gray (R = G = B), so each is the
    # RGB batch's one channel, augmented and mixed alike.
    assert np.array_equal(a[..., 0], a[..., 2])
    gray = pipeline.train_pipeline(source, config, (16, 16), 10, 8, channels=1)
    np.testing.assert_allclose(next(iter(gray))[0].numpy(), a[..., :1], atol=1e-3)
    transform = ImageTransform((16, 16), 0.875)
    gray, _ = next(iter(pipeline.eval_pipeline(source.eval, transform, 10, 4, channels=1)))
    np.testing.assert_allclose(gray.numpy(), images.numpy()[..., :1], atol=1e-3)


def test_multi_worker_input_pipelines_read_their_part_of_each_global_batch_and_decode_no_other():
    """Each of several input pipelines (`train_pipeline(context=...)`, a multi-worker job's
    workers) gives, as per-replica batches, exactly its replicas' part of each global batch of
    the one-pipeline stream, from a resumed step too; it decodes about its share of the
    examples, not all of them; each replica's batch of a step gets a mix of its own."""
    source = datasets.digits()
    plain, randaugmented = TrainConfig(seed=3), TrainConfig(seed=3, randaugment=0.5)

    def batches(config, context=None, start_step=0, count=6, data=source):
        ds = pipeline.train_pipeline(data, config, (16, 16), 10, 8, start_step=start_step, context=context)
        return [x.numpy() for x, _ in ds.take(count)]

    for pipelines, replicas, config in ((2, 1, plain), (2, 2, plain), (4, 1, plain), (2, 1, randaugmented)):
        contexts = [tf.distribute.InputContext(pipelines, i, pipelines * replicas) for i in range(pipelines)]
        for start_step in (0, 178):  # across the end of a pass (179 steps of 8)
            whole = batches(config, start_step=start_step, count=3)
            parts = [batches(config, c, start_step, 3 * replicas) for c in contexts]
            assert parts[0][0].shape == (8 // (pipelines * replicas), 16, 16, 3)
            for step, expected in enumerate(whole):
                got = [b for part in parts for b in part[step * replicas : (step + 1) * replicas]]
                np.testing.assert_array_equal(np.concatenate(got), expected)

    decoded = []

    def counted(image):
        decoded.append(1)
        return image

    def decode(record):
        return tf.ensure_shape(tf.py_function(counted, [record], tf.uint8), record.shape)

    counting = dataclasses.replace(source, decode=decode)
    counts = []
    for context in (None, tf.distribute.InputContext(2, 1, 2)):
        decoded.clear()
        batches(plain, context, count=60, data=counting)
        counts.append(len(decoded))
    assert counts[1] < 0.7 * counts[0], counts  # 240 of 480 examples read, plus the read-ahead

    # a multi-worker step's four replica batches (2 pipelines x 2 replicas) are batches 0-3
    mixed = TrainConfig(seed=3, mixup=0.5)
    contexts = [tf.distribute.InputContext(2, i, 4) for i in range(2)]
    mixed_parts = [b for c in contexts for b in batches(mixed, c, count=2)]
    plain_parts = [b for c in contexts for b in batches(plain, c, count=2)]
    for number, (got, images) in enumerate(zip(mixed_parts, plain_parts)):
        labels = tf.zeros((len(images), 10))
        expected, _ = pipeline.mix((tf.constant(images), labels), pipeline._seed(3, number, 1), 0.5, 0.0)
        np.testing.assert_allclose(got, expected.numpy(), rtol=1e-6, atol=1e-4)
        assert not np.allclose(got, images)


def test_affine_augmentation_rotates_zooms_and_shifts_about_the_centre():
    image = np.zeros((8, 8, 3), np.uint8)
    image[1:7, 3:5] = 255  # a vertical bar
    resized = tf.image.resize(tf.cast(image, tf.float32), (16, 16)).numpy()
    seed = tf.constant([4, 2])
    still = pipeline.affine(image, (16, 16), seed, rotation=0.0, scale=0.0, shear=0.0, shift=0.0).numpy()
    np.testing.assert_allclose(still, resized, atol=1e-4)  # no motion: the resized image itself
    # scaled so that this seed's angle is a quarter turn: the bar lies on its side, same pixels
    draw = float(tf.random.stateless_uniform([4], seed, -1.0, 1.0)[0])
    turned = pipeline.affine(
        image, (16, 16), seed, rotation=np.pi / 2 / abs(draw), scale=0.0, shear=0.0, shift=0.0
    ).numpy()
    errors = [np.abs(turned - np.rot90(resized, k, axes=(0, 1))).max() for k in (1, -1)]
    assert min(errors) < 1e-3, errors
    # the same seed gives the same image; the default draws move it
    moved = pipeline.affine(image, (16, 16), seed).numpy()
    np.testing.assert_array_equal(moved, pipeline.affine(image, (16, 16), seed).numpy())
    assert moved.shape == (16, 16, 3) and moved.min() >= 0 and not np.allclose(moved, resized)


def test_best_epoch_is_chosen_on_training_examples_never_on_the_evaluation_split():
    labels = np.repeat(np.arange(10), 50)
    train, select, held_out = datasets._three_way_split(labels, 0.2, 0.1, seed=0)
    assert sorted(np.concatenate([train, select, held_out]).tolist()) == list(range(500))  # disjoint, complete
    assert [np.bincount(labels[part]).tolist() for part in (train, select, held_out)] == [
        [36] * 10,
        [4] * 10,
        [10] * 10,
    ]
    source = datasets.digits(selection_fraction=0.1)
    assert (source.num_train, source.num_select, source.num_eval) == (1295, 143, 359)
    seen = [
        {x.tobytes() + bytes([y]) for x, y in getattr(source, part).as_numpy_iterator()}
        for part in ("train", "select", "eval")
    ]
    assert len(set.union(*seen)) == sum(map(len, seen)) == 1797  # the digits images are all distinct
    assert datasets.digits().select is None  # the default: no selection split


@pytest.mark.parametrize(
    "split, fraction, expected",
    [
        ("train", 0.1, ("train[:90%]", "train[90%:100%]")),
        ("train[:90%]", 0.1, ("train[:81%]", "train[81%:90%]")),
        ("train", 0.001, ("train[:99%]", "train[99%:100%]")),
        ("train", 0.0, ("train", None)),
    ],
)
def test_tfds_selection_split_is_cut_from_the_training_split(split, fraction, expected):
    assert datasets.selection_splits(split, fraction) == expected


def test_tfds_selection_split_refuses_what_it_cannot_cut():
    with pytest.raises(
        ValueError, match=r"cannot hold a selection split out of .*'train\[10%:\]'.*--selection-fraction 0"
    ):
        datasets.selection_splits("train[10%:]", 0.1)
    with pytest.raises(ValueError, match="leaves nothing of 'train\\[:1%\\]' to train on"):
        datasets.selection_splits("train[:1%]", 0.5)


def test_by_default_best_is_the_last_epoch(tmp_path):
    run = tmp_path / "run"
    result = fit(TrainConfig(run_dir=str(run), model=SMALL_MODEL, epochs=2), verbose=0)
    assert result["selected_on"] == 0 and result["num_examples"] == 359
    header, *rows = [line.split(",") for line in (run / "log.csv").read_text().splitlines()]
    assert [row[header.index("val_accuracy")] for row in rows] == ["NA", "NA"]  # Keras's CSVLogger: no validation
    import keras

    best, last = (keras.saving.load_model(run / name) for name in ("best.keras", "last.keras"))
    for a, b in zip(best.get_weights(), last.get_weights()):
        np.testing.assert_array_equal(a, b)


def _write_folder(root):
    rng = np.random.default_rng(0)
    for c, name in enumerate(("cat", "dog")):
        folder = root / name
        folder.mkdir(parents=True)
        for i in range(6):
            pixels = (rng.uniform(0, 255, (20 + i, 24, 3)) * (0.5 + c / 2)).astype("uint8")
            image = Image.fromarray(pixels)
            [
                image.convert("L").save(folder / f"{i}.png")
                if i == 0
                else image.convert("CMYK").save(folder / f"{i}.jpg")
                if i == 1
                else image.convert("RGBA").save(folder / f"{i}.png")
                if i == 2
                else image.convert("P").save(folder / f"{i}.gif")
                if i == 3
                else image.save(folder / f"{i}.bmp")
                if i == 4
                else image.save(folder / f"{i}.jpg")
            ]
    (root / "cat" / "truncated.jpg").write_bytes((root / "cat" / "5.jpg").read_bytes()[:200])
    (root / "dog" / "not_an_image.png").write_bytes(b"hello")
    (root / "dog" / "notes.txt").write_text("ignored")


def test_a_read_only_folder_keeps_its_index_under_keras_home(tmp_path, monkeypatch):
    """A folder the user cannot write to keeps its index in `$KERAS_HOME/keras_vit/folders/`,
    and the next command reads it from there (os.access answers for a read-only folder: the
    tests may run as root, who can write anywhere)."""
    _write_folder(tmp_path / "data")
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "home"))
    writable = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: mode != os.W_OK and writable(path, mode))
    checked = []
    decodable = datasets._decodable

    def counted(files, whole=False):
        checked.append(len(files)) if not whole else None
        return decodable(files, whole)

    monkeypatch.setattr(datasets, "_decodable", counted)
    source = datasets.folder(tmp_path / "data", validation_fraction=0.34)
    assert not (tmp_path / "data" / datasets.FolderIndex.NAME).exists()
    (index,) = (tmp_path / "home" / "keras_vit" / "folders").glob("*.json")
    assert len(json.loads(index.read_text())["files"]) == 14 and checked == [14]
    again = datasets.folder(tmp_path / "data", validation_fraction=0.34)
    assert checked == [14] and (again.skipped, again.num_train) == (source.skipped, source.num_train)


def test_image_folder_skips_corrupt_files_and_trains(tmp_path, caplog, monkeypatch):
    """Corrupt files are found by TensorFlow's decoders in one parallel tf.data pass (no
    PIL decode, no file-by-file pre-pass), counted, and remembered: a later command checks only
    files that changed."""
    import PIL.Image

    _write_folder(tmp_path / "data")

    def no_pil(*args, **kwargs):
        raise AssertionError("PIL decoded a file of the folder")

    monkeypatch.setattr(PIL.Image, "open", no_pil)
    checked = []
    decodable = datasets._decodable

    def counted(files, whole=False):
        checked.append(len(files)) if not whole else None
        return decodable(files, whole)

    monkeypatch.setattr(datasets, "_decodable", counted)
    source = datasets.folder(tmp_path / "data", validation_fraction=0.34)
    assert "skipped 2 unreadable image(s)" in caplog.text and source.skipped == 2 and checked == [14]
    again = datasets.folder(tmp_path / "data", validation_fraction=0.34)
    assert checked == [14] and again.skipped == 2 and again.num_train == source.num_train  # from the index
    (tmp_path / "data" / "dog" / "not_an_image.png").write_bytes((tmp_path / "data" / "dog" / "0.png").read_bytes())
    assert datasets.folder(tmp_path / "data", validation_fraction=0.34).skipped == 1 and checked == [14, 1]
    (tmp_path / "data" / "dog" / "not_an_image.png").write_bytes(b"hello")
    assert source.class_names == ["cat", "dog"] and (source.num_train, source.num_select, source.num_eval) == (8, 0, 4)
    shapes = [image.shape for image, _ in source.train.as_numpy_iterator()]
    assert all(s[-1] == 3 for s in shapes)  # grayscale, CMYK, RGBA, palette -> RGB
    result = fit(
        TrainConfig(
            dataset=str(tmp_path / "data"),
            run_dir=str(tmp_path / "run"),
            model=SMALL_MODEL,
            epochs=1,
            batch_size=4,
            validation_fraction=0.34,
        ),
        verbose=0,
    )
    assert result["num_examples"] == source.num_eval

    # A folder training never saw (a copy stands in) is evaluated whole with split "all"; the
    # run's eval.json stays. The run's own folder, named again, is refused.
    run_dir, eval_json = tmp_path / "run", (tmp_path / "run" / "eval.json").read_text()
    shutil.copytree(tmp_path / "data", tmp_path / "unseen")
    whole = evaluate(run_dir / "best.keras", dataset=str(tmp_path / "unseen"), split="all")
    assert whole["num_examples"] == source.num_train + source.num_eval == 12
    assert (run_dir / "eval.json").read_text() == eval_json
    own = "split 'all' of the model's own training data would count its training"
    for call, message in (
        (lambda: evaluate(run_dir, split="all"), own),
        (lambda: evaluate(run_dir / "best.keras", dataset=str(tmp_path / "data" / "."), split="all"), own),
        (lambda: evaluate(run_dir, split="test"), r"a split expression \('test'\) is for tfds datasets"),
        (
            lambda: fit(TrainConfig(dataset=str(tmp_path / "data"), eval_split="all", run_dir=str(tmp_path / "r2"))),
            "evaluation split 'all' is every example, the training ones included",
        ),
    ):
        with pytest.raises(ValueError, match=message):
            call()
    assert not (tmp_path / "r2").exists()


def test_jpegs_broken_inside_their_pixel_data_are_left_out_of_evaluation_and_selection(tmp_path, caplog, monkeypatch):
    # Such a JPEG passes the folder's first check (its markers are whole). Training stepped over
    # it, but one held out stopped the run's final evaluation with a TensorFlow traceback, every
    # time the run was resumed, and `evaluate` too.
    rng = np.random.default_rng(0)
    for name, scale in (("cat", 0.5), ("dog", 1.0)):
        (tmp_path / "data" / name).mkdir(parents=True)
        for i in range(8):
            pixels = (rng.uniform(0, 255, (24, 24, 3)) * scale).astype("uint8")
            Image.fromarray(pixels).save(tmp_path / "data" / name / f"{i}.jpg", quality=90)
    data = bytearray((tmp_path / "data" / "cat" / "0.jpg").read_bytes())
    middle = data.find(b"\xff\xda") + (len(data) - data.find(b"\xff\xda")) // 2
    data[middle : middle + 2] = b"\xff\xc4"  # a marker inside the scan: the decoder gives up
    for i in range(4):
        (tmp_path / "data" / "cat" / f"broken{i}.jpg").write_bytes(bytes(data))
    config = dict(dataset=str(tmp_path / "data"), model=SMALL_MODEL, epochs=1, batch_size=4)
    config.update(validation_fraction=0.5, selection_fraction=0.5)
    source = datasets.folder(tmp_path / "data", 0.5, 0, 0.5)
    assert source.skipped == 0  # the first check passes them
    assert "do not decode whole out of evaluation and selection, e.g. cat/broken" in caplog.text
    assert source.num_eval + source.num_select + source.num_train < 20  # the split drawn over 20, some left out
    for split in (source.eval, source.select):
        assert sum(1 for _ in split) == (source.num_eval if split is source.eval else source.num_select)
    whole = []
    decodable = datasets._decodable
    monkeypatch.setattr(datasets, "_decodable", lambda files, **kwargs: whole.append(1) or decodable(files, **kwargs))
    again = datasets.folder(tmp_path / "data", 0.5, 0, 0.5)
    assert not whole and (again.num_eval, again.num_select, again.fingerprint) == (
        source.num_eval,
        source.num_select,
        source.fingerprint,
    )  # decoded once: the index keeps the verdicts
    monkeypatch.setattr(datasets, "_decodable", decodable)
    result = fit(TrainConfig(**config, run_dir=str(tmp_path / "run")), verbose=0)
    assert result["num_examples"] == source.num_eval and result["selected_on"] == source.num_select
    assert evaluate(tmp_path / "run", verbose=0)["num_examples"] == source.num_eval
    shutil.copytree(tmp_path / "data", tmp_path / "unseen")  # a folder training never saw
    everything = evaluate(tmp_path / "run" / "best.keras", dataset=str(tmp_path / "unseen"), split="all", verbose=0)
    assert everything["num_examples"] == 16


def test_finetune_from_a_run_or_its_keras_file_takes_their_architecture(tmp_path, caplog):
    """`weights` may be a keras-vit run (its best.keras) or a .keras file. With no preset the run
    fine-tunes the architecture they hold (not ViTConfig's defaults), with a zero head for the new
    data's classes and the position embeddings resampled to the run's image size."""
    import keras

    import keras_vit

    fit(TrainConfig(run_dir=str(tmp_path / "base"), model=SMALL_MODEL, epochs=1), verbose=0)
    base = keras_vit.saving.load_model(tmp_path / "base")
    _write_folder(tmp_path / "data")
    for name, weights in (("from_run", tmp_path / "base"), ("from_file", tmp_path / "base" / "best.keras")):
        tuned = TrainConfig(
            dataset=str(tmp_path / "data"),
            run_dir=str(tmp_path / name),
            weights=str(weights),
            recipe="finetune",
            model={"image_size": 20},
            learning_rate=1e-9,  # the tuned weights stay the loaded ones to within 1e-5
            epochs=1,
            batch_size=4,
            validation_fraction=0.34,
        )
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="keras_vit"):
            fit(tuned, verbose=0)
        assert "new zero head (32, 2)" in caplog.text and "resampled from a 4x4 to a 5x5 grid" in caplog.text
        model = keras_vit.saving.load_model(tmp_path / name)
        assert model.config == dataclasses.replace(base.config, image_size=(20, 20), num_classes=2)
        # the class names travel in the .keras file, not only in the run's labels.txt
        assert keras_vit.saving.load_model(tmp_path / name / "best.keras").class_names == ("cat", "dog")
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(model.get_layer("block_0").mlp.fc1.kernel),
            keras.ops.convert_to_numpy(base.get_layer("block_0").mlp.fc1.kernel),
            atol=1e-5,
        )


def test_a_stopped_fine_tune_resumes_and_a_finished_one_answers_after_its_weights_are_gone(tmp_path, monkeypatch):
    """A resumed run read its architecture and weights from `weights` again (the resume state then
    replaced the weights): with that checkpoint moved or deleted, the run could not go on."""
    from keras_vit.training.callbacks import AtomicCheckpoint

    fit(TrainConfig(run_dir=str(tmp_path / "base"), model=SMALL_MODEL, epochs=1), verbose=0)
    _write_folder(tmp_path / "data")

    def tuned(name, weights):
        return TrainConfig(
            dataset=str(tmp_path / "data"),
            run_dir=str(tmp_path / name),
            weights=weights,
            recipe="finetune",
            epochs=2,
            batch_size=4,
            validation_fraction=0.34,
            checkpoint_interval=0,  # the resume state and last.keras at every epoch's end
        )

    whole = fit(tuned("whole", str(tmp_path / "base")), verbose=0)
    shutil.copytree(tmp_path / "base", tmp_path / "moved")
    real_checkpoint = AtomicCheckpoint.on_epoch_end

    def stop_after_the_first_epoch(self, epoch, logs=None):
        real_checkpoint(self, epoch, logs)  # the last callback to save at an epoch's end
        raise KeyboardInterrupt  # as Ctrl-C (a signal would not reach the handler in a pytest-xdist worker)

    monkeypatch.setattr(AtomicCheckpoint, "on_epoch_end", stop_after_the_first_epoch)
    config = tuned("stopped", "moved")  # relative, as typed; recorded by its place
    monkeypatch.chdir(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        fit(config, verbose=0)
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)  # the same command in the same place
    assert (tmp_path / "stopped" / "backup").is_dir() and not (tmp_path / "stopped" / "eval.json").exists()
    assert yaml.safe_load((tmp_path / "stopped" / "config.yaml").read_text())["weights"] == str(tmp_path / "moved")
    shutil.rmtree(tmp_path / "moved")
    resumed = fit(config, verbose=0)
    assert resumed["num_examples"] == whole["num_examples"]
    assert resumed["top1"] == pytest.approx(whole["top1"]) and resumed["loss"] == pytest.approx(whole["loss"], abs=1e-4)
    assert fit(config, verbose=0) == resumed  # finished: its evaluation, the weights still gone


def test_a_run_whose_folder_moved_says_so_and_takes_its_new_place(tmp_path):
    from keras_vit import saving
    from keras_vit.training import evaluate, export_samples

    _write_folder(tmp_path / "data")
    run_dir = tmp_path / "run"
    config = TrainConfig(
        dataset=str(tmp_path / "data"), run_dir=str(run_dir), model=SMALL_MODEL, epochs=1, batch_size=4
    )
    trained = fit(config, verbose=0)
    (tmp_path / "data").rename(tmp_path / "moved")
    moved = rf"{run_dir} was trained on the folder {tmp_path / 'data'}, which is not there from here; "
    moved += "give the folder's new place as the dataset"
    with pytest.raises(ValueError, match=moved):  # was "unknown dataset"
        evaluate(run_dir)
    model = saving.load_model(run_dir)
    with pytest.raises(ValueError, match=moved):
        export_samples(model, run_dir)
    again = evaluate(run_dir, dataset=str(tmp_path / "moved"))
    assert again["num_examples"] == trained["num_examples"] and again["top1"] == pytest.approx(trained["top1"])


def test_a_run_on_a_relative_folder_finds_it_from_another_working_directory(tmp_path, monkeypatch):
    """`train --dataset data` records the folder's place, so `evaluate` (and `export`) of the run
    work from anywhere; the same command spelt otherwise (`./data/`), or a run that recorded the
    relative name (as before), is the same run."""
    project = tmp_path / "project"
    _write_folder(project / "data")
    monkeypatch.chdir(project)
    config = TrainConfig(dataset="data", run_dir="runs/r", model=SMALL_MODEL, epochs=1, batch_size=4)
    trained = fit(config, verbose=0)
    stored = project / "runs" / "r" / "config.yaml"
    assert yaml.safe_load(stored.read_text())["dataset"] == str((project / "data").resolve())
    assert fit(dataclasses.replace(config, dataset="./data/"), verbose=0) == trained  # finished: not trained again
    monkeypatch.chdir(tmp_path)
    again = evaluate(project / "runs" / "r")
    assert again["num_examples"] == trained["num_examples"] and again["top1"] == pytest.approx(trained["top1"])
    monkeypatch.chdir(project)
    stored.write_text(stored.read_text().replace(str((project / "data").resolve()), "data"))
    assert fit(config, verbose=0) == trained


def test_the_first_held_out_images_of_a_folder_are_a_stratified_sample(tmp_path):
    """A folder lists its classes one after another; `export --eval-limit N` checks the first N
    held-out images, which were one class's alone."""
    from keras_vit import ViT, ViTConfig
    from keras_vit.training import export_samples

    write_image_folder(tmp_path / "data", (("a", 30), ("b", 20), ("c", 10)))
    model = ViT(ViTConfig(**{**SMALL_MODEL, "image_size": 8}, num_classes=3))
    first = export_samples(model, dataset=str(tmp_path / "data"), calibration_size=4, eval_limit=6)["eval_labels"]
    assert sorted(first) == [0, 0, 0, 1, 1, 2]  # the classes' shares of the 12 held-out images: 6, 4, 2
    whole = datasets.load(TrainConfig(dataset=str(tmp_path / "data"), eval_split="all"))
    labels = [int(label) for _, label in whole.eval.take(6).as_numpy_iterator()]
    assert sorted(labels) == [0, 0, 0, 1, 1, 2] and whole.num_eval == 60


def test_export_samples_label_the_data_by_the_models_class_names(tmp_path):
    """`export --dataset FOLDER` on a model whose classes are listed in another order than the
    folder's: the held-out labels and the fine-tuning batches are the model's classes (they were
    the folder's positions: a wrong report, and pruning or QAT trained on permuted labels)."""
    from keras_vit import ViT, ViTConfig
    from keras_vit.training import export_samples

    write_image_folder(tmp_path / "data", (("a", 10), ("b", 10), ("c", 10)))
    model = ViT(ViTConfig(**{**SMALL_MODEL, "image_size": 8}, num_classes=4))
    folder = str(tmp_path / "data")
    plain = export_samples(ViT(ViTConfig(**{**SMALL_MODEL, "image_size": 8}, num_classes=3)), dataset=folder)
    named = export_samples(model, dataset=folder, class_names=["d", "c", "a", "b"])
    np.testing.assert_array_equal(named["eval_labels"], np.array([2, 3, 1])[plain["eval_labels"]])
    np.testing.assert_array_equal(named["eval_images"], plain["eval_images"])
    x, y = next(iter(named["train"]))
    x0, y0 = next(iter(plain["train"]))
    np.testing.assert_array_equal(x.numpy(), x0.numpy())
    np.testing.assert_array_equal(y.numpy()[:, [2, 3, 1]], y0.numpy())
    assert not y.numpy()[:, 0].any()  # the class the folder does not hold
    with pytest.raises(ValueError, match="has classes the model does not know: 'b', 'c'"):
        export_samples(model, dataset=folder, class_names=["a", "x", "y", "z"])
    with pytest.raises(ValueError, match=r"has 3 classes; the model has 4 \(and no class names\)"):
        export_samples(model, dataset=folder)


def test_dataset_names_are_the_same_data_when_they_name_the_same_place(tmp_path, monkeypatch):
    from keras_vit.training.run import same_data

    monkeypatch.chdir(tmp_path)
    (tmp_path / "digits_photos").mkdir()
    assert same_data("digits_photos", "./digits_photos") and same_data("digits_photos", str(tmp_path / "digits_photos"))
    assert same_data("digits", "digits") and same_data("tfds:cifar10", "tfds:cifar10")
    assert not same_data("digits", "./digits") and not same_data("tfds:cifar10", "tfds:cifar100")


def test_a_checkpoint_evaluated_on_its_runs_data_keeps_the_runs_split(tmp_path):
    """A run trained with another seed and held-out share than `train`'s defaults: its data given
    again (`--dataset digits`) is split as the run split it, not with seed 0, whose held-out
    share is mostly the run's training images."""
    from keras_vit import saving
    from keras_vit.training import evaluate, export_samples, held_out_images

    run_dir = tmp_path / "run"
    config = TrainConfig(run_dir=str(run_dir), model=SMALL_MODEL, epochs=1, seed=3, validation_fraction=0.25)
    own = fit(config, verbose=0)
    assert own["num_examples"] == 450  # 25% of each digit's examples
    for source in (run_dir, run_dir / "best.keras"):
        again = evaluate(source, dataset="digits")
        assert again["num_examples"] == 450 and again["top1"] == pytest.approx(own["top1"])
        with pytest.raises(ValueError, match="split 'all' of the model's own training data would count its training"):
            evaluate(source, dataset="digits", split="all")
    model = saving.load_model(run_dir)
    by_run, by_name = export_samples(model, run_dir), export_samples(model, run_dir, "digits")
    np.testing.assert_array_equal(by_run["eval_labels"], by_name["eval_labels"])
    np.testing.assert_array_equal(by_run["eval_images"], by_name["eval_images"])
    examples, count, _ = held_out_images("digits", source=run_dir / "best.keras")
    assert count == 450 and [label for _, label in examples] == list(by_run["eval_labels"])
    # What an export records of the run (by_run["data_split"]) splits the data as the run did,
    # with the data named or not.
    assert by_run["data_split"] == by_name["data_split"] == {**config.data_split(), "seed": 3}
    for dataset in (None, "digits"):
        examples, count, _ = held_out_images(dataset, recorded=by_run["data_split"])
        assert count == 450 and [label for _, label in examples] == list(by_run["eval_labels"])
    # A copy outside the run names no run: train's default split (seed 0, 20%), and nothing to record.
    shutil.copyfile(run_dir / "best.keras", tmp_path / "copy.keras")
    assert evaluate(tmp_path / "copy.keras", dataset="digits")["num_examples"] == 359
    assert held_out_images("digits", source=tmp_path / "copy.keras")[1] == 359
    assert export_samples(model, tmp_path / "copy.keras", "digits")["data_split"] is None
    with pytest.raises(ValueError, match="the model's training data is not known"):
        held_out_images(None, source=tmp_path / "copy.keras")


def test_a_data_split_record_names_a_folder_by_its_place(tmp_path, monkeypatch):
    from keras_vit.training.run import data_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "photos").mkdir()
    record = TrainConfig(dataset="photos", seed=2, validation_fraction=0.3).data_split()
    assert record["dataset"] == str(tmp_path / "photos") and record["seed"] == 2
    assert data_config(recorded=record).validation_fraction == 0.3
    assert data_config("./photos", recorded=record).seed == 2  # the same place: the recorded split
    assert data_config("digits", recorded=record).seed == 0  # other data: train's defaults
    (tmp_path / "photos").rmdir()
    with pytest.raises(ValueError, match="trained on the folder .*photos, which is not there from here"):
        data_config(recorded=record)


@pytest.mark.parametrize("name, split", [("cifar10", "train"), ("oxford_flowers102", "train")])
def test_tfds_pipelines_with_mock_data(tmp_path, monkeypatch, name, split):
    import tensorflow_datasets as tfds

    monkeypatch.setattr(datasets, "network_available", lambda: True)  # tfds's mock stands in for the download
    with tfds.testing.mock_data(num_examples=12):
        source = datasets.tfds_source(
            name, train_split=f"{split}[:75%]", eval_split=f"{split}[75%:]", selection_fraction=0.1
        )
        assert len(source.class_names) == {"cifar10": 10, "oxford_flowers102": 102}[name]
        assert source.select is not None and source.num_select > 0  # (tfds's mock ignores split slices)
        result = fit(
            TrainConfig(
                dataset=f"tfds:{name}",
                run_dir=str(tmp_path / "run"),
                model=SMALL_MODEL,
                train_split=f"{split}[:75%]",
                eval_split=f"{split}[75%:]",
                epochs=1,
                batch_size=4,
                selection_fraction=0.1,
            ),
            verbose=0,
        )
    assert result["num_examples"] == source.num_eval > 0 and result["selected_on"] == source.num_select


def test_tfds_class_names_come_from_the_supervised_label(monkeypatch):
    # `features["label"]` was read whatever the dataset: smallnorb (label_category) and celeb_a
    # (no class label) stopped with "KeyError: 'label'" and a traceback.
    import tensorflow_datasets as tfds

    monkeypatch.setattr(datasets, "network_available", lambda: True)
    with tfds.testing.mock_data(num_examples=4):
        source = datasets.tfds_source("smallnorb")
        assert source.class_names == ["four-legged animals", "human figures", "airplanes", "trucks", "cars"]
        with pytest.raises(ValueError, match=r"tfds:celeb_a is not an image classification dataset .* supervised "):
            datasets.tfds_source("celeb_a")


def test_tfds_jpegs_are_decoded_as_pillow_decodes_them(tmp_path, monkeypatch):
    # A tensorflow-datasets dataset built here from JPEG files (its records hold their bytes as
    # they are): the pipeline's pixels are Pillow's, to the level, as `predict` and the
    # SavedModel see them. tfds's own decoder (the fast IDCT) differs by several levels.
    import tensorflow_datasets as tfds

    rng = np.random.default_rng(0)
    files = []
    for i in range(4):
        smooth = np.kron(rng.integers(0, 256, (6, 8, 3)), np.ones((8, 8, 1)))
        noisy = (smooth + rng.normal(0, 40, smooth.shape)).clip(0, 255).astype(np.uint8)
        files.append(tmp_path / f"{i}.jpg")
        Image.fromarray(noisy).save(files[-1], quality=85)
    if "keras_vit_jpeg_check" not in tfds.list_builders(with_community_datasets=False):

        class KerasVitJpegCheck(tfds.core.GeneratorBasedBuilder):
            VERSION = tfds.core.Version("1.0.0")

            def _info(self):
                image = tfds.features.Image(shape=(None, None, 3), encoding_format="jpeg")
                labels = tfds.features.ClassLabel(names=["a", "b"])
                features = tfds.features.FeaturesDict({"image": image, "label": labels})
                return tfds.core.DatasetInfo(builder=self, features=features, supervised_keys=("image", "label"))

            def _split_generators(self, dl_manager):
                return {"train": self._generate_examples(), "test": self._generate_examples()}

            def _generate_examples(self):
                for i, path in enumerate(sorted(Path(os.environ["KERAS_VIT_JPEG_CHECK"]).glob("*.jpg"))):
                    yield i, {"image": str(path), "label": i % 2}

    monkeypatch.setenv("KERAS_VIT_JPEG_CHECK", str(tmp_path))
    monkeypatch.setattr(tfds.core.constants, "DATA_DIR", str(tmp_path / "tfds"))
    tfds.builder("keras_vit_jpeg_check").download_and_prepare()
    source = datasets.tfds_source("keras_vit_jpeg_check")
    expected = [np.asarray(Image.open(path).convert("RGB")).astype(int) for path in files]

    def largest_errors(images):  # against each file's Pillow pixels (tfds stores examples shuffled)
        return [min(np.abs(image.numpy() - e).max() for e in expected) for image, _ in images]

    assert largest_errors(source.eval) == [0, 0, 0, 0]
    fast = tfds.builder("keras_vit_jpeg_check").as_dataset("test", as_supervised=True)
    assert max(largest_errors(fast)) > 1  # what tfds's decoder gives: the check tells them apart

    # Training shuffles the records themselves, still encoded, the same way for a seed.
    def order(source, start=0, passes=3):
        ds = source.passes(seed=0, start=start).take(4 * passes - start)
        return [int(np.argmin([np.abs(image.numpy() - e).max() for e in expected])) for image, _, _ in ds]

    first = order(source)
    assert sorted(first[:4]) == [0, 1, 2, 3] and first == order(datasets.tfds_source("keras_vit_jpeg_check"))
    assert len({tuple(first[i : i + 4]) for i in (0, 4, 8)}) > 1  # a new order each pass
    assert order(source, start=6) == first[6:]  # a resumed run reads on where it stopped


def test_tfds_offline_and_unknown_fail_fast(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path))
    caplog.set_level(logging.WARNING)
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"tfds:cifar10 is not prepared .* offline; run `tfds build cifar10`"):
        datasets.tfds_source("cifar10")
    assert time.perf_counter() - start < 15
    assert not [r.getMessage() for r in caplog.records if r.name == "absl"]  # the error is the one line
    with pytest.raises(ValueError, match=r"unknown tensorflow-datasets dataset 'cifar11'; did you mean tfds:cifar10"):
        datasets.tfds_source("cifar11")
    # tfds's own message listed "close matches": none, over two lines
    with pytest.raises(ValueError, match=r"^tfds:cifar10 has no configs: use tfds:cifar10 \(not tfds:cifar10/plain\)"):
        datasets.tfds_source("cifar10/plain")
    with pytest.raises(ValueError, match=r"^tfds:cifar10_corrupted has no config 'fogg_1'; did you mean "):
        datasets.tfds_source("cifar10_corrupted/fogg_1")
    with pytest.raises(ValueError, match=r"^tfds:cifar10:9\.9\.9: Dataset cifar10 cannot be loaded at version 9\.9\.9"):
        datasets.tfds_source("cifar10:9.9.9")  # was tfds's AssertionError


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--dataset", "/no/such/folder"], "no folder '/no/such/folder': a dataset is 'digits', 'tfds:NAME'"),
        (["--dataset", __file__], "is a file; an image folder holds one sub-folder per class"),
        (["--dataset", "digts"], "unknown dataset 'digts': use 'digits', 'tfds:NAME' or an image folder"),
        (["--dataset", "cifar10"], "unknown dataset 'cifar10'; did you mean tfds:cifar10?"),
        (["--dataset", "tfds:imagenett", "--preset", "vit_ti16"], "did you mean tfds:imagenette"),
        (["--selection-fraction", "1"], "selection fraction must be in [0, 1); got 1.0"),
        (["--image-size", "0"], "--image-size must be positive; got 0."),  # was taken as "not given"
        (["--image-size", "24", "30", "36"], "--image-size takes one or two values (height [width])."),
        (["--image-size", "24", "0"], "--image-size must be positive; got 24 0."),
        (["--steps-per-execution", "8"], "8 steps per execution do not divide the 44 steps of an epoch"),
        (["--learning-rate", "-1"], "learning rate must be finite and > 0.0; got -1.0."),  # trained to a loss of 2.6e5
        (["--learning-rate", "inf"], "learning rate must be finite and > 0.0; got inf."),  # stopped on a NaN loss
        (["--seed", "-1"], "seed must be in [0, 2**32); got -1."),  # NumPy's line, without the option's name
        (["--dataset", ""], "unknown dataset ''"),  # was the working directory as an image folder
        (["--weight-decay", "-0.1"], "weight decay must be >= 0.0; got -0.1."),
        (["--label-smoothing", "1"], "label smoothing must be in [0.0, 1.0); got 1.0."),
        (["--mixup", "-1"], "mixup must be >= 0.0; got -1.0."),
        (
            ["--recipe", "pretrain", "--preset", "vit_ti16", "--image-size", "230", "--dataset", "digits"],
            "image height 230 is not divisible by patch size 16",
        ),
    ],
)
def test_train_bad_input_one_line(argv, message, tmp_path, capsys):
    assert main(["train", "--run-dir", str(tmp_path / "run"), *argv]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("keras-vit")]
    assert len(err) == 1 and message in err[0]


def test_train_takes_a_non_square_image_size_and_keeps_a_square_one_as_one_number(tmp_path, capsys, small):
    # --image-size took one number: a non-square run needed a YAML config
    import keras_vit

    wide = ["train", "--config", small, "--epochs", "1", "--image-size", "24", "28", "--run-dir", str(tmp_path / "w")]
    assert main(wide) == 0
    assert keras_vit.saving.load_model(tmp_path / "w").config.image_size == (24, 28)
    assert yaml.safe_load((tmp_path / "w" / "config.yaml").read_text())["model"]["image_size"] == [24, 28]
    square = ["train", "--config", small, "--epochs", "1", "--run-dir", str(tmp_path / "square"), "--image-size", "24"]
    assert main(square) == 0
    capsys.readouterr()
    assert main([*square, "24"]) == 0  # "24 24" is the same run as "24"
    assert "is finished" in capsys.readouterr().err


def test_a_run_directory_that_is_a_file_is_named_before_training(tmp_path, capsys):
    (tmp_path / "run").write_text("notes")  # failed after loading the data: "[Errno 17] File exists"
    assert main(["train", "--run-dir", str(tmp_path / "run")]) == 2
    message = f"the run directory {tmp_path / 'run'} is a file; choose another --run-dir."
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("keras-vit")]
    assert len(err) == 1 and message in err[0]


def test_a_run_stopped_by_bad_input_does_not_hold_its_directory(tmp_path):
    config = TrainConfig(run_dir=str(tmp_path / "run"), model=SMALL_MODEL, epochs=1)
    with pytest.raises(ValueError, match="steps per execution do not divide the 44 steps"):
        fit(dataclasses.replace(config, steps_per_execution=8), verbose=0)
    assert not (tmp_path / "run").exists()  # nothing written: no directory left to clear
    assert fit(config, verbose=0)["num_examples"] == 359  # the corrected command trains there


def test_a_bad_model_is_named_before_the_run_directory_is_touched(tmp_path, capsys):
    # Over an existing run of another config the unknown preset is what is wrong; a fresh
    # directory is not created for a command that cannot train.
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("dataset: something else\n")
    assert main(["train", "--run-dir", str(tmp_path / "run"), "--preset", "vit_nope"]) == 2
    assert main(["train", "--run-dir", str(tmp_path / "new"), "--model-parallel", "5"]) == 2
    err = capsys.readouterr().err
    assert "unknown preset 'vit_nope'" in err and "hidden_size divisible by 5" in err and "different config" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"] and not (tmp_path / "run" / "labels.txt").exists()


def test_empty_folder_and_foreign_run_dir(tmp_path, capsys):
    preset = ["--preset", "vit_ti16"]  # a folder with neither weights nor a preset is refused first
    (tmp_path / "empty" / "a").mkdir(parents=True)
    assert main(["train", "--dataset", str(tmp_path / "empty"), "--run-dir", str(tmp_path / "r"), *preset]) == 2
    assert "has no readable images" in capsys.readouterr().err
    for name in ("a", "b"):  # one image per class: nothing to evaluate on
        (tmp_path / "empty" / name).mkdir(exist_ok=True)
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "empty" / name / "only.png")
    assert main(["train", "--dataset", str(tmp_path / "empty"), "--run-dir", str(tmp_path / "r"), *preset]) == 2
    assert "too few images to hold out an evaluation split" in capsys.readouterr().err
    _write_folder(tmp_path / "data")
    (tmp_path / "data" / "owl").mkdir()  # a class the head would have and no image would teach
    assert main(["train", "--dataset", str(tmp_path / "data"), "--run-dir", str(tmp_path / "r"), *preset]) == 2
    err = capsys.readouterr().err
    assert "class folder(s) without readable images (.jpg, .jpeg, .png, .bmp, .gif, .webp): owl; add" in err
    (tmp_path / "data" / "owl").rmdir()
    shutil.rmtree(tmp_path / "data" / "dog")
    assert main(["train", "--dataset", str(tmp_path / "data"), "--run-dir", str(tmp_path / "r"), *preset]) == 2
    assert "has one class (cat); a classifier needs at least 2" in capsys.readouterr().err
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("dataset: something else\n")
    assert main(["train", "--epochs", "1", "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "holds a run with a different config (augment: None there, 'affine' now, " in err
    # Fields the file lacks count as their defaults (crop_scale's is the same): the others are named.
    assert re.search(r"dataset: 'something else' there, 'digits' now and \d+ more\); pass --overwrite", err)


def test_run_resumes_with_execution_settings_changed(tmp_path, caplog, monkeypatch):
    # jit_compile and steps_per_execution change how a run executes, not what it computes
    from keras_vit.training import run

    run_dir = tmp_path / "run"
    config = TrainConfig(run_dir=str(run_dir), model=SMALL_MODEL, epochs=1, jit_compile=False).resolved()
    run._prepare_run_dir(config, overwrite=False)
    run._store_config(config)
    (run_dir / "backup").mkdir()
    (run_dir / "backup" / "state").write_text("an interrupted run's state")
    caplog.set_level(logging.INFO, logger="keras_vit")
    resumed = dataclasses.replace(config, jit_compile=True, steps_per_execution=2)
    run._prepare_run_dir(resumed, overwrite=False)
    run._store_config(resumed)
    changed = "jit_compile: False there, True now, steps_per_execution: None there, 2 now"
    assert f"holds this run, now with {changed}" in caplog.text
    assert (run_dir / "backup" / "state").exists() and "jit_compile: true" in (run_dir / "config.yaml").read_text()
    with pytest.raises(ValueError, match=r"different config \(epochs: 1 there, 2 now\); pass --overwrite"):
        run._prepare_run_dir(dataclasses.replace(config, epochs=2, jit_compile=True), overwrite=False)
    # The run's directory, data or weights spelt otherwise (a trailing slash, ./) are the same run's.
    spelt = dataclasses.replace(resumed, run_dir=f"{run_dir}/")
    run._prepare_run_dir(spelt, overwrite=False)
    assert (run_dir / "backup" / "state").exists()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    assert not run._differs("dataset", "data", "./data/") and not run._differs("weights", "run", str(run_dir))
    assert run._differs("dataset", "data", "digits") and run._differs("weights", "run", "vit_b16.augreg_in21k")
    run._prepare_run_dir(dataclasses.replace(config, epochs=2), overwrite=True)
    assert not (run_dir / "backup").exists()
    other = tmp_path / "not_a_run"  # --overwrite empties run directories only, never another folder
    (other / "tensorboard").mkdir(parents=True)
    (other / "log.csv").write_text("someone else's")
    run._prepare_run_dir(dataclasses.replace(config, run_dir=str(other)), overwrite=True)
    assert (other / "tensorboard").is_dir() and (other / "log.csv").is_file()


def test_finished_run_is_not_trained_again_unless_overwritten(tmp_path, capsys, small):
    run_dir = tmp_path / "run"
    args = ["train", "--config", small, "--epochs", "2", "--run-dir", str(run_dir)]
    assert main(args) == 0
    trained = json.loads(capsys.readouterr().out.splitlines()[-1])  # after the progress bars
    files = {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()}
    log = (run_dir / "log.csv").read_text()
    assert main(args) == 0  # the same command again: the finished run's evaluation, nothing retrained
    captured = capsys.readouterr()
    assert json.loads(captured.out) == trained  # nothing else: no progress bar
    assert f"{run_dir} is finished; its eval.json follows (--overwrite trains it again)" in captured.err
    assert {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()} == files
    assert (run_dir / "log.csv").read_text() == log
    (run_dir / "worker_1" / "backup").mkdir(parents=True)  # a worker's resume state of the old run
    assert main([*args, "--overwrite"]) == 0  # trained from scratch: two epochs logged, not four
    assert "is finished" not in capsys.readouterr().err
    assert (run_dir / "log.csv").read_text().count("\n") == 3 and not (run_dir / "worker_1").exists()
    assert (run_dir / "best.keras").stat().st_mtime_ns > files["best.keras"]


def test_fine_tuning_a_run_into_its_own_directory_is_refused_and_leaves_it_whole(tmp_path, capsys, small):
    # With --overwrite the directory was emptied before the weights were read: the run was lost
    run_dir = tmp_path / "run"
    assert main(["train", "--config", small, "--epochs", "1", "--run-dir", str(run_dir)]) == 0
    files = {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()}
    capsys.readouterr()
    for weights in (run_dir, run_dir / "best.keras"):
        for more in ([], ["--overwrite"]):
            args = ["train", "--epochs", "2", "--weights", str(weights), "--run-dir", str(run_dir), *more]
            assert main(args) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert err == [
                f"keras-vit train: error: the weights {weights} are the run in {run_dir} that this command would "
                "replace; fine-tune from them into another run directory."
            ]
    assert {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()} == files


def test_several_steps_per_execution_under_pytorch_are_refused_before_any_work(tmp_path, monkeypatch):
    import keras

    monkeypatch.setattr(keras.backend, "backend", lambda: "torch")
    with pytest.raises(ValueError, match="3 steps per execution need the TensorFlow or JAX backend"):
        fit(TrainConfig(run_dir=str(tmp_path / "run"), steps_per_execution=3))
    assert not (tmp_path / "run").exists()


def test_a_run_stopped_while_evaluating_evaluates_again_without_training_again(tmp_path, capsys, monkeypatch, small):
    from keras_vit.training import run
    from keras_vit.training.callbacks import Interrupted

    run_dir = tmp_path / "run"
    args = ["train", "--config", small, "--epochs", "2", "--run-dir", str(run_dir), "--checkpoint-interval", "3600"]

    def interrupted(*args, **kwargs):
        # `kill` (SIGTERM) once both epochs are trained, while best.keras is evaluated
        raise Interrupted(signal.SIGTERM)

    monkeypatch.setattr(run, "evaluate", interrupted)
    assert main(args) == 128 + signal.SIGTERM
    assert "keras-vit train: stopped by SIGTERM; the same command goes on after epoch 2" in capsys.readouterr().err
    monkeypatch.undo()
    log = (run_dir / "log.csv").read_text()
    assert log.count("\n") == 3 and not (run_dir / "eval.json").exists()
    assert main(["evaluate", str(run_dir)]) == 0  # the stopped run's model is scored; eval.json is the run's
    assert "has not finished" in capsys.readouterr().err and not (run_dir / "eval.json").exists()
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "all 2 epochs are trained" in captured.err and "top1" in json.loads(captured.out.splitlines()[-1])
    assert (run_dir / "log.csv").read_text() == log  # nothing trained again
    assert not (run_dir / "backup").exists()  # finished: the same command now prints eval.json
    assert main(args) == 0 and "is finished" in capsys.readouterr().err


def test_nan_loss_stops_with_a_reason(tmp_path):
    config = TrainConfig(run_dir=str(tmp_path / "run"), model=SMALL_MODEL, epochs=2, learning_rate=1e9)
    with pytest.raises(TrainingError, match=r"stopped: loss became nan at epoch 1, step \d+"):
        fit(config, verbose=0)


def test_xla_is_off_by_default_on_cpu_only_machines_on_for_digits_and_when_asked(tmp_path, caplog):
    import tensorflow as tf

    from keras_vit.training.strategy import make_placement
    from keras_vit_cli import build_parser

    parse = build_parser().parse_args
    assert [parse(["train", *flag]).jit_compile for flag in ([], ["--jit-compile"], ["--no-jit-compile"])] == [
        None,
        True,
        False,
    ]
    gpu = bool(tf.config.list_physical_devices("GPU"))
    other = TrainConfig(dataset="tfds:cifar10").resolved()
    assert other.jit_compile is None and make_placement(other).prefers_jit == gpu
    caplog.set_level(logging.INFO, logger="keras_vit")
    for jit_compile, expected in ((None, ", XLA"), (False, "graph mode (no XLA)")):  # digits: XLA by default
        caplog.clear()
        fit(
            TrainConfig(run_dir=str(tmp_path / str(jit_compile)), model=SMALL_MODEL, epochs=1, jit_compile=jit_compile),
            verbose=0,
        )
        assert expected in caplog.text, caplog.text


@pytest.mark.parametrize(
    "bf16_instructions, precision, backend, prefers",
    [
        (False, "mixed_bfloat16", "tensorflow", True),
        (None, "mixed_bfloat16", "tensorflow", False),
        (True, "mixed_bfloat16", "tensorflow", False),
        (False, "float32", "tensorflow", False),
        (False, "mixed_bfloat16", "torch", False),  # torch.compile there: minutes to compile a small model
    ],
)
def test_cpu_without_bf16_instructions_trains_mixed_bfloat16_under_xla(
    bf16_instructions, precision, backend, prefers, monkeypatch
):
    import keras

    from keras_vit.training import strategy

    if tf.config.list_physical_devices("GPU"):
        pytest.skip("the CPU-only default")
    monkeypatch.setattr(strategy, "has_bf16_instructions", lambda: bf16_instructions)
    monkeypatch.setattr(keras.backend, "backend", lambda: backend)
    placement = strategy.make_placement(TrainConfig(precision=precision))
    assert placement.prefers_jit is prefers and placement.supports_jit


def test_cpu_bf16_instructions_read_from_cpuinfo(monkeypatch, tmp_path):
    from keras_vit import cpu

    assert cpu.has_bf16_instructions() in (True, False, None)  # this machine, whatever it has
    real_read = Path.read_text
    for machine, flags, expected in (
        ("x86_64", "flags\t\t: fpu avx2 avx512f avx512_bf16", True),
        ("x86_64", "flags\t\t: fpu avx2 fma", False),
        ("aarch64", "Features\t: fp asimd sve bf16 i8mm", True),
        ("aarch64", "Features\t: fp asimd", False),
    ):
        monkeypatch.setattr(cpu.platform, "machine", lambda m=machine: m)
        monkeypatch.setattr(
            Path,
            "read_text",
            lambda self, *a, f=flags, **k: (
                f"processor\t: 0\n{f}\n" if str(self) == "/proc/cpuinfo" else real_read(self, *a, **k)
            ),
        )
        assert cpu.has_bf16_instructions() is expected, (machine, flags)

    def unreadable(self, *args, **kwargs):
        raise PermissionError(str(self))

    monkeypatch.setattr(Path, "read_text", unreadable)
    assert cpu.cpu_flags() is None and cpu.has_bf16_instructions() is None  # graph mode stays the default


def test_yaml_config_with_flag_override(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("epochs: 3\nbatch_size: 16\nmodel: {hidden_size: 48}\n")
    config = TrainConfig.from_yaml(path, batch_size=8)
    assert (config.epochs, config.batch_size, config.model) == (3, 8, {"hidden_size": 48})
    path.write_text("epoch: 3\n")
    with pytest.raises(ValueError, match=r"unknown training option\(s\): epoch; epoch: did you mean epochs\?"):
        TrainConfig.from_yaml(path)
    path.write_text("epochs: [3\n")  # a typo a user makes: one line naming where, not a traceback
    with pytest.raises(ValueError, match=r"train.yaml is not valid YAML at line 2, column 1: expected ','"):
        TrainConfig.from_yaml(path)
    path.write_text("- epochs\n")
    with pytest.raises(ValueError, match="expected a mapping of training options"):
        TrainConfig.from_yaml(path)
    # `1e-3` is a number (YAML 1.2; PyYAML's 1.1 rules read it as a string, and training
    # crashed dividing it); a value of the wrong type is one line naming the option.
    path.write_text("learning_rate: 1e-3\nweight_decay: 2.5E-1\nmixup: .5e0\nwarmup_fraction: 1.0e-1\n")
    config = TrainConfig.from_yaml(path)
    assert (config.learning_rate, config.weight_decay, config.mixup, config.warmup_fraction) == (1e-3, 0.25, 0.5, 0.1)
    path.write_text("epochs: ten\n")
    with pytest.raises(ValueError, match=r"training option `epochs` must be an integer or null; got 'ten'\."):
        TrainConfig.from_yaml(path)
    path.write_text("mixup: '0.2'\n")
    with pytest.raises(ValueError, match=r"`mixup` must be a number; got '0.2'"):
        TrainConfig.from_yaml(path)


def _run_cli(args, env_extra=None):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env_extra or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "keras_vit_cli", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_killed_run_resumes_and_finishes(tmp_path, small):
    run_dir = tmp_path / "run"
    epochs = 12
    args = ["train", "--config", small, "--run-dir", str(run_dir), "--epochs", str(epochs), "--seed", "1"]
    process = _run_cli(args)
    log = run_dir / "log.csv"
    deadline = time.time() + 300
    while time.time() < deadline and (not log.exists() or len(log.read_text().splitlines()) < 3):
        time.sleep(0.05)  # wait until two epochs are logged, then kill in the third
    time.sleep(0.1)
    process.send_signal(signal.SIGKILL)
    process.wait()
    epochs_before = len(log.read_text().splitlines()) - 1
    assert 2 <= epochs_before < epochs
    assert (run_dir / "backup").exists()
    resumed = _run_cli(args)
    output, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, output[-2000:]
    resumed_from = r"keras_vit: resuming after (step \d+ of )?epoch \d+, from the resume state in \S+backup\n"
    assert re.search(resumed_from, output), output[-2000:]
    rows = [line.split(",")[0] for line in log.read_text().splitlines()[1:]]
    assert sorted(set(rows), key=int) == [str(e) for e in range(epochs)]  # every epoch, none lost
    resumed_top1 = json.loads((run_dir / "eval.json").read_text())["top1"]
    # the same command, never interrupted: the resumed run repeats the steps since the last save
    # on the same data, so it ends where this one does
    straight = _run_cli([*args[:3], "--run-dir", str(tmp_path / "straight"), *args[5:]])
    output, _ = straight.communicate(timeout=600)
    assert straight.returncode == 0, output[-2000:]
    straight_top1 = json.loads((tmp_path / "straight" / "eval.json").read_text())["top1"]
    assert abs(resumed_top1 - straight_top1) <= 0.01, (resumed_top1, straight_top1)


def test_mirrored_on_two_logical_cpus_keeps_replicas_identical(tmp_path):
    script = f"""
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import numpy as np
from keras_vit.training import TrainConfig, fit
from keras_vit.training import run
captured = {{}}
original = run._build_model
def build(*args, **kwargs):
    captured["model"] = original(*args, **kwargs)
    return captured["model"]
run._build_model = build
fit(TrainConfig(run_dir={str(tmp_path / "run")!r}, model={SMALL_MODEL!r}, epochs=1, strategy="mirrored"), verbose=0)
model = captured["model"]
replicas = [v for v in model.trainable_variables]
values = [[np.asarray(x) for x in v.value.values] if hasattr(v.value, "values") else None for v in replicas]
assert all(vals is not None and len(vals) == 2 for vals in values), "not mirrored over 2 replicas"
assert all(np.array_equal(vals[0], vals[1]) for vals in values), "replicas differ"
print("REPLICAS-IDENTICAL", len(values))
"""
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert "REPLICAS-IDENTICAL" in result.stdout, (result.stdout + result.stderr)[-3000:]


def _free_ports(count):
    import socket

    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ",".join(map(str, ports))


def _two_workers(run_dir, patch):
    ports = _free_ports(2)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    jobs = [
        subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "tests" / "multi_worker_job.py"),
                str(i),
                ports,
                str(run_dir),
                "1" if patch else "0",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    return [job.communicate(timeout=300)[0] for job in jobs]


def test_multi_worker_two_local_processes_train_and_count_every_example_once(tmp_path):
    """MultiWorkerMirroredStrategy over two local processes, each with its own input pipeline:
    both end with the same weights; the chief writes the run directory, whose evaluation counts
    the 359 held-out examples once (as a fresh one-device `evaluate` of its best.keras does); the
    other worker leaves nothing behind."""
    from keras_vit.training import evaluate

    run_dir = tmp_path / "run"
    outputs = _two_workers(run_dir, patch=True)
    assert "WORKER-0-OK" in outputs[0] and "WORKER-1-OK" in outputs[1], [o[-1500:] for o in outputs]
    sums = [re.findall(r"WEIGHTS (\S+)", o) for o in outputs]
    assert sums[0] and sums[0] == sums[1], sums  # each worker read its own examples, the replicas stayed in step
    reported = json.loads((run_dir / "eval.json").read_text())
    again = evaluate(run_dir)
    assert reported["num_examples"] == again["num_examples"] == 359
    assert abs(reported["top1"] - again["top1"]) < 1e-6
    assert not list(run_dir.glob("worker_*"))


def test_multi_worker_workaround_is_still_needed(tmp_path):
    """Fails once plain Keras trains under MultiWorkerMirroredStrategy: then drop
    keras_vit/training/multi_worker.py."""
    outputs = _two_workers(tmp_path / "run", patch=False)
    assert all("FAILED" in o for o in outputs), [o[-1500:] for o in outputs]
    assert any("PerReplica" in o or "reduction dimension" in o for o in outputs), [o[-1500:] for o in outputs]


def test_global_batch_must_divide_by_replicas_and_randaugment_runs(tmp_path):
    from keras_vit.training import run

    assert run._global_batch(TrainConfig(global_batch_size=64), 2) == 64
    with pytest.raises(ValueError, match="global batch 63 is not divisible by the 2 replicas"):
        run._global_batch(TrainConfig(global_batch_size=63), 2)
    source = datasets.digits()
    config = TrainConfig(randaugment=0.5)
    images, _ = next(iter(pipeline.train_pipeline(source, config, (16, 16), 10, 8)))
    assert images.shape == (8, 16, 16, 3) and np.isfinite(images.numpy()).all()
    with pytest.raises(ValueError, match=r"randaugment must be in \(0, 1\]"):
        TrainConfig(randaugment=2.0)


def test_nan_epoch_never_replaces_the_last_good_checkpoint(tmp_path):
    import keras

    import keras_vit
    from keras_vit.training.callbacks import AtomicCheckpoint

    model = keras_vit.ViT(keras_vit.ViTConfig(**SMALL_MODEL, num_classes=3))
    callback = AtomicCheckpoint(tmp_path)
    callback.set_model(model)
    callback.on_epoch_end(0, {"loss": 0.9, "val_accuracy": 0.5})
    good = {name: (tmp_path / name).read_bytes() for name in ("best.keras", "last.keras")}
    model.get_layer("head").kernel.assign(np.full((32, 3), np.nan, "float32"))
    callback.on_epoch_end(1, {"loss": float("nan"), "val_accuracy": 0.9})
    for name, data in good.items():
        assert (tmp_path / name).read_bytes() == data, name
    restored = keras.saving.load_model(tmp_path / "best.keras")
    assert np.isfinite(keras.ops.convert_to_numpy(restored.get_layer("head").kernel)).all()
    assert not list(tmp_path.glob(".*tmp*"))  # no half-written files left


def test_a_kill_while_saving_the_resume_state_leaves_the_previous_one_whole(tmp_path, monkeypatch):
    import keras

    import keras_vit
    from keras_vit.training.callbacks import ResumeState

    def compiled():
        model = keras_vit.ViT(keras_vit.ViTConfig(**SMALL_MODEL, num_classes=3))
        model.compile(optimizer="adamw", loss="categorical_crossentropy")
        model.optimizer.build(model.trainable_variables)
        return model

    model = compiled()
    backup = ResumeState(str(tmp_path / "backup"), interval=0)
    backup.set_model(model)
    backup.on_epoch_end(0)
    saved = keras.ops.convert_to_numpy(model.get_layer("head").kernel)

    def killed_half_way(self, filepath, overwrite=True):
        Path(filepath).write_bytes(b"\x89HDF\r\n\x1a\n half a file")
        raise KeyboardInterrupt  # as SIGINT (or a kill) would land in the middle of the write

    model.get_layer("head").kernel.assign(np.ones((32, 3), "float32"))
    monkeypatch.setattr(type(model), "save_weights", killed_half_way)
    with pytest.raises(KeyboardInterrupt):
        backup.on_epoch_end(1)
    monkeypatch.undo()

    resumed = compiled()
    restore = ResumeState(str(tmp_path / "backup"))
    restore.set_model(resumed)
    assert restore.restore() == (1, 0)  # the state after epoch 1, not the half-written one after epoch 2
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(resumed.get_layer("head").kernel), saved)

    # The state after epoch 1 is one position file naming one weights file; the half-written
    # weights of epoch 2 were never named.
    assert sorted(p.name for p in (tmp_path / "backup").glob("state-*")) == [
        "state-1-0.seeds.npz",  # dropout's random generators' states
        "state-1-0.weights.h5",
    ]
    backup.on_train_batch_end(4)  # within epochs: not without `within_epochs`
    assert ResumeState.saved_step(tmp_path / "backup") == 0

    # A state of an earlier version (Keras's BackupAndRestore files) resumes too; the next save
    # replaces it.
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    model.save_weights(legacy / "latest.weights.h5")
    (legacy / "training_metadata.json").write_text(json.dumps({"epoch": 3, "batch": 0}))
    restore = ResumeState(str(legacy))
    restore.set_model(compiled())
    assert restore.restore() == (3, 0) and ResumeState.saved_epochs(legacy) == 3
    restore.on_epoch_end(3)
    assert sorted(p.name for p in legacy.iterdir()) == ["position.json", "state-4-0.seeds.npz", "state-4-0.weights.h5"]
    # A state damaged some other way (a full disk, a copy cut short) is named, with what to do.
    weights = tmp_path / "backup" / "state-1-0.weights.h5"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    restore = ResumeState(str(tmp_path / "backup"))
    restore.set_model(compiled())
    with pytest.raises(OSError, match=r"resume state in \S+backup cannot be read .*remove that folder to train"):
        restore.restore()


def test_a_stop_during_an_epochs_end_waits_for_a_step_that_saves_it(tmp_path):
    """A signal noted after the resume state decided whether to save at an epoch's end (while
    last.keras is written, say) is raised at the next step's end, where the state is saved,
    not at the epoch's end, which would lose the steps since the last save."""
    from keras_vit.training.callbacks import Interrupted, ResumeState, StopOnInterrupt

    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        pytest.skip("SIGTERM is handled by someone else in this process")
    interrupt = StopOnInterrupt()
    resume = ResumeState(
        str(tmp_path / "backup"), interval=3600, within_epochs=True, stopping=lambda: interrupt.pending
    )
    interrupt.saver = resume
    saved = []
    resume._save = lambda epoch, step: saved.append((epoch, step))
    for callback in (resume, interrupt):
        callback.set_params({"epochs": 5, "steps": 10})
        callback.on_train_begin()
    with pytest.raises(Interrupted):
        with interrupt:
            resume.on_epoch_begin(1)
            resume.on_epoch_end(1)  # saves (the first epoch of this fit) before the signal
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)
            interrupt.on_epoch_end(1)  # not raised here
            resume.on_epoch_begin(2)
            resume.on_train_batch_end(3)
            assert saved == [(2, 0), (2, 4)]
            interrupt.on_train_batch_end(3)
    assert saved == [(2, 0), (2, 4)]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_and_sigterm_are_noted_and_raised_between_steps(signum):
    from keras_vit.training.callbacks import StopOnInterrupt

    default = StopOnInterrupt._DEFAULTS[signum]
    previous = signal.signal(signum, default)  # Python's own handler, whatever the test worker had
    try:
        _noted_and_raised(signum)

        def someone_elses(*args):
            pass

        signal.signal(signum, someone_elses)
        with StopOnInterrupt():
            assert signal.getsignal(signum) is someone_elses  # another handler is left in place
    finally:
        signal.signal(signum, previous)


def _noted_and_raised(signum):
    from keras_vit.training.callbacks import Interrupted, StopOnInterrupt

    default = StopOnInterrupt._DEFAULTS[signum]
    with pytest.raises(Interrupted) as stopped:
        with StopOnInterrupt() as interrupt:
            os.kill(os.getpid(), signum)  # noted: nothing raised inside a step
            time.sleep(0.1)
            interrupt.on_train_batch_begin(0)  # not a step's end
            with pytest.raises(Interrupted):
                interrupt.on_train_batch_end(0)
            interrupt.on_train_batch_end(1)  # raised once
            os.kill(os.getpid(), signum)  # noted after the last step: raised on leaving
            time.sleep(0.1)
    assert stopped.value.signum == signum and isinstance(stopped.value, KeyboardInterrupt)
    assert signal.getsignal(signum) is default
    with pytest.raises(Interrupted):  # a second signal raises at once
        with StopOnInterrupt():
            os.kill(os.getpid(), signum)
            time.sleep(0.1)
            os.kill(os.getpid(), signum)
            time.sleep(0.1)
            raise AssertionError("the second signal did not raise")
    assert signal.getsignal(signum) is default


def test_resumed_run_keeps_the_best_epoch_of_before_the_interruption(tmp_path):
    import keras_vit
    from keras_vit.training.callbacks import AtomicCheckpoint

    (tmp_path / "log.csv").write_text("epoch,loss,val_accuracy\n0,1.2,0.5\n1,0.9,0.8\n2,nan,NA\n")
    callback = AtomicCheckpoint(tmp_path)
    callback.set_model(keras_vit.ViT(keras_vit.ViTConfig(**SMALL_MODEL, num_classes=3)))
    callback.on_train_begin()
    callback.on_epoch_end(3, {"loss": 0.7, "val_accuracy": 0.7})
    assert (tmp_path / "last.keras").is_file() and not (tmp_path / "best.keras").exists()
    callback.on_epoch_end(4, {"loss": 0.6, "val_accuracy": 0.85})
    assert (tmp_path / "best.keras").is_file() and callback.best == 0.85


def test_dataset_defaults_fill_only_unset_options():
    digits = TrainConfig().resolved()
    assert (digits.flip, digits.augment, digits.label_smoothing, digits.epochs) == (False, "affine", 0.1, 130)
    mine = TrainConfig(flip=True, augment="inception", label_smoothing=0.0, epochs=3).resolved()
    assert (mine.flip, mine.augment, mine.label_smoothing, mine.epochs) == (True, "inception", 0.0, 3)
    other = TrainConfig(dataset="tfds:cifar10").resolved()
    assert (other.flip, other.augment, other.label_smoothing) == (True, "inception", 0.0)
    # Starting from weights is fine-tuning (SGD, clipping) unless the recipe is named.
    tuned = TrainConfig(dataset="tfds:cifar10", weights="runs/pretrained").resolved()
    assert (tuned.recipe, tuned.clip_norm, tuned.learning_rate) == ("finetune", 1.0, 0.01)
    assert TrainConfig(dataset="tfds:cifar10", weights="x", recipe="pretrain").resolved().recipe == "pretrain"
    # Digits fine-tuning: the recipe's schedule, the digits augmentation.
    digits_tuned = TrainConfig(weights="runs/digits").resolved()
    assert (digits_tuned.learning_rate, digits_tuned.base_batch_size, digits_tuned.weight_decay) == (0.01, 512, 0.0)
    assert (digits_tuned.clip_norm, digits_tuned.augment, digits_tuned.flip) == (1.0, "affine", False)
    assert TrainConfig(dataset="tfds:cifar10").resolved().recipe == "pretrain"
    for field in ("recipe", "augment"):  # choices that include None are listed without it
        with pytest.raises(ValueError, match=f"unknown {field} 'bogus'; choose from [a-z, -]+\\.$"):
            TrainConfig(**{field: "bogus"})


def test_a_run_resumed_on_other_devices_keeps_its_global_batch(tmp_path):
    """The resume state records the global batch: on another number of devices the run goes on
    with the same batch, steps and schedule, the per-replica batch changed."""
    import json

    from keras_vit.training import run

    config = TrainConfig(run_dir=str(tmp_path), batch_size=32)
    backup = tmp_path / "backup"
    assert run._resumed_global_batch(config, 2, backup) == 64  # nothing saved yet
    backup.mkdir()
    (backup / "training_metadata.json").write_text(json.dumps({"epoch": 2, "batch": -1, "global_batch": 64}))
    assert run._resumed_global_batch(config, 1, backup) == 64 and run._resumed_global_batch(config, 4, backup) == 64
    with pytest.raises(ValueError, match="trained at a global batch of 64, which 3 replicas cannot share"):
        run._resumed_global_batch(config, 3, backup)


def test_digits_from_weights_takes_the_checkpoints_architecture(tmp_path):
    """Without a preset the model is the checkpoint's, for digits too (it was the digits model,
    which the weights did not fit), seen whole as digits are (crop fraction 1)."""
    import keras_vit

    other = keras_vit.ViTConfig(image_size=16, patch_size=4, hidden_size=32, num_layers=2, num_heads=2, mlp_dim=64)
    keras_vit.saving.save_model(keras_vit.ViT(other.replace(num_classes=10)), tmp_path / "other.keras")
    fit(TrainConfig(run_dir=str(tmp_path / "run"), weights=str(tmp_path / "other.keras"), epochs=1), verbose=0)
    trained = keras_vit.saving.load_model(tmp_path / "run")
    assert (trained.config.hidden_size, trained.config.num_layers, trained.config.image_size) == (32, 2, (16, 16))
    assert trained.config.crop_fraction == 1.0


def test_ema_saves_the_moving_average_of_the_weights(tmp_path):
    """With a momentum this close to 1 the average barely leaves the initial weights, while the
    weights themselves move: best.keras (and what is evaluated) must be the average."""
    import keras

    import keras_vit
    from keras_vit.training.run import _build_model, _model_config

    def saved(name, **options):
        config = TrainConfig(run_dir=str(tmp_path / name), model=SMALL_MODEL, epochs=2, **options)
        fit(config, verbose=0)
        model = keras_vit.saving.load_model(tmp_path / name)
        return [keras.ops.convert_to_numpy(w) for w in model.weights]

    config = TrainConfig(model=SMALL_MODEL).resolved()
    keras.utils.set_random_seed(config.seed)  # as fit does before building the model
    initial = [
        keras.ops.convert_to_numpy(w)
        for w in _build_model(config, _model_config(config, 10), [str(d) for d in range(10)]).weights
    ]
    moved = max(np.abs(a - b).max() for a, b in zip(saved("raw"), initial))
    averaged = max(np.abs(a - b).max() for a, b in zip(saved("ema", ema=0.999999), initial))
    assert moved > 1e-2 and averaged < 1e-4, (moved, averaged)
    with pytest.raises(ValueError, match="ema"):
        TrainConfig(ema=1.0)


def test_checkpoints_wait_for_their_interval_but_never_miss_the_last_epoch_or_a_better_one(tmp_path):
    import keras_vit
    from keras_vit.training.callbacks import AtomicCheckpoint

    callback = AtomicCheckpoint(tmp_path, monitor="val_accuracy", interval=3600)
    callback.set_model(keras_vit.ViT(keras_vit.ViTConfig(**SMALL_MODEL, num_classes=3)))
    callback.set_params({"epochs": 3})
    last = tmp_path / "last.keras"
    callback.on_epoch_end(0, {"loss": 1.0, "val_accuracy": 0.5})  # the first epoch is saved
    first = last.stat().st_mtime_ns
    callback.on_epoch_end(1, {"loss": 0.9, "val_accuracy": 0.4})  # within the interval, no better
    assert last.stat().st_mtime_ns == first and callback.best == 0.5
    (tmp_path / "best.keras").unlink()
    callback.on_epoch_end(1, {"loss": 0.8, "val_accuracy": 0.6})  # better: best.keras at once
    assert (tmp_path / "best.keras").is_file() and last.stat().st_mtime_ns == first
    callback.on_epoch_end(2, {"loss": 0.7, "val_accuracy": 0.55})  # the last epoch
    assert last.stat().st_mtime_ns > first


def test_finetune_protocols_fill_what_the_run_leaves_open():
    c = TrainConfig(protocol="cifar10").resolved()
    assert (c.recipe, c.dataset, c.train_split, c.eval_split) == ("finetune", "tfds:cifar10", "train[:98%]", "test")
    assert (c.steps, c.epochs, c.learning_rate, c.base_batch_size, c.global_batch_size) == (
        10_000,
        None,
        0.03,
        512,
        512,
    )
    assert (c.clip_norm, c.weight_decay, c.batch_size) == (1.0, 0.0, 32)
    assert c.model == {"image_size": 384, "crop_fraction": 1.0}
    own = TrainConfig(protocol="imagenet", learning_rate=0.01, model={"image_size": 224}, epochs=3).resolved()
    assert (own.learning_rate, own.epochs, own.steps, own.model["image_size"]) == (0.01, 3, None, 224)
    assert TrainConfig(protocol="vtab", dataset="tfds:dtd").resolved().steps == 2500
    # What the command sets wins: the dataset (digits too), a per-replica batch, the warm-up.
    mine = TrainConfig(protocol="pets", dataset="digits", batch_size=64, warmup_fraction=0.2).resolved()
    assert (mine.dataset, mine.batch_size, mine.global_batch_size, mine.warmup_fraction) == ("digits", 64, None, 0.2)
    assert (mine.train_split, mine.eval_split) == (None, None)  # the protocol's splits are of its own dataset
    assert TrainConfig(protocol="pets", dataset="tfds:oxford_iiit_pet").resolved().eval_split == "test"
    assert TrainConfig(protocol="pets", global_batch_size=128).resolved().global_batch_size == 128
    with pytest.raises(ValueError, match="protocol vtab names no dataset"):
        TrainConfig(protocol="vtab").resolved()
    with pytest.raises(ValueError, match=r"steps \(10\) and epochs \(2\) are one or the other"):
        TrainConfig(steps=10, epochs=2)
    with pytest.raises(ValueError, match="unknown protocol 'svhn'"):
        TrainConfig(protocol="svhn")
    from keras_vit.training.recipes import schedule, warmup_steps

    assert schedule(TrainConfig(steps=10).resolved(), 16, 4) == (4, 3)  # 3 epochs of 4 steps >= 10
    assert schedule(TrainConfig(epochs=2).resolved(), 16, 4) == (4, 2)

    def warmup(total, **options):
        return warmup_steps(TrainConfig(**options).resolved(), total)

    # A protocol warms up over 500 steps, at most a tenth of the run, whether it counts steps or epochs.
    assert warmup(10_000, protocol="cifar10") == 500
    assert warmup(504, protocol="pets") == 50
    assert warmup(60 * 95, protocol="cifar10", epochs=60) == 500
    assert warmup(2 * 95, protocol="cifar10", epochs=2) == 19
    assert warmup(10_000, protocol="cifar10", warmup_fraction=0.2) == 2000
    assert warmup(130 * 45) == 585  # the digits default: 10%


def test_a_run_without_a_run_dir_goes_to_runs_and_its_datasets_name(tmp_path):
    def run_dir(**options):
        return TrainConfig(**options).resolved().run_dir

    assert run_dir() == str(Path("runs/digits"))
    assert run_dir(protocol="cifar10") == str(Path("runs/cifar10"))
    assert run_dir(dataset="tfds:oxford_iiit_pet:4.0.0") == str(Path("runs/oxford_iiit_pet"))
    assert run_dir(dataset="tfds:imagenet2012_subset/1pct") == str(Path("runs/imagenet2012_subset-1pct"))
    assert run_dir(dataset=str(tmp_path / "flowers") + "/") == str(Path("runs/flowers"))
    assert run_dir(dataset="tfds:cifar10", run_dir="elsewhere") == "elsewhere"


def test_cifar10_protocol_runs_with_mock_data(tmp_path, monkeypatch):
    """The protocol on tfds's mock CIFAR-10: its splits and SGD recipe, a small model and batch."""
    import tensorflow_datasets as tfds

    monkeypatch.setattr(datasets, "network_available", lambda: True)
    with tfds.testing.mock_data(num_examples=16):
        config = TrainConfig(
            protocol="cifar10", run_dir=str(tmp_path / "run"), model=SMALL_MODEL, steps=5, global_batch_size=4
        )
        result = fit(config, verbose=0)
    stored = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert stored["recipe"] == "finetune" and stored["steps"] == 5 and stored["model"]["crop_fraction"] == 1.0
    assert len((tmp_path / "run" / "log.csv").read_text().splitlines()) == 1 + 2  # 2 epochs of 3 steps
    assert result["num_examples"] > 0


def test_scale_out_options_fail_with_one_line_where_they_cannot_work(tmp_path, capsys):
    """Model parallel and several processes are JAX's; half the process flags, a model that
    does not split, or a non-positive count are refused before any work."""
    import keras

    import keras_vit

    run_dir = str(tmp_path / "r")
    if keras.backend.backend() == "tensorflow":
        assert main(["train", "--model-parallel", "2", "--epochs", "1", "--run-dir", run_dir]) == 2
        assert "runs under the JAX backend" in capsys.readouterr().err
    assert main(["train", "--num-processes", "2", "--epochs", "1", "--run-dir", run_dir]) == 2
    assert "--num-processes, --process-id and --job-addresses go together" in capsys.readouterr().err
    flags = ["--num-processes", "2", "--process-id", "2", "--job-addresses", "localhost:1"]
    assert main(["train", *flags, "--epochs", "1", "--run-dir", run_dir]) == 2
    assert "--process-id must be in 0..1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="model-parallel device count must be positive"):
        TrainConfig(model_parallel=0)
    with pytest.raises(ValueError, match="needs hidden_size divisible by 4; this model has hidden_size=30"):
        keras_vit.distribution.check_model_parallel(keras_vit.ViTConfig(hidden_size=30, num_heads=3), 4)


def test_predict_reads_an_iterable_one_chunk_at_a_time(tmp_path, monkeypatch):
    from helpers import perturb

    import keras_vit
    from keras_vit.training import iter_predict, predict, run

    path = tmp_path / "m.keras"
    keras_vit.saving.save_model(perturb(keras_vit.ViT(keras_vit.ViTConfig(**SMALL_MODEL, num_classes=3))), path)
    pictures = np.random.default_rng(0).integers(0, 256, (5, 30, 20, 3), dtype=np.uint8)
    monkeypatch.setattr(run, "PREDICT_CHUNK", 2)
    read = []

    def lazily():
        for picture in pictures:
            read.append(1)
            yield picture

    results = iter_predict(path, lazily(), top_k=2)
    first = next(results)
    assert len(read) == 2  # the first chunk only
    rest = list(results)
    assert len(read) == 5 and [first, *rest] == predict(path, pictures, top_k=2)
    assert all(len(top) == 2 and top[0][1] >= top[1][1] for top in rest)
    # Grayscale arrays, with or without a channel axis, are read as RGB ones.
    gray = pictures[..., 0]
    rgb = predict(path, np.repeat(gray[..., None], 3, axis=-1), top_k=2)
    assert predict(path, gray, top_k=2) == predict(path, list(gray[..., None]), top_k=2) == rgb
    with pytest.raises(ValueError, match=r"image 0 is not an image's pixels .* got uint8 of shape \(30,\)"):
        predict(path, [gray[0][:, 0]])
    with pytest.raises(ValueError, match=r"image 1 is not an image's pixels .* got uint8 of shape \(1, 30, 20, 3\)"):
        predict(path, [pictures[0], pictures[:1]])  # a batch inside the list


def test_predict_refuses_file_names_and_a_lone_image_and_warns_of_pixels_in_0_1(tmp_path, caplog):
    # A list of paths failed with "IndexError: tuple index out of range"; one (H, W, 3) image was
    # read as H grayscale images of W x 3 pixels; pixels scaled to [0, 1] gave one class for all.
    from helpers import perturb

    import keras_vit
    from keras_vit.training import predict

    path = tmp_path / "m.keras"
    keras_vit.saving.save_model(perturb(keras_vit.ViT(keras_vit.ViTConfig(**SMALL_MODEL, num_classes=3))), path)
    pictures = np.random.default_rng(0).integers(0, 256, (2, 30, 20, 3), dtype=np.uint8)
    for name in ("photo.jpg", tmp_path / "photo.jpg"):
        with pytest.raises(ValueError, match=r"image 0 is a file name .*photo.jpg.*`keras-vit predict`, which reads"):
            predict(path, [name])
    with pytest.raises(ValueError, match=r"images of shape \(30, 20, 3\) read as one image, not a batch"):
        predict(path, pictures[0])
    assert predict(path, pictures[0][None]) == predict(path, [pictures[0]])
    # Pillow images are read by their mode, as `keras-vit predict` reads files: a palette image's
    # indices and a 16-bit image's 0-65535 values were classified as pixels.
    rgb = Image.fromarray(pictures[0])
    wide = Image.fromarray((pictures[0][..., 0].astype(np.uint16) << 8) | 255)
    assert wide.mode in ("I;16", "I") or wide.mode.startswith("I;16")
    for image, pixels in (
        (rgb.convert("P"), rgb.convert("P").convert("RGB")),
        (rgb.convert("CMYK"), rgb.convert("CMYK").convert("RGB")),
        (wide, np.repeat(pictures[0][..., :1], 3, axis=-1)),
    ):
        assert predict(path, [image], top_k=3) == predict(path, [np.asarray(pixels)], top_k=3), image.mode
    with pytest.raises(ValueError, match=r"image 1 has no pixels: shape \(0, 0, 3\)"):
        predict(path, [pictures[0], np.zeros((0, 0, 3))])  # was TensorFlow's InvalidArgumentError
    broken = pictures.astype("float32")
    broken[1, 0, :2, 0] = (np.nan, np.inf)  # gave every class probability nan
    with pytest.raises(ValueError, match=r"image 1 has 2 pixel value\(s\) that are NaN or infinite"):
        predict(path, broken)
    for top_k in (0, -1, 1.5):  # -1 listed all classes but the last
        with pytest.raises(ValueError, match=f"top_k must be a whole number of at least 1; got {top_k}"):
            predict(path, pictures, top_k=top_k)
    caplog.set_level(logging.WARNING, logger="keras_vit")
    predict(path, pictures.astype("float32"))
    assert not [r for r in caplog.records if r.name == "keras_vit"]
    predict(path, pictures.astype("float32") / 255)
    assert [r.getMessage() for r in caplog.records if r.name == "keras_vit"] == [
        "keras_vit: image 0 has float pixels in [0, 1]; the model takes pixels in [0, 255]"
    ]


def test_the_run_says_how_the_backend_executes_its_step(monkeypatch):
    import keras

    from keras_vit.training import run

    for backend, expected in (
        ("tensorflow", ("XLA", "graph mode (no XLA)")),
        ("jax", ("XLA", "eager (no jit)")),
        ("torch", ("torch.compile", "eager")),
    ):
        monkeypatch.setattr(keras.backend, "backend", lambda name=backend: name)
        assert (run._execution(True), run._execution(False)) == expected


def test_evaluation_labels_follow_the_models_class_order():
    """A model whose class names list the data's classes in another order (a converted Hugging
    Face model on an image folder) is evaluated with the labels mapped to its own order."""
    import types

    import tensorflow as tf

    from keras_vit.training.run import in_model_order

    data = types.SimpleNamespace(
        class_names=["cat", "dog", "owl"],
        eval=tf.data.Dataset.from_tensor_slices((tf.zeros((3, 2)), tf.constant([0, 1, 2]))),
    )
    assert in_model_order(data, ("cat", "dog", "owl"), "folder") is data.eval
    assert in_model_order(data, None, "folder") is data.eval
    reordered = in_model_order(data, ("owl", "cat", "dog"), "folder")
    assert [int(y) for _, y in reordered.as_numpy_iterator()] == [1, 2, 0]
    with pytest.raises(
        ValueError, match=r"folder has classes the model does not know: 'owl' \(the model's: 'cat', 'dog', 'emu'\)"
    ):
        in_model_order(data, ["cat", "dog", "emu"], "folder")
    # Test data of some of the model's classes: each image labelled as the model's class of its name
    some = in_model_order(data, ("emu", "owl", "ant", "dog", "cat"), "folder")
    assert [int(y) for _, y in some.as_numpy_iterator()] == [4, 3, 1]
    with pytest.raises(ValueError, match=r"folder has 3 classes; the model has 5 \(and no class names\)"):
        in_model_order(data, None, "folder", num_classes=5)
    # Names compare in Unicode's composed form (a folder copied from macOS holds decomposed ones).
    data.class_names = ["cafe\u0301", "dog", "owl"]
    assert in_model_order(data, ("caf\u00e9", "dog", "owl"), "folder") is data.eval
    assert [int(y) for _, y in in_model_order(data, ("owl", "caf\u00e9", "dog"), "folder")] == [1, 2, 0]


def test_a_class_without_an_image_in_the_evaluation_split_is_named(tmp_path, caplog):
    # A class of one image was trained on and never evaluated, without a word.
    write_image_folder(tmp_path / "data", (("cat", 5), ("dog", 5), ("owl", 1)))
    source = datasets.folder(tmp_path / "data")
    assert source.num_eval == 2
    assert "1 class(es) of " in caplog.text and "have too few images for one in the evaluation split, e.g. owl" in (
        caplog.text
    )


def test_a_named_pipe_in_a_class_folder_is_skipped_as_unreadable(tmp_path, caplog):
    # Its check read it and waited for a writer: `train` hung without a word, deaf to Ctrl-C.
    _write_folder(tmp_path / "data")
    os.mkfifo(tmp_path / "data" / "cat" / "pipe.jpg")
    source = datasets.folder(tmp_path / "data", validation_fraction=0.34)
    assert source.skipped == 3 and "skipped 3 unreadable image(s)" in caplog.text  # the pipe and _write_folder's 2


def test_too_few_training_examples_for_the_batch_names_the_held_out_shares():
    # It said "the global batch 4 is larger than the 0 training examples" and no more.
    from keras_vit.training import recipes

    config = TrainConfig(validation_fraction=0.99, selection_fraction=0.5)
    with pytest.raises(ValueError, match=r"larger than the 0 training examples \(the data less 0.99 held out for "):
        recipes.schedule(config, 0, 4)
    with pytest.raises(ValueError, match=r"the 3 training examples; lower the batch size\.$"):
        recipes.schedule(TrainConfig(dataset="tfds:cifar10"), 3, 4)


def test_evaluate_takes_a_test_folder_of_one_of_the_models_classes(tmp_path):
    # "a classifier needs at least 2" refused it: that holds for training only.
    import keras_vit

    model = keras_vit.ViT(keras_vit.ViTConfig(**SMALL_MODEL, num_classes=3), class_names=["cat", "dog", "owl"])
    model.save(tmp_path / "m.keras")
    (tmp_path / "dogs" / "dog").mkdir(parents=True)
    for i in range(3):
        Image.fromarray(np.full((16, 16, 3), 40 * i, np.uint8)).save(tmp_path / "dogs" / "dog" / f"{i}.png")
    result = evaluate(tmp_path / "m.keras", dataset=str(tmp_path / "dogs"), split="all", verbose=0)
    assert result["num_examples"] == 3 and result["top5"] == 1.0


def test_evaluate_says_when_a_runs_model_meets_other_data_split_by_default(tmp_path, capsys):
    # The note was printed for a bare model file only: a run's model on another folder was scored
    # on 20% of it without a word.
    import keras_vit
    from keras_vit.training.run import _store_config

    model = keras_vit.ViT(keras_vit.ViTConfig(**SMALL_MODEL, num_classes=2), class_names=["cat", "dog"])
    _write_folder(tmp_path / "data")
    shutil.copytree(tmp_path / "data", tmp_path / "other")
    _store_config(TrainConfig(dataset=str(tmp_path / "data"), run_dir=str(tmp_path / "run")).resolved())
    model.save(tmp_path / "run" / "best.keras")
    (tmp_path / "run" / "eval.json").write_text("{}")  # a finished run
    for source in (tmp_path / "run", tmp_path / "run" / "best.keras"):
        assert main(["evaluate", str(source), "--dataset", str(tmp_path / "other")]) == 0
        err = capsys.readouterr().err
        assert f"note: {source} was trained on {tmp_path / 'data'}: this is the held-out share of " in err
        assert main(["evaluate", str(source), "--dataset", str(tmp_path / "data")]) == 0  # its own: its split
        assert "held-out share" not in capsys.readouterr().err


def test_paths_in_a_config_file_expand_the_home_directory(tmp_path):
    (tmp_path / "run.yaml").write_text("run_dir: ~/runs/x\ndataset: ~/flowers\nweights: ~/vit.npz\n")
    c = TrainConfig.from_yaml(tmp_path / "run.yaml")
    home = os.path.expanduser("~")
    assert (c.run_dir, c.dataset, c.weights) == (f"{home}/runs/x", f"{home}/flowers", f"{home}/vit.npz")
    assert TrainConfig().resolved().dataset == "digits" and TrainConfig(dataset="tfds:mnist").dataset == "tfds:mnist"


def test_big_photos_in_a_folder_are_decoded_as_read_not_buffered(tmp_path):
    """A folder's file names are shuffled, then each image decoded as the pipeline reads it: 60
    photos of 6 megapixels (1.0 GB decoded) feed batches while the process grows by far less
    than they would take held in a shuffle buffer (a 256-image buffer of 12-megapixel photos
    took 9 GB)."""
    rng = np.random.default_rng(0)
    base = np.kron(rng.integers(0, 256, (30, 20, 3), dtype=np.uint8), np.ones((100, 100, 1), np.uint8))
    for i in range(60):
        folder = tmp_path / "photos" / f"class{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.roll(base, i, axis=0)).save(folder / f"{i}.jpg", quality=80)
    script = f"""
import os, resource
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])  # as many images in flight on any machine
from keras_vit.training import TrainConfig, datasets, pipeline
config = TrainConfig(dataset={str(tmp_path / "photos")!r}, batch_size=4).resolved()
source = datasets.load(config)
ds = pipeline.train_pipeline(source, config, (32, 32), 2, 4)
batches = iter(ds)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for _ in range(12):
    next(batches)
print("GROWTH_MB", (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024, source.num_train)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    growth, num_train = result.stdout.split("GROWTH_MB")[1].split()
    # 48 training photos of 18 MB decoded: 860 MB if buffered (970 MB growth seen), a few in
    # flight otherwise (160 MB seen on 2 cores).
    assert int(num_train) == 48 and float(growth) < 450, result.stdout


def test_folder_images_decode_as_pillow_decodes_them(tmp_path):
    """Training reads JPEGs (RGB, CMYK, gray) and WebP pixel for pixel as predict, visualize and
    inspect (Pillow) read them; TensorFlow's default fast IDCT was up to 8 levels off."""
    import tensorflow as tf

    pixels = np.random.default_rng(0).integers(0, 256, (37, 45, 3)).astype(np.uint8)
    for name, mode in (("rgb.jpg", "RGB"), ("cmyk.jpg", "CMYK"), ("gray.jpg", "L"), ("lossy.webp", "RGB")):
        Image.fromarray(pixels).convert(mode).save(tmp_path / name, quality=90)
        expected = np.asarray(Image.open(tmp_path / name).convert("RGB"))
        np.testing.assert_array_equal(datasets._decode_file(tf.constant(str(tmp_path / name))).numpy(), expected)
    # WebP files are read from class folders too
    for label in ("a", "b"):
        (tmp_path / "data" / label).mkdir(parents=True)
        (tmp_path / "data" / label / "x.webp").write_bytes((tmp_path / "lossy.webp").read_bytes())
    assert [name for name, _, _ in datasets._list_images(tmp_path / "data", ["a", "b"])[0]] == ["a/x.webp", "b/x.webp"]


def test_folder_names_and_links_that_tensorflow_or_labels_txt_cannot_take(tmp_path, caplog):
    """A file name that is not UTF-8 trains (TensorFlow gets the bytes the file system holds); a
    link to nothing is skipped as unreadable; hidden files and folders are left out; a class
    name with a line break or that is not UTF-8 (it becomes a line of labels.txt) is refused up
    front. The first two stopped training before, the class names made its run unusable."""
    data = tmp_path / "data"
    pixels = np.random.default_rng(0).integers(0, 256, (8, 8, 3)).astype(np.uint8)
    for label in ("a", "b"):
        (data / label).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(pixels).save(data / label / f"{i}.png")
    os.rename(data / "a" / "0.png", os.fsencode(data / "a") + b"/x\xfey.png")
    (data / "b" / "broken.png").symlink_to(tmp_path / "nowhere.png")
    (data / "a" / ".thumbnails").mkdir()  # hidden, as hidden class folders: not images of the class
    Image.fromarray(pixels).save(data / "a" / ".thumbnails" / "0.png")
    (data / "a" / "._1.png").write_bytes(b"\0\5\26\7")  # macOS's metadata beside 1.png: not counted as unreadable
    for name in ("scan.TIF", "photo.jfif", "cut.heic"):  # left out without a word before
        (data / "b" / name).write_bytes(b"\0")
    with caplog.at_level("WARNING", logger="keras_vit"):
        source = datasets.folder(data)
    assert source.num_train + source.num_eval == 6 and source.skipped == 1
    assert "skipped 1 unreadable image(s)" in caplog.text and "broken.png" in caplog.text
    assert f"left out 3 image file(s) in {data} in formats keras-vit does not read (.heic, .jfif, .tif)" in caplog.text
    images = [image for image, _ in source.eval.concatenate(source.records.map(lambda f, y: (source.decode(f), y)))]
    assert len(images) == 6 and all(np.array_equal(image.numpy(), pixels) for image in images)
    for name in ("two\nlines", os.fsdecode(b"not\xffutf8")):
        (data / name).mkdir()
        Image.fromarray(pixels).save(data / name / "0.png")
        with pytest.raises(ValueError, match=r"rename the class folder .*; a class name is one line of UTF-8 text"):
            datasets.folder(data)
        shutil.rmtree(data / name)


def test_a_folder_changed_since_the_run_split_it_is_refused_not_split_again(tmp_path):
    """Images added to a run's folder would move some of its training images into the held-out
    share that `evaluate` and an export's checks read (the split is drawn over the files as
    listed), and a resumed run would train on held-out ones: the run records the folder's
    fingerprint and each refuses a folder that no longer has it."""
    from keras_vit import saving
    from keras_vit.training import export_samples, held_out_images

    _write_folder(tmp_path / "data")
    run_dir = tmp_path / "run"
    config = TrainConfig(
        dataset=str(tmp_path / "data"), run_dir=str(run_dir), model=SMALL_MODEL, epochs=1, batch_size=4
    )
    own = fit(config, verbose=0)
    recorded = yaml.safe_load((run_dir / "config.yaml").read_text())["data_fingerprint"]
    assert re.fullmatch(r"12 images, sha256 [0-9a-f]{16}", recorded)
    model = saving.load_model(run_dir)
    record = export_samples(model, run_dir)["data_split"]
    assert record["data_fingerprint"] == recorded  # what an export records, and checks on evaluation
    Image.fromarray(np.zeros((20, 24, 3), np.uint8)).save(tmp_path / "data" / "cat" / "new.png")
    refused = r"data has changed since the run split it \(12 images then, 13 images now\), so which images it held out"
    for call in (
        lambda: evaluate(run_dir),
        lambda: evaluate(run_dir / "best.keras", dataset=str(tmp_path / "data")),
        lambda: export_samples(model, run_dir),
        lambda: held_out_images(None, recorded=record),
    ):
        with pytest.raises(ValueError, match=refused):
            call()
    (run_dir / "eval.json").unlink()  # as a run stopped before its end: resuming refuses too
    with pytest.raises(ValueError, match=refused):
        fit(config, verbose=0)
    assert fit(config, overwrite=True, verbose=0)["num_examples"] == 2  # a new run, a new split
    (tmp_path / "data" / "cat" / "new.png").unlink()
    with pytest.raises(ValueError, match=r"\(13 images then, 12 images now\)"):
        evaluate(run_dir)
    assert own["num_examples"] == 2


def test_linked_class_folders_and_images_are_followed_once_and_listed_as_predict_lists_them(tmp_path, caplog):
    """A dataset assembled from links: a class folder that is a link, a link to a folder inside a
    class folder and a link to an image are followed (the folder inside had been left out, so its
    images were silently missing), loops are entered once, and a class folder's link to nothing is
    warned of. Training, evaluation (both `datasets.folder`) and `predict` list the same files."""
    from keras_vit_cli.images import image_files

    _write_folder(tmp_path / "real")  # cat and dog: 6 readable images and 1 unreadable file each
    data = tmp_path / "data"
    (data / "dog").mkdir(parents=True)
    (data / "cat").symlink_to(tmp_path / "real" / "cat")
    (data / "dog" / "more").symlink_to(tmp_path / "real" / "dog")
    (data / "dog" / "extra.png").symlink_to(tmp_path / "real" / "cat" / "0.png")
    (data / "dog" / "self").symlink_to(data / "dog")  # loops
    (data / "dog" / "more" / "up").symlink_to(data)
    (data / "gone").symlink_to(tmp_path / "moved_away")
    with caplog.at_level("WARNING", logger="keras_vit"):
        source = datasets.folder(data, validation_fraction=0.34)
    assert source.class_names == ["cat", "dog"] and source.skipped == 2
    assert source.num_train + source.num_eval == 6 + 7 and source.fingerprint.startswith("13 images, ")
    assert re.search(rf"skipped 1 link\(s\) to nothing in {re.escape(str(data))} .*gone", caplog.text)
    listed, _ = datasets._list_images(data, source.class_names)
    assert sorted(label for _, label, _ in listed) == [0] * 7 + [1] * 8
    assert sorted(str(path.relative_to(data)) for path, _ in image_files([data])) == [name for name, _, _ in listed]


def test_a_recorded_fingerprint_is_compared_whole_and_only_a_well_formed_one_is_read_for_its_count(tmp_path):
    """The count in the refusal of a changed folder is the images listed now, and of the
    fingerprint the run recorded only when it is one `folder` made: a hand-edited one is named
    as other images (its text had been cut at its first comma and shown as a count)."""
    _write_folder(tmp_path / "data")
    recorded = datasets.folder(tmp_path / "data").fingerprint
    assert datasets.folder(tmp_path / "data", fingerprint=recorded).fingerprint == recorded
    for fingerprint, then in ((recorded.replace("12 ", "11 ", 1), "11 images"), ("edited, by hand", "other images")):
        with pytest.raises(ValueError, match=rf"changed since the run split it \({then} then, 12 images now\)"):
            datasets.folder(tmp_path / "data", fingerprint=fingerprint)
