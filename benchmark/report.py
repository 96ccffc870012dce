"""A benchmark result as Markdown tables and as a bar chart (what docs/benchmarks.md shows)."""

from pathlib import Path

from keras_vit.benchmark.suite import BOTH, mode_label

# the FP32 FMA peak probed in a case's rounds, and a row's share of it (CPU runs)
_PEAK = (("FMA peak GFLOP/s", "fp32_peak_gflops", "{:.0f}"), ("share of peak", "peak_share", "{:.3f}"))
_COLUMNS = {
    "inference": (
        ("images/s", "images_per_s", "{:.2f}"),
        ("spread", "spread", "{:.0%}"),
        ("GFLOP/s", "gflops_per_s", "{:.0f}"),
        *_PEAK,
        ("first call s", "first_call_s", "{:.1f}"),
        ("top-1 agreement", "agreement_with_float32", "{:.3f}"),
        ("of images", "agreement_images", "{:d}"),
        ("max logit error", "max_logit_error", "{:.3f}"),
        ("top-2 gap < 2x error", "near_ties", "{:.3f}"),
        ("MFU", "mfu", "{:.1%}"),
        ("MFU of datasheet", "mfu_datasheet", "{:.1%}"),
    ),
    "training": (
        ("images/s", "images_per_s", "{:.2f}"),
        ("spread", "spread", "{:.0%}"),
        ("GFLOP/s", "gflops_per_s", "{:.0f}"),
        *_PEAK,
        ("first step s", "first_step_s", "{:.1f}"),
        ("MFU", "mfu", "{:.1%}"),
        ("MFU of datasheet", "mfu_datasheet", "{:.1%}"),
        ("optimizer", "optimizer", "{}"),
    ),
    "agreement": (
        ("top-1 agreement", "agreement_with_float32", "{:.4f}"),
        ("of images", "agreement_images", "{:d}"),
        ("max logit error", "max_logit_error", "{:.3f}"),
        ("top-2 gap < 2x error", "near_ties", "{:.3f}"),
        ("top-1 float32", "top1_float32", "{:.2%}"),
        ("top-1 bf16", "top1", "{:.2%}"),
    ),
    "litert": (
        ("latency ms", "latency_ms", "{:.1f}"),
        ("spread", "spread", "{:.0%}"),
        ("size kB", "size_kb", "{:.0f}"),
        ("ops not on XNNPACK", "undelegated_ops", "{}"),
    ),
    "serving": (
        ("images/s", "images_per_s", "{:.2f}"),
        ("spread", "spread", "{:.0%}"),
        ("GFLOP/s", "gflops_per_s", "{:.0f}"),
        *_PEAK,
        ("export s", "export_s", "{:.0f}"),
        ("first call s", "first_call_s", "{:.1f}"),
        ("top-1 agreement", "agreement_with_float32", "{:.3f}"),
        ("of images", "agreement_images", "{:d}"),
    ),
    "pipeline": (
        ("images/s", "images_per_s", "{:.0f}"),
        ("spread", "spread", "{:.0%}"),
        ("files", "files", "{}"),
        ("first batch s", "first_batch_s", "{:.1f}"),
        ("first batch s, indexed", "first_batch_indexed_s", "{:.1f}"),
        ("corrupt planted / found", "corrupt", "{}"),
    ),
}


def markdown(result):
    """The result as Markdown: machine and versions, one table per kind, then the targets."""
    info = result["machine"]
    peak = info.get("fp32_fma_peak_gflops")
    lines = [
        f"Suite `{result['suite']}`, Keras backend `{result['backend']}`, {result['date']}, "
        f"median of {result['repeats']} timed repeats after warm-up.",
        "",
        f"Machine: {info['cpu']}, {info['threads']} threads pinned ({info['cores_visible']} cores visible), "
        f"{', '.join(info['isa'])}; measured FP32 FMA peak "
        + (f"{peak:.0f} GFLOP/s." if peak else "not measured (no C compiler)."),
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items()) + ".",
    ]
    precisions = result.get("precisions", list(BOTH))  # results written before --precisions ran both
    if result.get("cases") is not None or len(precisions) < len(BOTH):
        cases = result.get("cases")
        named = "names containing " + ", ".join(repr(c) for c in cases) if cases else "all"
        lines += ["", f"Selected cases: {named}; precisions: {', '.join(precisions)}."]
    for note in result.get("notes", []):
        lines += ["", note]
    gpu = info.get("accelerator")
    if gpu:
        lines[2] += (
            f" GPU: {gpu['name']}, measured bf16 matmul {gpu['bf16_matmul_tflops']:.0f} TFLOP/s "
            "(MFU: model FLOP/s over it)"
        )
        if gpu.get("datasheet_bf16_tflops"):
            lines[2] += f"; datasheet dense bf16 {gpu['datasheet_bf16_tflops']:.0f} TFLOP/s (MFU of datasheet)"
        lines[2] += "."
    for kind, rows in result["results"].items():
        columns = [c for c in _COLUMNS[kind] if any(row.get(c[1]) is not None for row in rows)]
        lines += [
            "",
            f"### {kind}",
            "",
            "| case | implementation | mode | " + " | ".join(c[0] for c in columns) + " |",
            "|---|---|---|" + "".join("---|" if c[2] == "{}" else "---:|" for c in columns),
        ]
        for row in rows:
            cells = [fmt.format(row[key]) if row.get(key) is not None else "" for _, key, fmt in columns]
            mode = mode_label(row)
            lines.append(f"| {row['case']} | {row['implementation']} | {mode} | " + " | ".join(cells) + " |")
    lines += _kernel_lines(result["results"])
    if result.get("targets"):
        lines += ["", "### targets", "", "| target | value | bar | met |", "|---|---:|---:|---|"]
        for t in result["targets"]:
            lines.append(f"| {t['target']} | {t['value']:.3f} | {t['bar']} | {'yes' if t['met'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def _kernel_lines(results, shown=4):
    """The rows' kernel profiles (`--kernels`) as a table: per row the profiled ms of one step
    (oneDNN's, or a server runtime's own profiler's), the step's wall ms in the profiling run, and
    its `shown` slowest kernels."""
    kinds = ("inference", "training", "serving")
    rows = [row for kind in kinds for row in results.get(kind, []) if row.get("kernels")]
    if not rows:
        return []
    lines = [
        "",
        "### kernels of one step",
        "",
        "Primitive, implementation (an `amx` one runs the AMX tiles), source data type: ms per step (calls). "
        "oneDNN's verbose log profiles the Keras, SavedModel and timm rows; it shows only oneDNN's ops: "
        "TensorFlow's matmuls, convolutions and softmax in graph and frozen modes, "
        "Eigen's float32 contractions (XLA's dots among them) as `gemm_api`, torch's bf16 matmuls; not torch's "
        "float32 matmuls nor Eigen's bf16 contractions. ONNX Runtime rows show its profiler's op types "
        "(all of them), OpenVINO rows its performance counters' layer types and kernels.",
        "",
        "| case | implementation | mode | profiled ms | step ms | slowest kernels |",
        "|---|---|---|---:|---:|---|",
    ]
    for row in rows:
        profile = row["kernels"]
        if "error" in profile:
            cells = ["", "", f"no profile: {profile['error']}"]
        else:
            kernels = [
                f"{' '.join(filter(None, (k['primitive'], k['implementation'])))} {k['dtype']}: "
                f"{k['ms']:.1f} ({k['calls']})"
                for k in profile["kernels"][:shown]
            ]
            more = len(profile["kernels"]) - shown
            kernels += [f"{more} more"] if more > 0 else []
            step = f"{profile['step_ms']:.1f}" if profile.get("step_ms") is not None else ""
            profiled = profile.get("onednn_ms", profile.get("profiled_ms"))
            cells = [f"{profiled:.1f}", step, "; ".join(kernels) or "none"]
        lines.append(f"| {row['case']} | {row['implementation']} | {mode_label(row)} | " + " | ".join(cells) + " |")
    return lines


_COLOURS = {
    "keras_vit": "tab:blue",
    "keras-hub": "tab:orange",
    "timm": "tab:green",
    "SavedModel": "tab:blue",
    "onnxruntime": "tab:purple",
    "openvino": "tab:cyan",
}


def chart(result, path):
    """The result's rows as horizontal bars, one panel per case (images/s, or batch-1 latency
    for LiteRT), coloured by implementation; saved to `path` (PNG, or SVG/PDF by extension).
    Returns the path, or None when the result has no rows. Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    panels = []
    for kind, rows in result["results"].items():
        key, unit = ("latency_ms", "ms (lower is faster)") if kind == "litert" else ("images_per_s", "images/s")
        for case in dict.fromkeys(row["case"] for row in rows):
            bars = [row for row in rows if row["case"] == case and row.get(key) is not None]
            if bars:
                panels.append((case, unit, [(f"{r['implementation']} {mode_label(r)}", r[key], r) for r in bars]))
    if not panels:
        return None
    heights = [0.22 * len(bars) + 0.6 for _, _, bars in panels]
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(7, sum(heights) + 0.6),
        gridspec_kw={"height_ratios": heights},
        squeeze=False,
        layout="constrained",  # keeps the title clear of the first panel
    )
    for ax, (case, unit, bars) in zip(axes[:, 0], panels):
        labels, values, rows = zip(*bars)
        ax.barh(range(len(bars)), values, color=[_COLOURS.get(r["implementation"], "tab:gray") for r in rows])
        ax.set_yticks(range(len(bars)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_title(case, fontsize=8, loc="left")
        ax.set_xlabel(unit, fontsize=7)
        ax.tick_params(axis="x", labelsize=7)
        ax.set_xlim(0, max(values) * 1.15)
        for y, value in enumerate(values):
            ax.text(value, y, f" {value:,.0f}" if value >= 100 else f" {value:.1f}", va="center", fontsize=6)
    machine = result["machine"]
    gpu = (machine.get("accelerator") or {}).get("name")
    fig.suptitle(f"{gpu or machine['cpu']}, suite {result['suite']}, {result['backend']}, {result['date']}", fontsize=9)
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
