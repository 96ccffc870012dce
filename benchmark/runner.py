"""`run_suite`: every case of a suite, with the machine, versions, targets."""

import datetime
import importlib
import json
import tempfile
from pathlib import Path

from keras_vit.benchmark import accelerator, machine, suite
from keras_vit.benchmark.kernels import Profiler

COMPETITORS = ("keras-hub", "timm")
PACKAGES = (
    "keras",
    "tensorflow-cpu",
    "tensorflow",
    "jax",
    "keras-hub",
    "torch",
    "timm",
    "ai-edge-litert",
    "onnxruntime",
    "openvino",
)


def run_suite(
    name="quick",
    against=COMPETITORS,
    kinds=suite.KINDS,
    repeats=5,
    threads=2,
    out=None,
    log=print,
    cases=None,
    precisions=suite.BOTH,
    kernels=False,
    isolate=False,
    quiet=True,
):
    """Runs suite `name` ("quick", "full" or "gpu") on the current Keras backend; returns the result
    dict (and writes it as JSON to `out`). `cases`: strings, of which a case's name must contain one
    (None: every case); `precisions`: the subset of float32 and mixed_bfloat16 to run (timm's
    "*_bf16" modes count as mixed_bfloat16); `kernels`: give each CPU inference and training row
    its oneDNN kernel profile (`kernels.Profiler`); `isolate`: on the CPU, run each inference and
    training case in a fresh process (`isolated.run_case`), which drops TensorFlow's retracing
    warnings when `quiet` (`quiet_retracing`). `log` gets each result row as it is measured and
    each note (a string) on what was left out. Call `timing.pin_threads(threads)` before Keras is
    imported for the thread count to hold."""
    import keras

    if name not in suite.SUITES:
        raise ValueError(f"unknown suite {name!r}; choose from {', '.join(suite.SUITES)}.")
    unknown = [a for a in against if a not in COMPETITORS]
    if unknown:
        raise ValueError(f"unknown implementation {unknown[0]!r} in --against; choose from {', '.join(COMPETITORS)}.")
    if repeats < 5:
        raise ValueError(f"repeats must be at least 5 (the median of >= 5 timed runs); got {repeats}.")
    if out is not None:
        _check_writable(out)
    backend = keras.backend.backend()
    if name == "gpu" and not accelerator.has_gpu(backend):
        raise ValueError(
            f"the gpu suite (batch 256, B/16 training) is for a GPU, under KERAS_BACKEND=jax; Keras's {backend} "
            "backend sees none here: run the quick or full suite."
        )
    if backend != "tensorflow":  # LiteRT, the exporters and the tf.data pipeline need TensorFlow
        kinds = tuple(k for k in kinds if k in ("inference", "training"))
    selected = suite.select(name, kinds, cases, precisions)  # a ValueError where the filters leave nothing
    probe = machine.fma_probe(threads)  # compiled once: the machine record's peak, then the rounds'
    info = machine.describe(threads, backend, probe)
    result = dict(
        suite=name,
        backend=backend,
        date=datetime.date.today().isoformat(),
        machine=info,
        versions=machine.versions(*PACKAGES),
        repeats=repeats,
        results={},
        notes=[],
        failed=[],
        cases=None if cases is None else list(cases),
        precisions=list(precisions),
    )
    bf16_timm = "timm" in against and "mixed_bfloat16" in precisions
    timm_modes = _timm_modes(result["notes"], log) if bf16_timm else lambda mode: True
    # on the CPU, throughput rows are set against an FMA peak probed in the same rounds
    peak_probe = None if info["accelerator"] else probe
    if kernels and info["accelerator"]:
        result["notes"].append("oneDNN kernel profiles (--kernels) are of CPU rows; this run's rows ran on the GPU.")
        log(result["notes"][-1])
    profiles = kernels and not info["accelerator"]
    for kind in selected:
        module = importlib.import_module(f"keras_vit.benchmark.{kind}")
        throughput = kind in suite.THROUGHPUT_KINDS
        in_child = isolate and throughput and not info["accelerator"]
        profile = Profiler(kind, threads) if profiles and throughput else None
        extra = dict(peak_probe=peak_probe, profile=profile) if throughput else {}
        rows = result["results"][kind] = []
        for case in selected.get(kind, []):
            if "timm_modes" in case:
                case = {**case, "timm_modes": tuple(m for m in case["timm_modes"] if timm_modes(m))}
            if in_child:
                from keras_vit.benchmark import isolated  # not at the top: `python -m` runs it as the child

                peak = peak_probe is not None
                try:
                    case_rows = isolated.run_case(kind, case, against, repeats, threads, log, peak, profiles, quiet)
                except isolated.CaseFailed as error:  # the other cases still run, and their results are kept
                    result["failed"].append(dict(case=case["name"], error=str(error)))
                    result["notes"].append(f"not measured: {error}")
                    log(result["notes"][-1])
                    case_rows = []
            else:
                case_rows = module.run_case(case, tuple(against), repeats, log, **extra)
            if profile is not None and case_rows:  # the case's models are gone: Keras rows in fresh processes
                profile.keras_rows(case, case_rows)
            rows += case_rows
            _write(out, result, name, info)
        gpu = info["accelerator"]
        if gpu:  # model-FLOPs utilisation, against the measured bf16 matmul rate and the datasheet's
            for row in rows:
                row["mfu"] = row["gflops_per_s"] / 1e3 / gpu["bf16_matmul_tflops"]
                if gpu.get("datasheet_bf16_tflops"):
                    row["mfu_datasheet"] = row["gflops_per_s"] / 1e3 / gpu["datasheet_bf16_tflops"]
    _write(out, result, name, info)
    return result


def _write(out, result, name, info):
    """Sets the result's targets from the rows measured so far and writes it to `out` (if given):
    after every case, so that a run stopped part-way keeps what it measured."""
    cpu_peak = None if info["accelerator"] else info["fp32_fma_peak_gflops"]  # the rows ran on the GPU
    result["targets"] = suite.targets(result["results"], name, cpu_peak)
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=2) + "\n")


def quiet_retracing():
    """Drops TensorFlow's warning of frequent tf.function retracing: a suite builds many models
    of one class, each tracing Keras's predict step, by design; nothing for the user to act on."""
    import logging

    logging.getLogger("tensorflow").addFilter(lambda record: "tf.function retracing" not in record.getMessage())


def _timm_modes(notes, log):
    """A filter of timm's modes: its bfloat16 modes are left out, with a note, where torch's
    CPU bfloat16 matmul runs at under a quarter of its float32 rate (no bf16 instructions: a
    full suite's timm bf16 rows alone would take hours)."""
    rates = machine.torch_cpu_matmul_gflops()
    if not rates or rates["bfloat16"] >= rates["float32"] / 4:
        return lambda mode: True
    notes.append(
        f"timm's bfloat16 modes left out: torch's bfloat16 matmul ran at {rates['bfloat16']:.1f} GFLOP/s "
        f"on this CPU against {rates['float32']:.0f} GFLOP/s in float32 (no bfloat16 instructions)."
    )
    log(notes[-1])
    return lambda mode: not mode.endswith("_bf16")


def _check_writable(out):
    """Creates the folder of `out` and checks that a file can be written there: before the
    suite's timing (48 minutes for `full` on 2 cores), not after it."""
    out, folder = Path(out), Path(out).parent
    if out.is_dir():
        raise ValueError(f"{out} is a folder; give the results file, e.g. {out / 'results.json'}.")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise ValueError(f"cannot write the results to {out}: {error.strerror or error}.") from None
