"""`fit`, `evaluate` and `predict`: the training application's Python API."""

import dataclasses
import json
import logging
import os
import shutil
import sys
from pathlib import Path

import keras
import numpy as np
import yaml

import keras_vit
from keras_vit import names, progress, saving
from keras_vit.checkpoints import known
from keras_vit.training import datasets, multi_worker, pipeline, probe, recipes, remat
from keras_vit.training.callbacks import AtomicCheckpoint, ResumeState, StopAfterEpoch, StopOnInterrupt, StopOnNaN
from keras_vit.training.config import SPLIT_FIELDS, TrainConfig
from keras_vit.training.strategy import agree, batch_multiple, make_placement, process_count, this_process_only
from keras_vit.transform import ImageTransform, pillow_pixels, to_channels

# What a dataset is, for the messages that ask for one (the `dataset` argument, `--dataset`).
DATASET_KINDS = "'digits', 'tfds:NAME' or an image folder"

logger = logging.getLogger("keras_vit")
CONFIG_FILE, LABELS_FILE, EVAL_FILE = names.RUN_CONFIG, names.RUN_LABELS, names.RUN_EVAL


class TrainingError(RuntimeError):
    """A run that stopped without a usable result (e.g. a NaN loss)."""


def fit(config, overwrite=False, verbose=None):
    """Trains as `config` (a `TrainConfig`) says; returns the evaluation dict of `eval.json`.

    The run directory gets `config.yaml` (resolved), `labels.txt`, `best.keras`/`last.keras`,
    `log.csv`, `tensorboard/`, `backup/` (resume state) and `eval.json`. Started again with
    the same config, an interrupted run resumes at the step its resume state was saved after, and a
    finished one (its `eval.json` written, no resume state left) is not trained again: its
    `eval.json` is returned. `overwrite` empties the directory first and trains from scratch.
    `verbose`: Keras's progress verbosity (default: a live bar on a terminal, a line per epoch
    when stdout is a file or a pipe).
    """
    c = config.resolved()
    verbose = progress.verbosity() if verbose is None else verbose
    if c.eval_split == names.WHOLE_SPLIT:
        raise ValueError(
            f"evaluation split {names.WHOLE_SPLIT!r} is every example, the training ones included: it is for "
            "`evaluate` on data training never saw."
        )
    if keras.backend.backend() == "torch" and (c.steps_per_execution or 1) > 1:
        raise ValueError(
            f"{c.steps_per_execution} steps per execution need the TensorFlow or JAX backend; PyTorch trains one "
            "step per call."
        )
    if c.remat:
        remat.check_backend()
    refusal = names.scratch_refusal(c.dataset, c.weights, c.preset, c.model)
    if refusal:
        raise ValueError(refusal + ".")
    # A bad preset, model field or checkpoint fails before the run directory is touched.
    # A run resumed (or finished) takes its architecture from its own checkpoint, and its weights
    # from its resume state: the checkpoint it started from may have moved or gone since.
    own = None if overwrite else _own_checkpoint(c)
    model_config = _model_config(c, num_classes=2, source=own)
    run_dir = _prepare_run_dir(c, overwrite)
    placement = make_placement(c)  # first: multi-worker collectives must be set up before any op
    # Several JAX processes: process 0's view of the directory decides for all.
    if agree(names.run_finished(run_dir)):
        logger.info("keras_vit: %s is finished; its %s follows (--overwrite trains it again)", run_dir, EVAL_FILE)
        return json.loads((run_dir / EVAL_FILE).read_text()) if placement.is_chief else None
    keras.utils.set_random_seed(c.seed)
    chief = placement.is_chief
    # Other workers and processes keep only their own resume state, in worker_N/backup.
    backup_dir = run_dir / names.RUN_BACKUP if chief else run_dir / f"worker_{placement.task_index}" / names.RUN_BACKUP
    global_batch = _resumed_global_batch(c, placement.replicas, backup_dir)
    # The folder as this run split it when it started (a run resumed on a changed folder is refused);
    # training records the fingerprint, whatever a config file copied from another run says.
    c = dataclasses.replace(c, data_fingerprint=_stored_fingerprint(run_dir, overwrite))
    source = datasets.load(c)
    if len(source.class_names) < 2:  # a test folder of one class is fine for `evaluate`
        raise ValueError(f"{c.dataset} has one class ({source.class_names[0]}); a classifier needs at least 2.")
    c = dataclasses.replace(c, data_fingerprint=source.fingerprint)
    with placement.scope():
        resuming = ResumeState.saved_epochs(backup_dir) is not None
        # A probe's resume state holds its head only: the backbone comes from the weights again.
        model = _build_model(c, model_config, source.class_names, load_weights=c.freeze_backbone or not resuming)
        trained = model  # what `fit` trains: the model, or for a linear probe its head on cached features
        if c.freeze_backbone:
            source, trained = probe.features_and_head(model, source, global_batch, batch_multiple(global_batch))
    steps_per_epoch, epochs = recipes.schedule(c, source.num_train, global_batch)
    # The small digits model and a probe's head on one device run fastest under XLA, many steps
    # per call (Keras's multi-step loop fails under tf.distribute's Mirrored strategies; under
    # PyTorch it takes one step per call and jit_compile means torch.compile).
    small = (c.is_digits or c.freeze_backbone) and placement.replicas == 1 and placement.supports_jit
    small = small and keras.backend.backend() != "torch"
    jit_compile = (placement.prefers_jit or small) if c.jit_compile is None else c.jit_compile
    resumed_step = ResumeState.saved_step(backup_dir) or 0
    # An epoch with fewer steps now than the state's (a folder lost images) counts as done.
    resumed_step = resumed_step if resumed_step < steps_per_epoch else 0
    steps_per_call = recipes.steps_per_call(c.steps_per_execution, steps_per_epoch, small, resumed_step)
    with placement.scope():
        trained.compile(
            optimizer=recipes.build_optimizer(
                c, steps_per_epoch, global_batch, epochs, trained.trainable_variables, model.config.num_layers
            ),
            loss=keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=c.label_smoothing),
            weighted_metrics=_metrics(len(source.class_names)),  # weighted: padding examples do not count
            jit_compile=jit_compile and placement.supports_jit,
            steps_per_execution=steps_per_call,
        )
        # Optimizer slots created now, not inside the first traced step: that step is then
        # traced once instead of twice (ViT-Ti/16 on 2 CPU cores: first step 18 s -> 9 s).
        trained.optimizer.build(trained.trainable_variables)
    if c.strategy == "multi_worker":
        multi_worker.apply(trained)
    # A probe's examples are feature vectors: no image size, no transform.
    size = None if c.freeze_backbone else model.config.image_size
    num_classes = len(source.class_names)
    # The epoch kept as best.keras is chosen on the selection split, never on the evaluation
    # split that eval.json reports.
    selection = None
    if source.select is not None:
        selection = pipeline.eval_pipeline(
            source.select,
            (lambda vectors: vectors) if c.freeze_backbone else model.image_transform,
            num_classes,
            global_batch,
            source.num_select,
            batch_multiple(global_batch),
            channels=model.config.channels,
        )
    nan, interrupt = StopOnNaN(), StopOnInterrupt()  # interrupt.saver: the ResumeState below
    # The workers of a TF multi-worker job keep their own resume states by their own clocks: an
    # interval could let them save after different epochs and resume out of step (weights that
    # differ, one worker an epoch ahead), so they save after every epoch. Several JAX processes
    # agree at epochs' ends; one process also saves within epochs.
    multi_worker_job = c.strategy == "multi_worker"
    resume = ResumeState(
        backup_dir,
        0 if multi_worker_job else c.checkpoint_interval,
        global_batch,
        within_epochs=not multi_worker_job and process_count() == 1,
        stopping=lambda: interrupt.pending,
    )
    interrupt.saver = resume
    callbacks = [
        resume,
        nan,
        # With ema: the averaged weights are evaluated and saved (ResumeState, before it, keeps
        # the raw weights and the average in the optimizer's state).
        *([keras.callbacks.SwapEMAWeights(swap_on_epoch=True)] if c.ema else []),
    ]
    if chief:
        callbacks += [
            AtomicCheckpoint(run_dir, None if selection is None else "val_accuracy", c.checkpoint_interval, model),
            keras.callbacks.CSVLogger(str(run_dir / "log.csv"), append=True),
            keras.callbacks.TensorBoard(str(run_dir / "tensorboard")),
        ]
    if jit_compile and not placement.supports_jit:
        logger.warning("keras_vit: XLA (jit_compile) is off for %s", placement.description)
    logger.info(
        "keras_vit: training on %s, global batch %s, %s; %s, peak learning rate %.3g, %d epoch%s of %d step%s",
        placement.description,
        global_batch if c.accumulate == 1 else f"{global_batch * c.accumulate} ({c.accumulate} x {global_batch})",
        _execution(trained.jit_compile) + (", blocks rematerialised" if c.remat else ""),
        ("AdamW" if c.recipe in recipes.ADAMW_RECIPES else "SGD") + _rates(c),
        recipes.peak_learning_rate(c, global_batch),
        epochs,
        "" if epochs == 1 else "s",
        steps_per_epoch,
        ("" if steps_per_epoch == 1 else "s") + _updates(steps_per_epoch, c.accumulate),
    )
    _store_config(c)
    if chief:
        (run_dir / LABELS_FILE).write_text("\n".join(source.class_names) + "\n")
    resume.set_model(trained)
    with placement.scope():
        epoch, step = resume.restore()
    if step >= steps_per_epoch:
        epoch, step = epoch + 1, 0
    if epoch >= epochs:
        logger.info("keras_vit: all %d epochs are trained (the resume state in %s)", epoch, backup_dir)

    def train_epochs(first_epoch, first_step, *more):
        resume.first_step = nan.first_step = first_step
        start = first_epoch * steps_per_epoch + first_step

        def batches(context=None):
            return pipeline.train_pipeline(
                source, c, size, num_classes, global_batch, start, context, model.config.channels
            )

        # The workers of a multi-worker job each decode only their own examples; given one
        # dataset, tf.distribute would run the whole pipeline on every worker and keep a part.
        data = placement.strategy.distribute_datasets_from_function(batches) if multi_worker_job else batches()
        # shuffle=False: the pipeline shuffles itself (Keras warns that it ignores shuffle=True).
        trained.fit(
            data,
            epochs=epochs,
            initial_epoch=first_epoch,
            steps_per_epoch=steps_per_epoch - first_step,
            validation_data=selection,
            shuffle=False,
            callbacks=[*callbacks, *more, interrupt],
            verbose=verbose if chief else 0,  # one progress bar per job
        )

    with interrupt:
        if step and epoch < epochs:  # the rest of the epoch the state was saved in, alone
            train_epochs(epoch, step, StopAfterEpoch())
            epoch += 1
        if epoch < epochs and not nan.reason:
            train_epochs(epoch, 0)
    if nan.reason:
        best = run_dir / names.RUN_CHECKPOINTS[0]
        kept = f"kept the last good checkpoint: {best}" if best.exists() else "no epoch finished well, so no checkpoint"
        shutil.rmtree(backup_dir, ignore_errors=True)  # the same command starts afresh, as before the NaN
        raise TrainingError(f"stopped: {nan.reason}; {kept}")
    if not chief:  # its worker_N folder holds nothing else
        shutil.rmtree(backup_dir.parent, ignore_errors=True)
        return None
    with this_process_only():  # several JAX processes: the chief evaluates best.keras alone
        result = evaluate(run_dir, verbose=verbose)
        _write_eval(run_dir, result)
    shutil.rmtree(backup_dir, ignore_errors=True)  # eval.json is written: the run is finished
    return result


def evaluate(source, dataset=None, split=None, verbose=None):
    """Evaluates a model on the evaluation split of its data; returns the `eval.json` dict.

    `source`: a run directory (its `best.keras`, on the run's own evaluation split, never used
    in training; a finished run's `eval.json` is written again, an unfinished run's left to it),
    or a `.keras` file or checkpoint with `dataset` ("digits", "tfds:NAME" or a folder; its
    evaluation split as the run the file comes from made it when that run trained on it, else
    as `train` makes it with the default options, seed 0 included). `split`: another
    evaluation split, a tfds split expression or "all" (`names.WHOLE_SPLIT`, with `dataset`:
    every example, for data training never saw). `selected_on`: how many held-out training
    examples chose the checkpoint's epoch; `verbose` as `fit`'s."""
    c = evaluation_config(source, dataset, split)
    verbose = progress.verbosity() if verbose is None else verbose
    model = saving.load_model(source)
    data_source = datasets.load(c)
    multiple = batch_multiple(c.batch_size)
    data = pipeline.eval_pipeline(
        in_model_order(data_source, model.class_names, c.dataset, model.config.num_classes),
        model.image_transform,
        model.config.num_classes,
        c.batch_size,
        data_source.num_eval,
        multiple,
        channels=model.config.channels,
    )
    model.compile(
        # Padding examples (weight 0, see eval_pipeline) count in no metric; the loss averages
        # batches by size, so a padded last batch weighs a little more (reported loss: ~1e-3).
        loss=keras.losses.CategoricalCrossentropy(from_logits=True, reduction="mean_with_sample_weight"),
        weighted_metrics=_metrics(model.config.num_classes),
    )
    with StopOnInterrupt() as interrupt:
        values = model.evaluate(data, verbose=verbose, return_dict=True, callbacks=[interrupt])
    checkpoint = saving.run_checkpoint(source).name if saving.is_run_dir(source) else str(source)
    result = {
        "top1": float(values["accuracy"]),
        "top5": float(values["top5"]),
        "loss": float(values["loss"]),
        "num_examples": int(data_source.num_eval),
        "checkpoint": checkpoint,
        "selected_on": int(data_source.num_select),
    }
    if saving.is_run_dir(source) and not dataset and not split and names.run_finished(Path(source)):
        _write_eval(source, result)  # an unfinished run's eval.json is its own to write, once trained
    return result


def _write_eval(run_dir, result):
    (Path(run_dir) / EVAL_FILE).write_text(json.dumps(result, indent=2) + "\n")


def evaluation_config(source, dataset=None, split=None):
    """The `TrainConfig` whose evaluation split `evaluate` reads (see there)."""
    run = training_run(source)
    if not dataset and run is None:
        if not Path(source).exists():
            raise FileNotFoundError(
                f"{source} does not exist: give a run directory, or a model and the dataset to evaluate it on "
                f"({DATASET_KINDS})."
            )
        raise ValueError(f"{source} is not a run directory: say which dataset to evaluate on ({DATASET_KINDS}).")
    return data_config(dataset, split, run)


def training_run(source):
    """The run directory `source` comes from: itself when it is one, the folder of a checkpoint
    inside one (its `best.keras`, `last.keras`), else None."""
    if source is None:
        return None
    path = Path(source)
    if saving.is_run_dir(path) and (path / CONFIG_FILE).is_file():
        return path
    if path.name in names.RUN_CHECKPOINTS and (path.parent / CONFIG_FILE).is_file():
        return path.parent
    return None


def data_config(dataset=None, split=None, run=None, recorded=None):
    """The resolved `TrainConfig` whose splits make `dataset`'s evaluation split ("digits", "tfds:NAME" or a
    folder; None: the model's own), `split` replacing it. When the model's training data is known
    and is that data, it is split as in training, so the seed and held-out shares pick the images
    training never saw: from `run` (a run directory) or `recorded` (the `TrainConfig.data_split`
    an exported model records). Otherwise `train`'s defaults (seed 0)."""
    if run is not None:
        own = load_run_config(run, data=not dataset)
    elif recorded is not None:
        own = TrainConfig.from_dict({name: recorded[name] for name in SPLIT_FIELDS if name in recorded})
        if not dataset and not _readable(own.dataset):
            raise ValueError(
                f"the model was trained on the folder {own.dataset}, which is not there from here; "
                "give the folder's new place as the dataset."
            )
    else:
        own = None
    if own is not None and (not dataset or same_data(dataset, own.dataset)):
        if split == names.WHOLE_SPLIT:
            raise ValueError(
                f"split {names.WHOLE_SPLIT!r} of the model's own training data would count its training images; give "
                "a dataset training never saw."
            )
        c = dataclasses.replace(own, dataset=dataset or own.dataset)
    elif dataset:
        c = TrainConfig(dataset=dataset)
    else:
        raise ValueError(f"the model's training data is not known: say which dataset to evaluate on ({DATASET_KINDS}).")
    return (dataclasses.replace(c, eval_split=split) if split else c).resolved()


def _readable(dataset):
    """Whether a dataset name can be read from here: a name, or a folder that is there."""
    return dataset == "digits" or dataset.startswith("tfds:") or Path(dataset).is_dir()


def same_data(dataset, other):
    """Whether two dataset names are the same data (folders: the same place)."""
    if dataset == other:
        return True
    if any(d == "digits" or d.startswith("tfds:") for d in (dataset, other)):  # names, not places
        return False
    return Path(dataset).resolve() == Path(other).resolve()


def model_classes(data_names, class_names, dataset, num_classes=None):
    """The model's class index of each of the data's classes, matched by name, or None where
    they are the same (`class_names` None: the data's order, as many classes as the model's
    `num_classes`). A model with class names (a converted Hugging Face one, an exported file)
    may list the data's classes in another order, and test data may hold some of them only; a
    class the model does not know is an error."""
    data = list(data_names)
    if class_names is None:
        if num_classes is not None and len(data) != num_classes:
            raise ValueError(f"{dataset} has {len(data)} classes; the model has {num_classes} (and no class names).")
        return None
    if list(class_names) == data:
        return None
    known = [names.class_key(n) for n in class_names]
    unknown = [n for n in data if names.class_key(n) not in known]
    if unknown:
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise ValueError(
            f"{dataset} has classes the model does not know: {', '.join(map(repr, unknown[:5]))}{more} "
            f"(the model's: {', '.join(map(repr, class_names[:5]))}{', ...' if len(class_names) > 5 else ''})."
        )
    order = [known.index(names.class_key(n)) for n in data]
    return None if order == list(range(len(class_names))) else order


def in_model_order(data_source, class_names, dataset, num_classes=None):
    """The evaluation split with labels as the model's classes (`model_classes`)."""
    import tensorflow as tf

    order = model_classes(data_source.class_names, class_names, dataset, num_classes)
    if order is None:
        return data_source.eval
    order = tf.constant(order, tf.int64)
    return data_source.eval.map(lambda image, label: (image, tf.gather(order, tf.cast(label, tf.int64))))


def predict(source, images, top_k=5, labels=None, crop=None):
    """Top-k `(label, probability)` lists for `images` (uint8/float `(N, H, W, 3)` pixels in
    [0, 255], or any iterable of `(H, W, 3)` images of any size; grayscale `(H, W)` or
    `(H, W, 1)` ones are read as RGB), in order. Float pixels in [0, 1] are classified as they
    are, with a warning.

    `source`: a run directory, a `.keras` file or a checkpoint; `labels`: a file or list of
    class names (default: the run's `labels.txt`, else the model's `class_names`, else class
    indices); `crop`: the centre-crop fraction before resizing (default: the model's own,
    `model.image_transform`)."""
    return list(iter_predict(source, images, top_k, labels, crop))


# `iter_predict` resizes and classifies this many images at a time.
PREDICT_CHUNK = 256


def iter_predict(source, images, top_k=5, labels=None, crop=None):
    """`predict` as a generator: each image's top-k list as soon as its chunk of
    `PREDICT_CHUNK` images is classified. An iterable that reads its images as it goes (as
    `keras-vit predict` passes) is then held at most one chunk at a time, resized."""
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1:
        raise ValueError(f"top_k must be a whole number of at least 1; got {top_k!r}.")
    model = saving.load_model(source)
    if not model.config.num_classes:  # its features would be ranked as classes
        raise ValueError(f"{source} has no classification head (0 classes): it gives image features, not classes.")
    names = saving.label_names(source, model, labels)
    transform = model.image_transform
    if crop is not None:
        transform = ImageTransform(model.config.image_size, crop, model.config.interpolation)
    if getattr(images, "ndim", None) == 3 and images.shape[-1] in (1, 3, 4):
        raise ValueError(
            f"images of shape {tuple(images.shape)} read as one image, not a batch; pass a batch "
            "(images[None]) or a list of images ([image])."
        )
    chunk, scaled = [], False
    for index, image in enumerate(images):
        image = _pixels(image, index)
        if not scaled and np.issubdtype(image.dtype, np.floating) and 0 < image.max(initial=0) <= 1:
            scaled = True
            logger.warning("keras_vit: image %d has float pixels in [0, 1]; the model takes pixels in [0, 255]", index)
        image = to_channels(image, model.config.channels)
        chunk.append(keras.ops.convert_to_numpy(transform(image)))
        if len(chunk) == PREDICT_CHUNK:
            yield from _top_k(model, np.stack(chunk), names, top_k)
            chunk = []
    if chunk:
        yield from _top_k(model, np.stack(chunk), names, top_k)


def _pixels(image, index):
    """`image` as a NumPy array of pixels `(H, W)` or `(H, W, C)` (a Pillow image: its RGB pixels,
    as training reads its file); a ValueError naming the image otherwise (a file name: `predict`
    takes pixels, `keras-vit predict` reads files; NaN or infinite values)."""
    pillow = sys.modules.get("PIL.Image")
    if pillow is not None and isinstance(image, pillow.Image):  # its mode says how to read it
        return pillow_pixels(image)
    if isinstance(image, (str, bytes, os.PathLike)):
        raise ValueError(
            f"image {index} is a file name ({image}), not pixels: open it first (PIL.Image.open(path)), or use "
            "`keras-vit predict`, which reads files."
        )
    pixels = np.asarray(image)
    if pixels.ndim not in (2, 3) or not (np.issubdtype(pixels.dtype, np.number) or pixels.dtype == bool):
        raise ValueError(
            f"image {index} is not an image's pixels (H, W) or (H, W, channels): got {pixels.dtype} of shape "
            f"{pixels.shape}."
        )
    if not pixels.size:
        raise ValueError(f"image {index} has no pixels: shape {pixels.shape}.")
    if np.issubdtype(pixels.dtype, np.floating) and not np.isfinite(pixels).all():
        bad = int(np.size(pixels) - np.isfinite(pixels).sum())
        raise ValueError(f"image {index} has {bad} pixel value(s) that are NaN or infinite; its logits would be NaN.")
    return pixels


def _metrics(num_classes):
    """Top-1 and top-5 accuracy. With fewer than 5 classes top-5 counts every example (PyTorch's
    `topk` refuses a k above the class count, which stopped such runs on that backend)."""
    return [
        keras.metrics.CategoricalAccuracy(name="accuracy"),
        keras.metrics.TopKCategoricalAccuracy(min(5, num_classes), name="top5"),
    ]


def _top_k(model, batch, names, top_k):
    # Under a data-parallel distribution every batch must divide by its devices: blank images
    # fill the last one, and their predictions are dropped.
    multiple = batch_multiple()
    batch_size = -(-32 // multiple) * multiple
    padded = np.concatenate([batch, np.zeros((-len(batch) % multiple, *batch.shape[1:]), batch.dtype)])
    logits = model.predict(padded, batch_size=batch_size, verbose=0)[: len(batch)]
    probabilities = keras.ops.convert_to_numpy(keras.ops.softmax(logits, axis=-1))
    top = np.argsort(-probabilities, axis=-1)[:, :top_k]
    return [[(names[i], float(p[i])) for i in row] for row, p in zip(top, probabilities)]


def load_run_config(run_dir, data=False):
    """The `TrainConfig` stored in `run_dir`. With `data`, its dataset must be readable here: a
    folder that has moved since training (or a path relative to another working directory) is
    named as the run's, with the fix, instead of as an unknown dataset."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no {CONFIG_FILE}).")
    c = TrainConfig.from_dict(yaml.safe_load(path.read_text()))
    if data and not _readable(c.dataset):
        raise ValueError(
            f"{run_dir} was trained on the folder {c.dataset}, which is not there from here; "
            "give the folder's new place as the dataset."
        )
    return c


def _resumed_global_batch(c, replicas, backup_dir):
    """The global batch of this run: that of its resume state when it has one (on another
    number of devices the per-replica batch changes, not the global batch, the steps per epoch
    or the learning-rate schedule), else `_global_batch`'s."""
    global_batch = _global_batch(c, replicas)
    saved = ResumeState.saved_global_batch(backup_dir)
    if saved is None or saved == global_batch:
        return global_batch
    if c.global_batch_size is None and saved % replicas == 0:
        logger.info(
            "keras_vit: resuming at the run's global batch %d: %d replica%s of %d",
            saved,
            replicas,
            "" if replicas == 1 else "s",
            saved // replicas,
        )
        return saved
    raise ValueError(
        f"{c.run_dir} was trained at a global batch of {saved}, which {replicas} replicas cannot share; "
        "resume it on a number of devices that divides it."
    )


def _global_batch(c, replicas):
    if c.global_batch_size is None:
        return c.batch_size * replicas
    if c.global_batch_size % replicas:
        raise ValueError(
            f"the global batch {c.global_batch_size} is not divisible by the {replicas} replicas; "
            f"use a multiple of {replicas}."
        )
    return c.global_batch_size


def _updates(steps, accumulate):
    """How many optimizer updates `steps` training steps make, in words, when they accumulate."""
    return f" ({steps // accumulate} optimizer updates of {accumulate} accumulated)" if accumulate > 1 else ""


def _rates(c):
    """The learning-rate factors of a run, in words (for its first log line)."""
    parts = [f"layer decay {c.layer_decay:g}"] if c.layer_decay not in (None, 1.0) else []
    parts += [f"head x{c.head_lr_scale:g}"] if c.head_lr_scale != 1.0 else []
    parts += ["linear probe (backbone frozen)"] if c.freeze_backbone else []
    return f" ({', '.join(parts)})" if parts else ""


def _execution(jit_compile):
    """How the backend runs the training step, in words."""
    backend = keras.backend.backend()
    if backend == "torch":
        return "torch.compile" if jit_compile else "eager"
    if jit_compile:
        return "XLA"
    return "graph mode (no XLA)" if backend == "tensorflow" else "eager (no jit)"


def _model_config(c, num_classes, source=None):
    """The run's `ViTConfig`: the preset's, else the architecture of the checkpoint it starts
    from (a `.keras` model or a run's included; `source` when given: the run's own), else
    `ViTConfig`'s; `model` fields over it. Raises ValueError for an unknown preset, a bad model
    field, an unreadable checkpoint or a model the run's `model_parallel` cannot split."""
    source = source or c.weights
    read = None
    if c.preset or not c.weights:
        # A known checkpoint's resolution unless the run sets one, and its image transform.
        base = {k: v for k, v in known.settings(c.weights, c.preset).items() if k == "image_size"}
        read = keras_vit.checkpoints.open_weights(source) if c.weights else None
        base.update((read and read.transform) or {})
    else:
        read = keras_vit.checkpoints.open_checkpoint(source)
        base = read.fields
    # The checkpoint's head and pre-logits give way to a new zero head, as the paper fine-tunes.
    base = {k: v for k, v in base.items() if k not in ("num_classes", "representation_size")}
    overrides = {**c.model, "num_classes": num_classes}
    if c.weights and not c.preset:
        fields = keras_vit.checkpoints.architecture(base, overrides, source)
    else:
        fields = {**base, **overrides}
    config = keras_vit.get_config(c.preset, **fields) if c.preset else keras_vit.ViTConfig(**fields)
    if read is not None:
        keras_vit.checkpoints.warn_assumed_normalization(read, c.weights, config, c.model)
    keras_vit.distribution.check_model_parallel(config, c.model_parallel)
    return config


def _build_model(c, config, class_names, load_weights=True):
    """The run's model: `config` with a head for `class_names` (saved with it), in the run's
    precision, with `c.weights` loaded (unless not `load_weights`: a resume state holds them)."""
    dtype = None if c.precision == "float32" else c.precision
    config = dataclasses.replace(config, num_classes=len(class_names))
    model = keras_vit.ViT(config, dtype=dtype, class_names=class_names)
    if c.weights and load_weights:  # fine-tuning: the head by class names, position embeddings resampled
        keras_vit.load_weights(model, c.weights)
    if c.remat:
        remat.rematerialize_blocks(model)
    return model


def _own_checkpoint(c):
    """The checkpoint of the run in `c.run_dir` when that run is `c`'s (only `EXECUTION_FIELDS`
    differ) and has one, else None."""
    run_dir = Path(c.run_dir)
    if not (run_dir / CONFIG_FILE).is_file() or _run_changes(c, run_dir)[0]:
        return None
    return next((run_dir / name for name in names.RUN_CHECKPOINTS if (run_dir / name).is_file()), None)


def _run_changes(c, run_dir):
    """`(run fields, execution fields, before, after)`: the config fields in which `c` differs from
    the run `run_dir` holds (none when it holds none), those that make it another run and those
    that only change how it executes, with both configs as dicts. A field the stored config lacks
    (a run of a version before the field) counts as its default."""
    stored = run_dir / CONFIG_FILE
    text = _config_text(c)
    stored_text = stored.read_text() if stored.is_file() else text
    before, after = yaml.safe_load(stored_text) or {}, yaml.safe_load(text)
    if stored_text == text:
        return [], [], before, after
    defaults = TrainConfig().to_dict()
    before = {**{k: v for k, v in defaults.items() if k in after and k not in before}, **before}
    changed = [k for k in sorted(set(before) | set(after)) if _differs(k, before.get(k), after.get(k))]
    execution = [k for k in changed if k in EXECUTION_FIELDS]
    return [k for k in changed if k not in execution], execution, before, after


# How a run executes, not what it computes: a run may resume with these changed.
EXECUTION_FIELDS = ("jit_compile", "steps_per_execution", "checkpoint_interval", "run_dir", "remat")


def _prepare_run_dir(c, overwrite):
    """Checks that an existing run directory belongs to this config (only `EXECUTION_FIELDS`
    may differ; `_store_config` then writes the new values), or, with `overwrite`, empties it of
    the run it holds, whatever its config. `_store_config` creates it."""
    run_dir = Path(c.run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"the run directory {run_dir} is a file; choose another --run-dir.")
    stored = run_dir / CONFIG_FILE
    if stored.is_file() and _replaced_by_overwrite(c.weights, run_dir):
        raise ValueError(
            f"the weights {c.weights} are the run in {run_dir} that this command would replace; fine-tune from "
            "them into another run directory."
        )
    run_fields, execution_fields, before, after = _run_changes(c, run_dir)
    if execution_fields and not run_fields:  # the same run
        logger.info("keras_vit: %s holds this run, now with %s", run_dir, _changes(execution_fields, before, after))
    elif run_fields and not overwrite:
        fields = _changes(run_fields, before, after)
        raise ValueError(
            f"{run_dir} holds a run with a different config ({fields}); pass --overwrite to "
            "replace it (its checkpoints and resume state are deleted) or choose another --run-dir."
        )
    if overwrite and stored.is_file():  # a run's folder only; several processes may empty it at once
        for name in _overwritten_files(run_dir):
            if (run_dir / name).is_dir():
                shutil.rmtree(run_dir / name, ignore_errors=True)
            else:
                (run_dir / name).unlink(missing_ok=True)
    return run_dir


def _overwritten_files(run_dir):
    """The names in a run directory that `--overwrite` deletes: its checkpoints, log,
    evaluation, resume state and TensorBoard logs (worker folders too)."""
    return (
        *names.RUN_CHECKPOINTS,
        "log.csv",
        EVAL_FILE,
        names.RUN_BACKUP,
        "tensorboard",
        *(p.name for p in run_dir.glob("worker_*")),
    )


def _replaced_by_overwrite(weights, run_dir):
    """Whether the local checkpoint `weights` is the run in `run_dir` or one of the files that
    replacing that run deletes (a fine-tune of a run into its own directory)."""
    if not weights or not Path(weights).exists():
        return False
    relative = Path(os.path.relpath(Path(weights).resolve(), run_dir.resolve()))
    return relative == Path(".") or relative.parts[0] in _overwritten_files(run_dir)


def saved_position(config):
    """Where the resume state of `config`'s run stands, `(epochs done, steps done of the next
    epoch)` (the same config goes on from there), or None when it has none."""
    backup_dir = Path(config.resolved().run_dir) / names.RUN_BACKUP
    epoch = ResumeState.saved_epochs(backup_dir)
    return None if epoch is None else (epoch, ResumeState.saved_step(backup_dir) or 0)


def _store_config(c):
    """Writes the run's `config.yaml`, creating the directory: once the run is about to train,
    so a command stopped by bad input leaves neither a directory nor a config that would refuse
    the corrected command."""
    Path(c.run_dir).mkdir(parents=True, exist_ok=True)
    (Path(c.run_dir) / CONFIG_FILE).write_text(_config_text(c))


def _stored_fingerprint(run_dir, overwrite):
    """The data fingerprint the run in `run_dir` recorded, unless it is being replaced."""
    stored = run_dir / CONFIG_FILE
    if overwrite or not stored.is_file():
        return None
    return (yaml.safe_load(stored.read_text()) or {}).get("data_fingerprint")


def _differs(field, before, after):
    """Whether a config field changed: a dataset or weights path spelt otherwise (`./data/`
    for `data`) names the same place; the data fingerprint, which training records, is checked
    against the data itself (`datasets.folder`)."""
    if before == after or field == "data_fingerprint":
        return False
    paths = field in ("dataset", "weights") and isinstance(before, str) and isinstance(after, str)
    return not (paths and same_data(before, after))


def _config_text(c):
    return yaml.safe_dump(c.to_dict(), sort_keys=True)


def _changes(fields, before, after, shown=4):
    text = ", ".join(f"{k}: {before.get(k)!r} there, {after.get(k)!r} now" for k in fields[:shown])
    return text + (f" and {len(fields) - shown} more" if len(fields) > shown else "")
