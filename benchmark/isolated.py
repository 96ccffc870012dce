"""One benchmark case in a fresh Python process (`run_case`).

A process keeps much of what a case allocated after its models are gone: TensorFlow the
function libraries and kernels of the graphs it ran (ViT-S/16's inference case left 2.8 GiB
behind after `gc.collect()`, `keras.backend.clear_session()` and `torch._dynamo.reset()`, on 2
cores of an AMX Xeon with 24 GiB), so a CPU `full` suite in one process ran out of memory in
the ViT-B/16 case. Each case in a process of its own starts from an empty one.
"""

import importlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path


class CaseFailed(RuntimeError):
    """A case's process ended with an error or was killed: the case has no rows."""


def run_case(kind, case, against, repeats, threads, log, peak=False, kernels=False, quiet=True):
    """`keras_vit.benchmark.<kind>.run_case(case, against, repeats, ...)` run in a child process
    pinned to `threads` threads; its rows, and each row and note it logged passed to `log` once
    the case has ended; `CaseFailed` where the process failed. `peak`: probe the FMA peak in its
    rounds; `kernels`: profile timm's rows there (`kernels.Profiler`; the caller profiles the Keras
    rows); `quiet`: drop TensorFlow's retracing warnings there (`runner.quiet_retracing`)."""
    spec = dict(kind=kind, case=case, against=list(against), repeats=repeats, threads=threads)
    spec.update(peak=peak, kernels=kernels, quiet=quiet)
    with tempfile.TemporaryDirectory() as folder:
        spec_file, out = Path(folder) / "spec.json", Path(folder) / "rows.json"
        spec_file.write_text(json.dumps(spec))
        done = subprocess.run([sys.executable, "-m", "keras_vit.benchmark.isolated", str(spec_file), str(out)])
        if done.returncode:
            killed = " (killed by the system: out of memory?)" if done.returncode in (-9, 137) else ""
            raise CaseFailed(f"the process of the case {case['name']!r} failed with exit {done.returncode}{killed}.")
        result = json.loads(out.read_text())
    for item in result["logged"]:
        log(item)
    return result["rows"]


def main(argv=None):
    """The child: `python -m keras_vit.benchmark.isolated SPEC.json ROWS.json`."""
    spec_file, out = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(spec_file).read_text())
    from keras_vit.benchmark.timing import pin_threads

    pin_threads(spec["threads"])  # before TensorFlow starts
    from keras_vit.benchmark import machine, runner
    from keras_vit.benchmark.kernels import Profiler

    if spec["quiet"]:
        runner.quiet_retracing()
    extra = {}
    if spec["peak"]:
        extra["peak_probe"] = machine.fma_probe(spec["threads"])
    if spec["kernels"]:
        extra["profile"] = Profiler(spec["kind"], spec["threads"])
    module = importlib.import_module(f"keras_vit.benchmark.{spec['kind']}")
    logged = []
    rows = module.run_case(spec["case"], tuple(spec["against"]), spec["repeats"], logged.append, **extra)
    Path(out).write_text(json.dumps(dict(rows=rows, logged=logged)))


if __name__ == "__main__":
    main()
