"""`keras-vit export`: SavedModel for TF Serving and LiteRT files, checked and reported."""

from keras_vit_cli.names import names

_MODES = names.LITERT_MODES


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "export",
        help="export a trained model for TF Serving (SavedModel) and devices (LiteRT/TFLite)",
        description="Export a `keras-vit train` run directory (its best checkpoint, labels and data) or a .keras "
        "file. --saved-model writes DIR/NAME/VERSION/ for TF Serving (signatures serving_default on float pixels "
        "and serve_image_bytes on encoded JPEG/PNG, warm-up requests, models.config); with --freeze its weights are "
        "graph constants, which TensorFlow runs faster on CPU. --tflite writes "
        "NAME_MODE.tflite files with label metadata (MediaPipe-ready), builtin ops only. Every artifact is run on "
        "the held-out images; the report (export_report.json/.md) gives size, top-1, agreement with the Keras "
        f"model and batch-1 latency. Quantisation modes: {', '.join(_MODES)}.",
    )
    parser.add_argument("source", help="run directory from `keras-vit train`, or a .keras model file")
    parser.add_argument("--saved-model", metavar="DIR", help="TF Serving model base directory")
    parser.add_argument("--tflite", metavar="DIR", help="directory for the .tflite files")
    parser.add_argument(
        "--quantize",
        nargs="+",
        metavar="MODE",
        default=["float32", "int8"],
        help="LiteRT modes (default: float32 int8); int8-mixed computes softmax, GELU and "
        "the normalisations in float32: faster on CPUs, not for integer-only accelerators",
    )
    parser.add_argument(
        "--io-type",
        default="float32",
        help="input/output type of int8 and int8-mixed (float32, int8, uint8) and int16x8 (float32, int16) files",
    )
    parser.add_argument("--name", default="vit", help="model name: TF Serving folder and .tflite prefix (vit)")
    parser.add_argument(
        "--freeze",
        action="store_true",
        help="SavedModel with the weights as graph constants: faster on CPU (weight casts folded, "
        "matmuls on constant weights), graphs up to 2 GiB",
    )
    parser.add_argument("--version", type=int, help="TF Serving version (default: the next free number)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing version or .tflite file")
    parser.add_argument("--qat-epochs", type=int, default=0, help="quantisation-aware fine-tuning, then int8")
    parser.add_argument("--prune", type=float, metavar="SPARSITY", help="magnitude pruning to SPARSITY in (0, 1)")
    parser.add_argument("--cluster", type=int, metavar="N", help="weight clustering into N shared values")
    parser.add_argument("--finetune-epochs", type=int, default=2, help="fine-tuning epochs of --prune/--cluster")
    parser.add_argument("--labels", help="label file (one name per line) for a .keras source")
    parser.add_argument("--dataset", help="training data of a .keras source: digits, tfds:NAME or a folder")
    parser.add_argument("--calibration-size", type=int, default=200, help="representative images for int8")
    parser.add_argument("--eval-limit", type=int, default=2000, help="held-out images to check on")
    parser.add_argument("--threads", type=int, default=2, help="LiteRT interpreter threads for the latency")
    parser.add_argument("--report-dir", help="where the report goes (default: the --tflite or --saved-model dir)")
    parser.set_defaults(run=run)


def run(args):
    from keras_vit_cli import CommandError

    unknown = [m for m in args.quantize if m not in _MODES]
    if unknown:
        raise CommandError(f"unknown quantisation mode {unknown[0]!r}; choose from {', '.join(_MODES)}.")
    if not args.saved_model and not args.tflite:
        raise CommandError("nothing to export: pass --saved-model DIR, --tflite DIR or both.")
    if args.calibration_size < 1 or args.eval_limit < 1 or args.threads < 1:
        raise CommandError("--calibration-size, --eval-limit and --threads must be positive.")
    from keras_vit import saving
    from keras_vit.export import ExportError, export, load_source

    source = load_source(args.source, labels=args.labels)
    if args.dataset or saving.is_run_dir(args.source):
        from keras_vit.training import export_samples

        try:
            data = export_samples(source.model, args.source, args.dataset, args.calibration_size, args.eval_limit)
        except (ValueError, OSError) as error:
            raise ExportError(str(error)) from None
        source = source.with_data(data)
    result = export(
        source,
        saved_model_dir=args.saved_model,
        tflite_dir=args.tflite,
        modes=args.quantize,
        io_type=args.io_type,
        name=args.name,
        version=args.version,
        overwrite=args.overwrite,
        qat_epochs=args.qat_epochs,
        prune=args.prune,
        cluster=args.cluster,
        finetune_epochs=args.finetune_epochs,
        report_dir=args.report_dir,
        threads=args.threads,
        freeze=args.freeze,
    )
    print(result["table"])
