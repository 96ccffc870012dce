"""`export`: SavedModel and LiteRT files of one model, each run on held-out images and
reported; files are staged in a temporary directory and moved into place at the end."""

import dataclasses
import logging
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from keras_vit.export import litert, manifest, metadata, report, serving
from keras_vit.export.config import ExportConfig
from keras_vit.export.source import ExportError, require_tensorflow_backend
from keras_vit.progress import progress_bar
from keras_vit.saving import in_policy

logger = logging.getLogger("keras_vit")
LATENCY_NOTE = (
    "median of 20 batch-1 runs (LiteRT: ai_edge_litert, ONNX: onnxruntime, OpenVINO: its CPU plugin, {threads} "
    "threads; SavedModel: TensorFlow)"
)


def export(source, config=None, **options):
    """Exports `source` (an `ExportSource`) as `config` (an `ExportConfig`; `options` are its
    fields, given instead or overriding it) and returns the report, also written as
    `export_report.json`/`.md` with the config as `export_config.yaml` to the report directory
    (default: the TFLite, ONNX, OpenVINO, else the SavedModel directory). Each directory written
    gets a `SHA256SUMS` manifest of its files."""
    require_tensorflow_backend()
    if config is None:
        config = ExportConfig(**options)
    elif options:
        config = dataclasses.replace(config, **options)
    c = config
    source = _limited(source, c)
    plan = _tflite_plan(c.name, c.modes, c.qat_epochs, c.prune, c.cluster) if c.tflite_dir else []
    if c.tflite_dir and not c.overwrite:
        taken = [f for f, *_ in plan if (Path(c.tflite_dir) / f).exists()]
        if taken:
            raise ExportError(f"{Path(c.tflite_dir) / taken[0]} exists; pass --overwrite to replace it.")
    if c.onnx_dir:
        from keras_vit.export import onnx_model

        onnx_model.check_installed()
    openvino_modes = ()
    if c.openvino_dir:
        from keras_vit.export import openvino_model

        openvino_modes = _openvino_modes(c.openvino_modes, openvino_model.cpu_modes())
        openvino_model.check_installed(quantizing="int8" in openvino_modes)
    other_files = [(c.onnx_dir, f"{c.name}_{mode}.onnx") for mode in (c.onnx_modes if c.onnx_dir else ())]
    other_files += [
        (c.openvino_dir, f"{c.name}_{mode}{suffix}") for mode in openvino_modes for suffix in (".xml", ".bin")
    ]
    if not c.overwrite and (taken := [Path(d) / f for d, f in other_files if (Path(d) / f).exists()]):
        raise ExportError(f"{taken[0]} exists; pass --overwrite to replace it.")
    if c.onnx_dir and "int8" in c.onnx_modes and source.calibration_images is None:
        raise ExportError(
            "the ONNX int8 mode needs calibration images: export a run directory, pass --dataset, or choose "
            "--onnx-quantize among float32 dynamic."
        )
    if "int8" in openvino_modes and source.calibration_images is None:
        raise ExportError(
            "the OpenVINO int8 mode needs calibration images: export a run directory, pass --dataset, or choose "
            "--openvino-precision among float32 bfloat16."
        )
    if c.saved_model_dir:  # a version that exists, refused before any file is written (it was after the LiteRT files)
        serving.version_directory(c.saved_model_dir, c.name, c.version, c.overwrite)
    needs_calibration = any(mode in litert.CALIBRATED for _, _, mode in plan)
    if needs_calibration and source.calibration_images is None:
        calibrated = [mode for mode in litert.MODES if mode in {mode for _, _, mode in plan} & set(litert.CALIBRATED)]
        uncalibrated = " ".join(mode for mode in litert.MODES if mode not in litert.CALIBRATED)
        which = f"the {calibrated[0]} mode needs" if len(calibrated) == 1 else f"the {', '.join(calibrated)} modes need"
        raise ExportError(
            f"{which} calibration images: export a run directory, pass --dataset, or choose --quantize among "
            f"{uncalibrated}."
        )
    if c.fine_tunes and source.train is None:
        raise ExportError("QAT, pruning and clustering fine-tune: export a run directory or pass --dataset.")
    if c.fine_tunes:
        from keras_vit.export import tfmot_bridge

        tfmot_bridge.check_installed()

    images, labels, eval_source = _held_out(source)
    # LiteRT files start from float32 weights and math (its builtin ops have no bfloat16 or
    # float16 matmuls), and every artifact is checked against that model.
    float32_model = in_policy(source.model, "float32")
    reference = _softmax(float32_model.predict(images, batch_size=64, verbose=0))
    rows = []
    if c.tflite_dir:
        values = {"float": None, "pruned": c.prune, "clustered": c.cluster, "qat": c.qat_epochs}
        rows += _export_tflite(
            dataclasses.replace(source, model=float32_model),
            plan,
            values,
            Path(c.tflite_dir),
            c.name,
            c.io_type,
            images,
            labels,
            reference,
            c.threads,
            c.finetune_epochs,
        )
    checks = (images, labels, reference, c.threads)
    float_source = dataclasses.replace(source, model=float32_model)
    if c.onnx_dir:
        rows += _export_onnx(float_source, c.onnx_modes, Path(c.onnx_dir), c.name, checks)
    if openvino_modes:
        rows += _export_openvino(float_source, openvino_modes, Path(c.openvino_dir), c.name, checks)
    if c.saved_model_dir:
        model, policy, freeze = serving.serving_model(source.model, c.saved_model_precision, c.freeze)
        target = serving.save_serving_model(
            dataclasses.replace(source, model=model),
            c.saved_model_dir,
            name=c.name,
            version=c.version,
            overwrite=c.overwrite,
            freeze=freeze,
        )
        kind = f"{policy}, frozen" if freeze else policy
        manifest.record_tree(c.saved_model_dir, target)
        rows.insert(0, _measure_saved_model(target, images, labels, reference, kind))
    result = {
        "model": c.name,
        "num_eval": int(len(images)),
        "eval_source": eval_source,
        "reference": "float32 Keras model",
        "latency_note": LATENCY_NOTE.format(threads=c.threads),
        "artifacts": rows,
    }
    report_dir = c.report_dir or c.tflite_dir or c.onnx_dir or c.openvino_dir or c.saved_model_dir
    result["table"] = report.write(result, report_dir)
    c.write(report_dir)
    return result


def _limited(source, c):
    """`source` with at most `eval_limit` held-out and `calibration_size` calibration images."""
    data = {}
    if source.eval_images is not None:
        data.update(eval_images=source.eval_images[: c.eval_limit], eval_labels=source.eval_labels[: c.eval_limit])
    if source.calibration_images is not None:
        data.update(calibration_images=source.calibration_images[: c.calibration_size])
    return source.with_data(data)


def _tflite_plan(name, modes, qat_epochs, prune, cluster):
    """(file name, model variant, mode) of every LiteRT file, in export order."""
    plan = [(f"{name}_{mode}.tflite", "float", mode) for mode in modes]
    tail = ("float32", "int8") if "int8" in modes else ("float32",)
    if prune:
        plan += [(f"{name}_pruned{round(100 * prune)}_{mode}.tflite", "pruned", mode) for mode in tail]
    if cluster:
        plan += [(f"{name}_clustered{cluster}_{mode}.tflite", "clustered", mode) for mode in tail]
    if qat_epochs:
        plan.append((f"{name}_qat_int8.tflite", "qat", "int8"))
    return plan


def _export_tflite(source, plan, values, directory, name, io_type, images, labels, reference, threads, epochs):
    from keras_vit.export import tfmot_bridge

    directory.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".export.", dir=directory))
    modules, rows, extra = {}, [], {}
    try:
        progress = progress_bar(len(plan), unit_name="file")
        for i, (file_name, variant, mode) in enumerate(plan):
            if variant not in modules:
                modules[variant], extra[variant] = _variant(variant, values[variant], source, tfmot_bridge, epochs)
            io = io_type if mode in litert.IO_TYPES and io_type in litert.IO_TYPES[mode] else "float32"
            data = litert.convert(modules[variant], mode, source.calibration_images, io)
            if variant == "qat":
                data = litert.fold_requantize(data)
            ops = litert.check_ops(data, mode)
            description = f"ViT image classifier ({variant}, {mode})"
            if io not in litert.MEDIAPIPE_IO_TYPES:
                description += f"; {io} input/output: not {report.FOR_MEDIAPIPE}"
            data = metadata.with_metadata(
                data,
                name,
                description,
                source.labels,
                source.model.config.image_size,
                records=metadata.model_records(source.model.config, source.data_split),
            )
            file = staging / file_name
            file.write_bytes(data)
            runner = litert.LiteRTModel(data, num_threads=threads)
            rows.append(
                report.measure(
                    file.name,
                    "tflite",
                    directory / file.name,
                    data,
                    runner.predict(images),
                    reference,
                    labels,
                    runner.latency_ms(images[0]),
                    mode=mode,
                    io_type=io,
                    mediapipe_ready=io in litert.MEDIAPIPE_IO_TYPES,
                    variant=variant,
                    ops=ops,
                    **extra[variant],
                )
            )
            progress.update(i + 1, finalize=False)
        progress.update(len(plan), finalize=True)
        for _, row in zip(plan, rows):
            os.replace(staging / row["artifact"], directory / row["artifact"])
        manifest.record(directory, [directory / row["artifact"] for row in rows])
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return rows


def _variant(variant, value, source, bridge, epochs):
    """The LiteRT source module of a model variant and what the report says about it."""
    model = source.model
    if variant == "float":
        return litert.keras_module(model), {}
    if variant == "qat":
        trained = bridge.quantization_aware(model, source, value)
        module = litert.ClassifierModule(
            lambda x: trained(x, training=False), trained.variables, model.config.image_size
        )
        return module, {"qat_epochs": value}
    if variant == "pruned":
        pruned = bridge.prune(model, source, value, epochs)
        kernels = [np.asarray(w) for w in pruned.weights if bridge.pruned_or_clustered(w.path)]
        zeros = sum(int((k == 0).sum()) for k in kernels) / sum(k.size for k in kernels)
        return litert.keras_module(pruned), {"target_sparsity": value, "kernel_sparsity": round(zeros, 4)}
    clustered = bridge.cluster(model, source, value, epochs)
    distinct = max(len(np.unique(np.asarray(w))) for w in clustered.weights if bridge.pruned_or_clustered(w.path))
    return litert.keras_module(clustered), {"clusters": value, "max_distinct_kernel_values": distinct}


def _openvino_modes(asked, native):
    """The OpenVINO modes to write: `asked` (None: the precisions the CPU runs natively, `native`;
    int8, which calibrates, when asked); ExportError for a precision the CPU lacks, whose file
    would not be checked as it runs."""
    if asked is None:
        return native
    if lacking := [mode for mode in asked if mode not in native and mode != "int8"]:
        raise ExportError(
            f"this CPU has no native {lacking[0]} (OpenVINO finds no BF16: AVX512_BF16 or AMX), so its file could "
            "not be checked here; export it on such a CPU."
        )
    return asked


def _staged_rows(directory, write_and_measure):
    """Runs `write_and_measure(staging)` (-> report rows, each with the `files` it wrote into the
    staging folder) and moves the files into `directory`, recorded in its manifest."""
    directory.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".export.", dir=directory))
    try:
        rows = write_and_measure(staging)
        moved = []
        for row in rows:
            for name in row.pop("files"):
                os.replace(staging / name, directory / name)
                moved.append(directory / name)
        manifest.record(directory, moved)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return rows


def _export_onnx(source, modes, directory, name, checks):
    from keras_vit.export import onnx_model

    images, labels, reference, threads = checks
    properties = metadata.model_properties(source.labels, source.model.config, source.data_split)

    def write_and_measure(staging):
        float_bytes = onnx_model.convert(litert.keras_module(source.model, batch=None), properties)
        rows = []
        for mode in modes:
            data = onnx_model.quantize(float_bytes, mode, source.calibration_images)
            ops = onnx_model.check_ops(data, mode)
            file = f"{name}_{mode}.onnx"
            (staging / file).write_bytes(data)
            runner = onnx_model.OnnxModel(data, num_threads=threads)
            latency = report.median_ms(lambda runner=runner: runner.predict(images[:1]))
            rows.append(
                report.measure(
                    file,
                    "onnx",
                    directory / file,
                    data,
                    runner.predict(images),
                    reference,
                    labels,
                    latency,
                    mode=mode,
                    ops=ops,
                    files=[file],
                )
            )
        return rows

    return _staged_rows(directory, write_and_measure)


def _export_openvino(source, modes, directory, name, checks):
    from keras_vit.export import openvino_model

    images, labels, reference, threads = checks
    properties = metadata.model_properties(source.labels, source.model.config, source.data_split)
    model = openvino_model.convert(litert.keras_module(source.model, batch=None))

    def write_and_measure(staging):
        rows = []
        for mode in modes:
            xml, weights = openvino_model.save(
                model, staging / f"{name}_{mode}.xml", mode, properties, source.calibration_images
            )
            runner = openvino_model.OpenVINOModel(xml, num_threads=threads)
            latency = report.median_ms(lambda runner=runner: runner.predict(images[:1]))
            data = xml.read_bytes() + weights.read_bytes()  # the size and gzip size of both files
            rows.append(
                report.measure(
                    f"{xml.name} (OpenVINO, {'int8' if mode == 'int8' else runner.precision})",
                    "openvino",
                    directory / xml.name,
                    data,
                    runner.predict(images),
                    reference,
                    labels,
                    latency,
                    mode=mode,
                    files=[xml.name, weights.name],
                )
            )
        return rows

    return _staged_rows(directory, write_and_measure)


STAND_IN_IMAGES = 16


def _held_out(source):
    """The images every artifact is checked on, their labels (None: no accuracy) and what they are."""
    if source.eval_images is not None:
        return source.eval_images, source.eval_labels, "held-out split"
    if source.calibration_images is not None:
        return source.calibration_images, None, "calibration sample (no labels)"
    # No data: seeded random pixels still show whether an artifact computes what the model does.
    shape = (STAND_IN_IMAGES, *source.model.config.image_size, source.model.config.channels)
    images = np.random.default_rng(0).uniform(0, 255, shape).astype(np.float32)
    return images, None, "random stand-in images, no dataset: agreement only"


def _measure_saved_model(target, images, labels, reference, kind):
    import tensorflow as tf

    signature = tf.saved_model.load(str(target)).signatures[serving.IMAGES_SIGNATURE]
    probabilities = np.concatenate(
        [signature(images=tf.constant(images[i : i + 64]))["probabilities"].numpy() for i in range(0, len(images), 64)]
    )
    one = tf.constant(images[:1])
    latency = report.median_ms(lambda: signature(images=one))
    return report.measure(
        f"{target.parent.name}/{target.name} (SavedModel, {kind})",
        "saved_model",
        target,
        None,
        probabilities,
        reference,
        labels,
        latency,
    )


def _softmax(logits):
    logits = np.asarray(logits, np.float64)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)
