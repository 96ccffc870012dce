"""`keras-vit benchmark`: keras_vit against keras-hub and timm, as ratios in one run."""


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "benchmark",
        help="measure keras_vit side by side with keras-hub and timm (speed ratios and targets)",
        description="Run a benchmark suite: inference throughput (float32 and mixed_bfloat16), "
        "model.fit training throughput with AdamW and the first step's time, the top-1 agreement of bfloat16 with "
        "float32 on the digits default trained here, LiteRT batch-1 latency of the export modes "
        "(beside ONNX Runtime's), "
        "the exported SavedModel, ONNX and OpenVINO files' throughput on their server runtimes, and the training "
        "input pipeline's rate. keras-hub runs the same architecture on the same Keras "
        "backend, timm on torch (eager and torch.compile, float32 and bfloat16; on the GPU when torch sees one). "
        "Every figure is the median of --repeats timed runs after warm-up, with the threads pinned; within a case "
        "every model stays loaded and "
        "is timed in rounds (each once per round), so load on a shared machine falls on all alike, and the case's "
        "rows print when its rounds end. On the CPU an FP32 FMA probe runs in the inference and training rounds too, "
        "and each of their rows gives its share of the peak probed beside it. The JSON result lists the machine "
        "(with its measured FP32 FMA peak), versions and the targets met; a Markdown table (.md) and a bar chart "
        "(.png) of it are written next to it. `quick` takes minutes; `full` "
        "(ViT-S/16, B/16, Ti/16 and a CIFAR-size model) about an hour on 2 cores, each of its CPU inference and "
        "training cases in a fresh process (a process keeps much of what a case's graphs allocated; a case "
        "whose process fails is noted, the others still run and the exit status is then 1); "
        "`gpu` (batch 256, ViT-B/16 training) is for a GPU under "
        "KERAS_BACKEND=jax and adds model-FLOPs utilisation against the GPU's measured bf16 matmul rate.",
    )
    parser.add_argument("--suite", default="quick", help="quick, full or gpu (default: quick)")
    parser.add_argument(
        "--against",
        default="keras-hub,timm",
        help="comma-separated implementations to compare with: keras-hub, timm, or none",
    )
    parser.add_argument(
        "--kinds",
        help="comma-separated subset of inference, training, agreement, litert, serving, pipeline (default: all)",
    )
    parser.add_argument(
        "--cases",
        help="comma-separated parts of case names: run only the cases whose name contains "
        "one, e.g. 'B/16 inference' (default: every case of the suite)",
    )
    parser.add_argument(
        "--precisions",
        help="comma-separated subset of float32, mixed_bfloat16 for the inference, training and serving cases "
        "(timm's bf16 modes count as mixed_bfloat16; default: both)",
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per figure, at least 5 (default 5)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads every runtime is pinned to (default 2)")
    parser.add_argument(
        "--kernels",
        action="store_true",
        help="after each CPU inference, training and serving case's timing, profile one step of each row with "
        "oneDNN's verbose log (a fresh process for Keras and SavedModel rows): which primitive and implementation ran "
        "(an avx512_core_amx one uses the AMX tiles), on which data type, and for how long; ONNX Runtime and "
        "OpenVINO rows get their runtime's own per-op profile; a kernels table joins the report",
    )
    parser.add_argument(
        "--out",
        required=True,
        help="result JSON file (a Markdown table and, with matplotlib, a bar chart are written next to it)",
    )
    parser.set_defaults(run=run)


def run(args):
    import sys
    from pathlib import Path

    from keras_vit.benchmark.runner import COMPETITORS
    from keras_vit.benchmark.suite import BOTH, KINDS
    from keras_vit_cli import CommandError

    against = _listed(args.against, "--against", "keras-hub, timm, or none")
    if "none" in against and len(against) > 1:
        raise CommandError("--against none compares with nothing; it goes alone.")
    against = [] if against == ["none"] else against
    unknown = [a for a in against if a not in COMPETITORS]
    if unknown:
        raise CommandError(f"unknown implementation {unknown[0]!r} in --against; choose from keras-hub, timm, or none.")
    kinds = list(KINDS) if args.kinds is None else _listed(args.kinds, "--kinds", ", ".join(KINDS))
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise CommandError(f"unknown kind {unknown[0]!r}; choose from {', '.join(KINDS)}.")
    precisions = list(BOTH) if args.precisions is None else _listed(args.precisions, "--precisions", ", ".join(BOTH))
    if args.threads < 1:
        raise CommandError("--threads must be positive.")
    from keras_vit.benchmark import markdown, pin_threads, quiet_retracing, run_suite, share_gpu

    pin_threads(args.threads)
    share_gpu()
    if not args.verbose:
        quiet_retracing()
    cases = None if args.cases is None else [c.strip() for c in args.cases.split(",") if c.strip()]
    # run_suite checks --against, --repeats, --cases and --precisions (a ValueError: one line, exit 2)
    result = run_suite(
        args.suite,
        against=against,
        kinds=kinds,
        repeats=args.repeats,
        threads=args.threads,
        out=args.out,
        log=_progress,
        cases=cases,
        precisions=precisions,
        kernels=args.kernels,
        isolate=args.suite == "full",
        quiet=not args.verbose,
    )
    table = markdown(result)
    Path(args.out).with_suffix(".md").write_text(table)
    print(table)
    print(f"wrote {args.out} and {Path(args.out).with_suffix('.md')}")
    try:
        from keras_vit.benchmark.report import chart

        drawn = chart(result, Path(args.out).with_suffix(".png"))
    except ImportError:  # matplotlib comes with the inspect extra
        print("no bar chart: matplotlib is not installed (pip install 'keras3-vit[inspect]')")
    else:
        if drawn:
            print(f"wrote {drawn}")
    if result["failed"]:  # after the other cases' results are written
        names = ", ".join(repr(f["case"]) for f in result["failed"])
        print(f"keras-vit benchmark: error: not measured: {names} (see the notes in {args.out})", file=sys.stderr)
        return 1


def _progress(row):
    from keras_vit.benchmark.suite import mode_label

    if isinstance(row, str):  # a note on what the suite left out
        print(f"  {row}", flush=True)
        return
    if "images_per_s" in row:
        figure = f"{row['images_per_s']:.2f} images/s"
    elif "latency_ms" in row:
        figure = f"{row['latency_ms']:.1f} ms"
    else:
        figure = f"top-1 agreement with float32 {row['agreement_with_float32']:.2%} of {row['agreement_images']} images"
    print(f"  {row['case']}: {row['implementation']} {mode_label(row)}: {figure}", flush=True)


def _listed(value, flag, choices):
    """The comma-separated items of a flag's value; a CommandError when it names none."""
    from keras_vit_cli import CommandError

    items = [item.strip() for item in value.split(",") if item.strip()]
    if not items:
        raise CommandError(f"{flag} names nothing; give one or more of {choices}.")
    return items
