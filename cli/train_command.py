"""`keras-vit train`, `evaluate` and `predict`: the training application on the command line."""

import argparse
import dataclasses
import json
import logging
import os
import sys

from keras_vit_cli import images as image_io
from keras_vit_cli.names import names
from keras_vit_cli.options import add_normalization_option, check_image_size, normalization_overrides
from keras_vit_cli.output import note_unfinished_run, one_line, progress_on_stderr, show_log
from keras_vit_cli.signals import exit_status, interrupted

# flag -> (TrainConfig field, argparse options); defaults stay None so a YAML file can set them.
_FLAGS = {
    "--dataset": ("dataset", dict(help="'digits' (default, offline), 'tfds:NAME' or an image folder")),
    "--run-dir": (
        "run_dir",
        dict(help="where checkpoints, logs and eval.json go (default runs/ and the dataset's name: runs/digits, ...)"),
    ),
    "--train-split": ("train_split", dict(help="tfds split, e.g. 'train[:90%%]' (default: train)")),
    "--eval-split": (
        "eval_split",
        dict(
            help="tfds split for evaluation (default: test, else validation, else train[90%%:], when training "
            "then takes train[:90%%])"
        ),
    ),
    "--validation-fraction": (
        "validation_fraction",
        dict(type=float, help="held out of digits/folders for evaluation (0.2)"),
    ),
    "--selection-fraction": (
        "selection_fraction",
        dict(
            type=float,
            help="share of the training examples held out to choose best.keras by (default 0: "
            "best.keras is the last epoch)",
        ),
    ),
    "--preset": (
        "preset",
        dict(
            help="model preset to train from scratch (default: the digits model; other data needs --weights or a "
            "preset)"
        ),
    ),
    "--image-size": (
        "image_size",
        dict(type=int, nargs="+", metavar="PIXELS", help="H [W] of the input (position embeddings resampled)"),
    ),
    "--weights": (
        "weights",
        dict(
            help="checkpoint to start from: a file, folder, known name (`keras-vit checkpoints`), hf://ORG/NAME"
            "[@REVISION], .keras model or run directory (without --preset: its architecture, and its input "
            "normalisation and crop)"
        ),
    ),
    "--recipe": (
        "recipe",
        dict(
            choices=names.RECIPES,
            help="pretrain: the paper's AdamW; finetune: the paper's SGD; finetune-adamw: AdamW with layer-wise "
            "learning-rate decay 0.65 (BEiT, MAE) (default: finetune with --weights, else pretrain)",
        ),
    ),
    "--freeze-backbone": (
        "freeze_backbone",
        dict(
            action="store_true",
            default=None,
            help="linear probe of --weights: the backbone's features of each image computed once, only the head "
            "trained on them (default recipe: SGD, base learning rate 0.1 at batch 256, 90 epochs, as MAE's probe)",
        ),
    ),
    "--layer-decay": (
        "layer_decay",
        dict(
            type=float,
            help="layer-wise learning-rate decay in (0, 1]: block i of L learns at DECAY^(L-i) of the rate, the "
            "embeddings at DECAY^(L+1) (default: finetune-adamw 0.65, else off; BEiT/MAE use 0.65-0.75)",
        ),
    ),
    "--head-lr-scale": (
        "head_lr_scale",
        dict(type=float, help="the head's learning rate as a multiple of the rate (default 1)"),
    ),
    "--protocol": (
        "protocol",
        dict(
            choices=names.PROTOCOLS,
            help="the paper's fine-tuning protocol for a dataset: its data and splits, steps, SGD at batch 512, "
            "learning rate, clipping and 384-pixel resolution (each overridable; implies --recipe finetune)",
        ),
    ),
    "--epochs": (
        "epochs",
        dict(type=int, help="passes over the training data (default: digits 130, pretrain 300, finetune 10)"),
    ),
    "--steps": ("steps", dict(type=int, help="total optimizer steps, instead of --epochs")),
    "--batch-size": ("batch_size", dict(type=int, help="per replica (global = this x replicas; default 32)")),
    "--global-batch-size": (
        "global_batch_size",
        dict(type=int, help="instead of --batch-size; must divide by replicas"),
    ),
    "--learning-rate": ("learning_rate", dict(type=float, help="for a global batch of --base-batch-size")),
    "--base-batch-size": (
        "base_batch_size",
        dict(
            type=int,
            help="the global batch --learning-rate is given for (default: pretrain 4096, finetune 512); other "
            "batches scale it by the square root of the ratio (pretrain, AdamW) or linearly (finetune, SGD)",
        ),
    ),
    "--weight-decay": (
        "weight_decay",
        dict(
            type=float,
            help="decoupled weight decay, not on biases, norms and embeddings "
            "(default: pretrain 0.1, finetune 0, digits 0.05)",
        ),
    ),
    "--label-smoothing": ("label_smoothing", dict(type=float, help="in [0, 1) (default 0; digits 0.1)")),
    "--randaugment": (
        "randaugment",
        dict(type=float, help="RandAugment: 2 of 14 operations per image at this strength in (0, 1] (off by default)"),
    ),
    "--ema": (
        "ema",
        dict(type=float, help="keep an exponential moving average of the weights with this momentum (e.g. 0.999)"),
    ),
    "--mixup": ("mixup", dict(type=float, help="MixUp Beta alpha (0: off)")),
    "--cutmix": ("cutmix", dict(type=float, help="CutMix Beta alpha (0: off)")),
    "--strategy": (
        "strategy",
        dict(
            choices=names.STRATEGIES,
            help="TensorFlow's tf.distribute strategy (auto: tpu with --tpu or TPU_NAME, mirrored over "
            "several GPUs, else one device); under JAX every local device is used",
        ),
    ),
    "--tpu": ("tpu", dict(help="TPU name or address for --strategy tpu")),
    "--model-parallel": (
        "model_parallel",
        dict(
            type=int,
            help="JAX: split each model over this many devices (mesh devices/N x N, batch x model; "
            "the blocks' kernels Megatron-style)",
        ),
    ),
    "--accumulate": (
        "accumulate",
        dict(
            type=int,
            metavar="N",
            help="average the gradients of N batches into one optimizer step (effective batch: global batch x N; "
            "the learning rate and --steps follow it; default 1)",
        ),
    ),
    "--remat": (
        "remat",
        dict(
            action="store_true",
            default=None,
            help="JAX: recompute each encoder block in the backward pass (less activation memory, more compute)",
        ),
    ),
    "--precision": ("precision", dict(choices=names.PRECISIONS, help="Keras dtype policy (default float32)")),
    "--steps-per-execution": (
        "steps_per_execution",
        dict(
            type=int,
            help="training steps per compiled call; must divide the steps of an epoch (default 1; digits on "
            "one device: the largest divisor up to 16); 1 under PyTorch",
        ),
    ),
    "--checkpoint-interval": (
        "checkpoint_interval",
        dict(
            type=float,
            help="seconds between saves of the resume state, within epochs too, and of last.keras (30; 0: "
            "every epoch). Ctrl-C and SIGTERM save the resume state where they stop (one process; "
            "several save at epochs' ends)",
        ),
    ),
    "--seed": ("seed", dict(type=int, help="seeds the weights, the splits and the augmentation (0)")),
}


def add_parser(subparsers):
    train = subparsers.add_parser(
        "train",
        help="train or fine-tune a ViT with model.fit",
        description="Train a ViT. With no options: a small ViT on scikit-learn's bundled digits (offline). "
        "Options come from --config (YAML of training options) and are overridden by flags. The run "
        "directory gets config.yaml, labels.txt, best.keras, last.keras, log.csv, tensorboard/ and eval.json; "
        "the same command resumes an interrupted run and, for a finished one, prints its evaluation "
        "without training again.",
    )
    train.add_argument("--config", help="YAML file of training options (flags override it)")
    for flag, (_, options) in _FLAGS.items():
        train.add_argument(flag, **options)
    train.add_argument(
        "--jit-compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compile the training step with XLA, under PyTorch with torch.compile (default: on GPUs, TPUs and "
        "under JAX; off on TensorFlow CPU-only machines, where TensorFlow's graph mode is faster, except "
        "mixed_bfloat16 on CPUs without bfloat16 instructions and the small digits model on one device; off "
        "on CPUs under PyTorch)",
    )
    train.add_argument(
        "--overwrite",
        action="store_true",
        help="train from scratch, replacing the run in --run-dir (a finished run, an interrupted one, or "
        "one of another config)",
    )
    add_normalization_option(train)
    processes = train.add_argument_group(
        "several processes (JAX)",
        "Start the same command once per process (one per host, or per accelerator group), each with its "
        "--process-id; they train as one job over all their devices. The same as Keras's "
        "KERAS_DISTRIBUTION_JOB_ADDRESSES, _NUM_PROCESSES and _PROCESS_ID variables.",
    )
    processes.add_argument("--num-processes", type=int, help="processes in the job")
    processes.add_argument("--process-id", type=int, help="this process, 0 to N-1 (0 writes the run directory)")
    processes.add_argument("--job-addresses", help="host:port of process 0 (or every process's, comma-separated)")
    train.set_defaults(run=run_train, check=check_train)

    evaluate = subparsers.add_parser(
        "evaluate",
        help="evaluate a model on held-out data",
        description="Evaluate a run directory's best.keras on the run's evaluation split (never used in "
        "training) and write RUN_DIR/eval.json; or a .keras file, checkpoint or exported model on the "
        "evaluation split of --dataset (as the run split it when MODEL is a run or a checkpoint in one that "
        "trained on that data, else as train does by default): a SavedModel through its bytes signature (as TF "
        "Serving answers), a .tflite file on LiteRT, an .onnx file on ONNX Runtime or an OpenVINO .xml file, with "
        "each image cropped and resized as the file records (files whose export SHA256SUMS disagrees are refused). "
        "Prints the result as JSON.",
    )
    evaluate.add_argument(
        "model", help="run directory, .keras file, checkpoint, SavedModel, .tflite, .onnx or .xml file"
    )
    evaluate.add_argument("--dataset", help="'digits', 'tfds:NAME' or an image folder (default: the run's own)")
    evaluate.add_argument(
        "--split",
        help=f"which examples: a tfds split expression (e.g. 'validation', 'test[:50%%]'; default: test, else "
        f"validation), or '{names.WHOLE_SPLIT}' with --dataset for every image of a folder or digits (default: the "
        "share train holds out) or every split of a tfds dataset; the run's eval.json is kept",
    )
    evaluate.set_defaults(run=run_evaluate)

    predict = subparsers.add_parser(
        "predict",
        help="classify images with a trained model",
        description="Print the top-k labels of each image as it is classified; a folder's images are read "
        "with its sub-folders', in name order (links followed), and unreadable ones among them skipped with a warning "
        "(none readable: an error). MODEL is a "
        "run directory (its best.keras, labels and evaluation transform), a .keras file, a checkpoint, or an "
        "exported SavedModel (answering through its bytes signature, as TF Serving would), .tflite, .onnx or "
        "OpenVINO .xml file.",
    )
    predict.add_argument(
        "model", help="run directory, .keras file, checkpoint, SavedModel, .tflite, .onnx or .xml file"
    )
    predict.add_argument(
        "images",
        nargs="+",
        help="image files (any format Pillow reads), http(s) URLs and folders (their JPEG/PNG/BMP/GIF/WebP files)",
    )
    predict.add_argument("--top-k", type=int, default=5, help="how many classes to print per image (default 5)")
    predict.add_argument(
        "--labels",
        help="file of class names, one per line (default: the run's labels.txt, the model's own names or an "
        "exported file's, else class indices)",
    )
    predict.add_argument(
        "--crop",
        type=float,
        help="centre-crop fraction before resizing (default: the model's own, its config's crop_fraction, "
        f"{names.EVAL_CROP} unless trained otherwise; 1: resize only; for an exported file the fraction it records)",
    )
    predict.add_argument(
        "--json",
        action="store_true",
        help='one JSON object per image: {"image": PATH, "top_k": [{"label": NAME, "probability": P}, ...]}',
    )
    predict.set_defaults(run=run_predict, check=check_predict)


def check_predict(args):
    """Refuses out-of-range --top-k and --crop before Keras and TensorFlow are imported."""
    if args.top_k < 1:
        raise ValueError(f"--top-k must be at least 1; got {args.top_k}.")
    if args.crop is not None and not 0.0 < args.crop <= 1.0:
        raise ValueError(f"--crop must be in (0, 1] (1: resize without cropping); got {args.crop:g}.")


def check_train(args):
    """Refuses, before Keras and TensorFlow are imported, a run that would train ViT-B/16 from
    scratch on a folder or tfds dataset (`names.scratch_refusal`): the dataset, weights, preset
    and model fields of the flags, over those of a readable `--config` file."""
    options = {}
    if args.config:
        import yaml

        try:
            with open(args.config) as file:
                loaded = yaml.safe_load(file)
        except (OSError, yaml.YAMLError):
            return  # `run_train` says what is wrong with the file
        options = loaded if isinstance(loaded, dict) else {}
    given = {name: getattr(args, name) for name in ("dataset", "weights", "preset") if getattr(args, name)}
    options = {**options, **given}
    refusal = names.scratch_refusal(
        options.get("dataset"), options.get("weights"), options.get("preset"), options.get("model")
    )
    if refusal:
        raise ValueError(refusal + ".")


def run_train(args):
    from keras_vit.training import TrainConfig, fit, saved_position

    values = {
        field: getattr(args, flag[2:].replace("-", "_"))
        for flag, (field, _) in _FLAGS.items()
        if field != "image_size" and getattr(args, flag[2:].replace("-", "_")) is not None
    }
    if args.jit_compile is not None:
        values["jit_compile"] = args.jit_compile
    if args.batch_size is not None and args.global_batch_size is not None:
        raise ValueError("--batch-size (per replica) and --global-batch-size are one or the other; give one.")
    if args.image_size is not None:
        if len(args.image_size) > 2:
            raise ValueError("--image-size takes one or two values (height [width]).")
        check_image_size(args.image_size)
    config = TrainConfig.from_yaml(args.config, **values) if args.config else TrainConfig(**values)
    if args.image_size is not None:
        # One number for a square input, as a run's config.yaml has always written it.
        size = args.image_size[0] if len(set(args.image_size)) == 1 else list(args.image_size)
        config = dataclasses.replace(config, model={**config.model, "image_size": size})
    if args.normalization is not None:  # recorded in the run's config.yaml as the model's statistics
        statistics = {k: list(v) if isinstance(v, tuple) else v for k, v in normalization_overrides(args).items()}
        config = dataclasses.replace(config, model={**config.model, **statistics})
    note_unfinished_run("train", config.weights)
    _join_processes(args)
    show_log(logging.INFO)  # where it runs, the global batch, XLA or not
    try:
        with progress_on_stderr():
            result = fit(config, overwrite=args.overwrite)
    except KeyboardInterrupt as stop:
        saved = saved_position(config)
        if saved is None:
            where = "starts it again (nothing was saved yet)"
        elif saved[1]:
            where = f"goes on after step {saved[1]} of epoch {saved[0] + 1}"
        else:
            where = f"goes on after epoch {saved[0]}"
        print(f"keras-vit train: {interrupted(stop)}; the same command {where}", file=sys.stderr)
        return exit_status(stop)
    if result is not None:  # other processes than 0 report nothing
        print(json.dumps(result))


def _json_line(value):
    """`value` as one line of JSON in UTF-8; a file name that is not UTF-8 (Python holds its bytes
    as surrogates, which would go out as they are) comes out escaped, `\\udcff`, as valid JSON."""
    text = json.dumps(value, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value)
    return text


def _join_processes(args):
    """The process flags, handed on as the variables `keras.distribution.initialize` reads."""
    given = {"num_processes": args.num_processes, "process_id": args.process_id, "job_addresses": args.job_addresses}
    if all(value is None for value in given.values()):
        return
    if any(value is None for value in given.values()):
        raise ValueError("--num-processes, --process-id and --job-addresses go together.")
    if args.num_processes < 1 or not 0 <= args.process_id < args.num_processes:
        raise ValueError(
            f"--process-id must be in 0..{args.num_processes - 1} for --num-processes {args.num_processes}."
        )
    from keras_vit.training.strategy import PROCESS_VARIABLES

    for key, value in given.items():
        os.environ[PROCESS_VARIABLES[key]] = str(value)


def run_evaluate(args):
    from keras_vit.export.exported import is_exported, load_exported
    from keras_vit.training import evaluate
    from keras_vit.training.run import load_run_config, same_data, training_run

    trained_on = None  # the data split an exported model records
    with progress_on_stderr():
        if is_exported(args.model):
            model = load_exported(args.model)
            trained_on = model.data_split
            result = _evaluate_exported(args, model)
        else:
            result = evaluate(args.model, args.dataset, args.split)
    run = training_run(args.model)
    trained = trained_on["dataset"] if trained_on else load_run_config(run).dataset if run is not None else None
    guessed = (
        args.dataset
        and not args.split
        and not args.dataset.startswith("tfds:")
        and not (trained and same_data(args.dataset, trained))
    )
    if guessed:
        why = f"was trained on {trained}" if trained else "names no run to take the split from"
        print(
            f"keras-vit evaluate: note: {args.model} {why}: this is the held-out "
            f"share of {args.dataset} as train makes it by default (--seed 0, --validation-fraction 0.2); a model "
            f"trained with other values saw some of these images (--split {names.WHOLE_SPLIT} for data it never saw)",
            file=sys.stderr,
        )
    print(json.dumps(result))


def _evaluate_exported(args, model, chunk=256):
    """`evaluate`'s result for an exported SavedModel or .tflite file (`model`, from
    `load_exported`) on the evaluation split of `--dataset`, else of the data it records, `chunk`
    images at a time."""
    import itertools

    import numpy as np

    from keras_vit.progress import progress_bar
    from keras_vit.training import held_out_images

    if not args.dataset and model.data_split is None:
        raise ValueError(
            f"{args.model} is an exported model that records no training data (exported without its run): say which "
            "data to evaluate on (--dataset)."
        )
    examples, count, data_names = held_out_images(args.dataset, model.labels, args.split, recorded=model.data_split)
    dataset = args.dataset or model.data_split["dataset"]
    progress = progress_bar(count, unit_name="image")
    seen = top1 = top5 = loss = 0
    while batch := list(itertools.islice(examples, chunk)):
        images, labels = [image for image, _ in batch], np.array([label for _, label in batch])
        probabilities = model.probabilities([image_io.png_bytes(i) for i in images] if model.takes_bytes else images)
        if model.labels is None and probabilities.shape[-1] != len(data_names):  # else matched by name
            raise ValueError(
                f"{dataset} has {len(data_names)} classes; the model has {probabilities.shape[-1]} "
                "(and no class names)."
            )
        ranked = np.argsort(-probabilities, axis=-1, kind="stable")[:, :5]
        top1 += np.sum(ranked[:, 0] == labels)
        top5 += np.sum((ranked == labels[:, None]).any(axis=-1))
        # Cross-entropy of the probabilities, clipped as Keras's loss clips them.
        loss -= np.log(np.clip(probabilities[np.arange(len(labels)), labels], 1e-7, 1.0)).sum()
        seen += len(labels)
        progress.add(len(labels))
    if not seen:
        raise ValueError(f"{dataset} has no evaluation examples.")
    scores = {"top1": top1, "top5": top5, "loss": loss}
    result = {**{k: float(v / seen) for k, v in scores.items()}, "num_examples": seen, "checkpoint": str(args.model)}
    # The file scored: of an export folder, the SavedModel version (the newest) load_exported took.
    if model.takes_bytes:
        result["saved_model"] = str(model.path)
        if model.path.name.isdigit():
            result["version"] = int(model.path.name)
    else:  # the file's format: tflite, onnx or openvino
        result[{".xml": "openvino"}.get(model.path.suffix, model.path.suffix[1:])] = str(model.path)
    return result


def run_predict(args):
    from keras_vit.export.exported import is_exported
    from keras_vit_cli import CommandError

    # Each argument's files, all listed (and missing ones refused) before the model is loaded.
    arguments, read = [(given, image_io.image_files([given])) for given in args.images], []
    unreadable = []  # (folder argument, [(file, why)]) of folders none of whose images could be read

    def images(encoded=False):
        # Read as the predictions go, so a long list or a big folder is never held whole. Files sent
        # encoded (to a SavedModel) are decoded here as well, so that an unreadable one is skipped.
        # A folder's unreadable files are warned of once it has given an image; a folder that gives
        # none is an error (after the other arguments' answers), its files named in one line.
        logger = logging.getLogger("keras_vit")
        for given, files in arguments:
            skipped, found = [], False
            for path, in_folder in files:
                try:
                    image = image_io.load_image(path, None)[0]
                except ValueError as error:
                    if not in_folder:
                        raise
                    skipped.append((path, str(error).removeprefix(f"cannot read image {path}: ")))
                    if found:
                        logger.warning("keras_vit: skipped image %s: %s", one_line(path), skipped[-1][1])
                    continue
                if not found:
                    found = True
                    for skipped_path, why in skipped:
                        logger.warning("keras_vit: skipped image %s: %s", one_line(skipped_path), why)
                read.append(path)
                yield image_io.encoded_image(path, image) if encoded else image
            if skipped and not found:
                unreadable.append((given, skipped))

    if is_exported(args.model):
        results = _predict_exported(args, images)
    else:
        from keras_vit.training import iter_predict

        results = iter_predict(args.model, images(), args.top_k, labels=args.labels, crop=args.crop)
    for i, top in enumerate(results):  # image i's path is in `read` once its chunk was read
        if args.json:
            top_k = [{"label": label, "probability": p} for label, p in top]
            print(_json_line({"image": str(read[i]), "top_k": top_k}), flush=True)
        else:
            print(f"{one_line(read[i])}: " + ", ".join(f"{label} {p:.3f}" for label, p in top), flush=True)
    if unreadable:
        raise CommandError(_no_image_read(unreadable))


def _no_image_read(unreadable, shown=3):
    """One line for folder arguments none of whose image files could be read: `(folder,
    [(file, why)])` pairs, the first `shown` files of each named with the reason."""
    parts = []
    for folder, skipped in unreadable:
        files = "; ".join(f"{one_line(os.path.relpath(path, folder))} ({why})" for path, why in skipped[:shown])
        more = f"; and {len(skipped) - shown} more" if len(skipped) > shown else ""
        parts.append(f"{folder}: skipped all {len(skipped)} image file(s): {files}{more}")
    return "no image could be read in " + " | ".join(parts)


def _predict_exported(args, images, chunk=256):
    """Top-k lists from an exported SavedModel or .tflite file, `chunk` images at a time."""
    import itertools

    import numpy as np

    from keras_vit.export.exported import load_exported
    from keras_vit.saving import index_names, read_labels_file

    model = load_exported(args.model, args.crop)
    names = read_labels_file(args.labels) if args.labels else model.labels
    stream = images(encoded=model.takes_bytes)
    while batch := list(itertools.islice(stream, chunk)):
        probabilities = model.probabilities(batch)
        classes = probabilities.shape[-1]
        names = index_names(classes) if names is None else names  # an empty --labels file is a mismatch too
        if len(names) != classes:
            raise ValueError(f"{len(names)} label names for a model of {classes} classes.")
        for p in probabilities:
            yield [(names[i], float(p[i])) for i in np.argsort(-p)[: args.top_k]]
