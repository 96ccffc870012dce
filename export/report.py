"""The export report: every artifact's size, held-out top-1, agreement with the float Keras
model and batch-1 latency, as JSON and as a Markdown table."""

import gzip
import json
import time
from pathlib import Path

import numpy as np

COLUMNS = (
    ("artifact", "artifact"),
    ("size_kb", "size (kB)"),
    ("gzip_kb", "gzip (kB)"),
    ("top1", "top-1"),
    ("agreement", "top-1 agreement"),
    ("max_prob_diff", "max abs Δp"),  # no "|" in a Markdown table cell
    ("latency_ms", "batch-1 latency (ms)"),
)


FOR_MEDIAPIPE = "for MediaPipe's ImageClassifier, which takes uint8 or float32 input"  # "not ...": int8/int16 io


def measure(name, kind, path, data, probabilities, reference, labels=None, latency_ms=None, **extra):
    """One report row: `data` the file's bytes (None: a directory, measured at `path`),
    `probabilities` of the artifact and `reference` (the float32 Keras model) on the same images,
    `labels` the true classes (None: no accuracy)."""
    return {
        "artifact": name,
        "kind": kind,
        "path": str(path),
        "size_kb": round((len(data) if data is not None else _size(path)) / 1024, 1),
        "gzip_kb": round(len(gzip.compress(data, 9)) / 1024, 1) if data is not None else None,
        "agreement": float(np.mean(probabilities.argmax(-1) == reference.argmax(-1))),
        "max_prob_diff": float(np.abs(probabilities - reference).max()),
        "top1": float(np.mean(probabilities.argmax(-1) == labels)) if labels is not None else None,
        "latency_ms": None if latency_ms is None else round(latency_ms, 3),
        **extra,
    }


def median_ms(call, repeats=20, warmup=3):
    """Median wall time of `call()` in milliseconds, after `warmup` calls."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return 1000.0 * float(np.median(times))


def write(report, directory):
    """Writes `export_report.json` and `export_report.md` into `directory`; returns the table."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "export_report.json").write_text(json.dumps(report, indent=2) + "\n")
    table = markdown(report)
    (directory / "export_report.md").write_text(table)
    return table


def markdown(report):
    lines = [
        f"# Export report: {report['model']}",
        "",
        f"Held-out images: {report['num_eval']} ({report['eval_source']}); reference: {report['reference']}; "
        f"latency: {report['latency_note']}.",
        "",
        "| " + " | ".join(title for _, title in COLUMNS) + " |",
        "|---|" + "---:|" * (len(COLUMNS) - 1),  # numbers right-aligned
    ]
    for row in report["artifacts"]:
        cells = []
        for key, _ in COLUMNS:
            value = row.get(key)
            if value is None:
                cells.append("-")
            elif key in ("top1", "agreement"):
                cells.append(f"{100 * value:.2f}%")
            elif key == "max_prob_diff":
                cells.append(f"{value:.2e}")
            elif key == "latency_ms":
                cells.append(f"{value:.3f}")
            else:
                cells.append(str(value))
        lines.append("| " + " | ".join(cells) + " |")
    # A .tflite file with int8 or int16 input/output (`--io-type`): MediaPipe refuses it.
    unready = [
        f"{r['artifact']} ({r['io_type']} input/output)"
        for r in report["artifacts"]
        if r.get("mediapipe_ready") is False
    ]
    if unready:
        them = "it" if len(unready) == 1 else "them"
        lines += ["", f"Not {FOR_MEDIAPIPE}: {', '.join(unready)}; run {them} on LiteRT's interpreter."]
    return "\n".join(lines) + "\n"


def _size(directory):
    return sum(p.stat().st_size for p in Path(directory).rglob("*") if p.is_file())
