"""`keras-vit export`: SavedModel for TF Serving, LiteRT, ONNX and OpenVINO files, checked and reported."""

import argparse

from keras_vit_cli.names import names
from keras_vit_cli.output import progress_on_stderr
from keras_vit_cli.signals import sigterm_as_interrupt

_MODES = names.LITERT_MODES


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "export",
        help="export a trained model for TF Serving (SavedModel), devices (LiteRT/TFLite), ONNX Runtime and OpenVINO",
        description="Export a `keras-vit train` run directory (its best checkpoint, labels and data), a "
        ".keras file or a checkpoint. --saved-model writes DIR/NAME/VERSION/ for TF Serving (signatures "
        "serving_default on float pixels and serve_image_bytes on encoded JPEG/PNG/BMP/GIF/WebP, warm-up "
        "requests, models.config), in float32 or, with --saved-model-precision bfloat16, with bf16 matmuls for "
        "CPUs that have them; frozen (--freeze, the default for bfloat16) its weights are graph constants, which "
        "TensorFlow runs faster on CPU. --tflite writes NAME_MODE.tflite files with label metadata "
        "(MediaPipe-ready, except with --io-type int8 or int16), builtin ops only. --onnx writes NAME_MODE.onnx "
        "files (standard ONNX ops) and --openvino NAME_MODE.xml/.bin OpenVINO IR files, with the labels and input "
        "transform as metadata. Each directory gets a SHA256SUMS manifest, which predict and evaluate check. "
        "Every artifact is run on the "
        "held-out images (--dataset: another data's, needed for calibrated modes of a model without a run); "
        "the report (export_report.json/.md) gives size, top-1, agreement with the Keras model and batch-1 "
        "latency; export_config.yaml beside it "
        f"records the options. Quantisation modes: {', '.join(_MODES)}.",
    )
    parser.add_argument(
        "--config", help="YAML file of export options (ExportConfig fields, e.g. modes: [float32, int8]); flags win"
    )
    parser.add_argument("source", help="run directory from `keras-vit train`, .keras model file or checkpoint")
    parser.add_argument("--saved-model", metavar="DIR", help="TF Serving model base directory")
    parser.add_argument("--tflite", metavar="DIR", help="directory for the .tflite files")
    parser.add_argument("--onnx", metavar="DIR", help="directory for the .onnx files (the onnx extra)")
    parser.add_argument(
        "--onnx-quantize",
        nargs="+",
        metavar="MODE",
        choices=names.ONNX_MODES,
        help="ONNX modes (default: all): float32; dynamic (int8 weights, activations quantised per call); int8 "
        "(weights and activations, calibrated as LiteRT's int8)",
    )
    parser.add_argument(
        "--openvino", metavar="DIR", help="directory for the OpenVINO .xml/.bin files (the openvino extra)"
    )
    parser.add_argument(
        "--openvino-precision",
        nargs="+",
        metavar="MODE",
        choices=names.OPENVINO_MODES,
        help="OpenVINO CPU inference precisions (default: float32, and bfloat16 where the CPU has AVX512_BF16 or AMX); "
        "int8: NNCF's int8 weights and activations, calibrated as LiteRT's int8",
    )
    parser.add_argument(
        "--quantize",
        nargs="+",
        metavar="MODE",
        choices=_MODES,
        help="LiteRT modes (default: float32 int8); int8-mixed computes softmax, GELU and "
        "the normalisations in float32: faster on CPUs, not for integer-only accelerators",
    )
    parser.add_argument(
        "--io-type",
        help="input/output type of int8 and int8-mixed (float32, int8, uint8) and int16x8 (float32, int16) files; "
        "MediaPipe's ImageClassifier takes uint8 and float32 only",
    )
    parser.add_argument(
        "--name",
        help="model name: TF Serving folder and .tflite prefix (vit); with --saved-model ASCII letters, digits, "
        "'_', '-' and '.' (not first)",
    )
    parser.add_argument(
        "--saved-model-precision",
        choices=tuple(names.SAVED_MODEL_PRECISIONS),
        help="float32, or bfloat16 (bf16 matmuls, float32 logits) for CPUs with AVX512_BF16 or AMX "
        "(default: the model's own)",
    )
    parser.add_argument(
        "--freeze",
        action=argparse.BooleanOptionalAction,
        help="SavedModel with the weights as graph constants: faster on CPU (weight casts folded, "
        "bfloat16 weights stored in bf16, matmuls on constant weights), graphs up to 2 GiB "
        "(default: frozen for bfloat16 only)",
    )
    parser.add_argument("--version", type=int, help="TF Serving version (default: the next free number)")
    parser.add_argument(
        "--overwrite", action="store_true", default=None, help="replace an existing version or .tflite file"
    )
    parser.add_argument("--qat-epochs", type=int, help="quantisation-aware fine-tuning epochs, then int8 (0: none)")
    parser.add_argument("--prune", type=float, metavar="SPARSITY", help="magnitude pruning to SPARSITY in (0, 1)")
    parser.add_argument("--cluster", type=int, metavar="N", help="weight clustering into N shared values")
    parser.add_argument("--finetune-epochs", type=int, help="fine-tuning epochs of --prune/--cluster (2)")
    parser.add_argument("--labels", help="label file (one name per line) for a .keras source")
    parser.add_argument("--dataset", help="training data of a .keras source: digits, tfds:NAME or a folder")
    parser.add_argument("--calibration-size", type=int, help="representative images for int8 (200)")
    parser.add_argument("--eval-limit", type=int, help="held-out images to check on (2000)")
    parser.add_argument("--threads", type=int, help="LiteRT, ONNX Runtime and OpenVINO threads for the latency (2)")
    parser.add_argument(
        "--report-dir", help="where the report goes (default: the --tflite, --onnx, --openvino or --saved-model dir)"
    )
    # SavedModel and LiteRT are TensorFlow graphs; the .keras file loads there from any backend.
    parser.set_defaults(run=run, keras_backend="tensorflow")


# flag -> ExportConfig field; defaults stay None so a --config file can set them.
_FIELDS = {
    "saved_model": "saved_model_dir",
    "tflite": "tflite_dir",
    "onnx": "onnx_dir",
    "onnx_quantize": "onnx_modes",
    "openvino": "openvino_dir",
    "openvino_precision": "openvino_modes",
    "quantize": "modes",
    "io_type": "io_type",
    "name": "name",
    "saved_model_precision": "saved_model_precision",
    "freeze": "freeze",
    "version": "version",
    "overwrite": "overwrite",
    "qat_epochs": "qat_epochs",
    "prune": "prune",
    "cluster": "cluster",
    "finetune_epochs": "finetune_epochs",
    "calibration_size": "calibration_size",
    "eval_limit": "eval_limit",
    "threads": "threads",
    "report_dir": "report_dir",
}


def _flag_named(message, given):
    """ExportConfig's `message` with the field it starts with named by its flag where a flag gave
    it (`calibration_size must be positive` -> `--calibration-size must be positive`); a field of
    the --config file keeps its name there."""
    for flag, field in _FIELDS.items():
        if field in given and message.startswith(f"{field} "):
            return f"--{flag.replace('_', '-')}{message[len(field) :]}"
    return message


def run(args):
    # SIGTERM stops it as Ctrl-C does: the staging folders (.export.*, .VERSION.*) are removed.
    with sigterm_as_interrupt():
        _export(args)


def _export(args):
    from keras_vit.export import ExportConfig, ExportError, export, load_source
    from keras_vit.training.run import training_run

    options = {field: getattr(args, flag) for flag, field in _FIELDS.items() if getattr(args, flag) is not None}
    try:
        config = ExportConfig.from_yaml(args.config, **options) if args.config else ExportConfig(**options)
    except ExportError as error:
        raise ExportError(_flag_named(str(error), options)) from None
    if args.finetune_epochs is not None and config.prune is None and config.cluster is None:
        raise ValueError("--finetune-epochs sets how long --prune and --cluster fine-tune; give one of them.")
    source = load_source(args.source, labels=args.labels)
    if args.dataset or training_run(args.source) is not None:
        from keras_vit.saving import index_names
        from keras_vit.training import export_samples

        # the data's classes are matched to the labels by name, unless the model has none
        names = None if source.labels == index_names(len(source.labels)) else source.labels
        try:
            data = export_samples(
                source.model, args.source, args.dataset, config.calibration_size, config.eval_limit, names
            )
        except (ValueError, OSError) as error:
            raise ExportError(str(error)) from None
        source = source.with_data(data)
    with progress_on_stderr():
        result = export(source, config)
    print(result["table"])
