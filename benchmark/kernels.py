"""oneDNN kernel profiles of the suite's CPU rows (`keras-vit benchmark --kernels`): for one
step of a row, which primitive and implementation ran each oneDNN op (`brgemm:avx512_core_amx`
is an AMX kernel, `x64:gemm:jit` oneDNN's GEMM), on which data type, and for how long. They
tell whether the bf16 tiles ran, which ops stayed float32 and which reorders ran on every call.

oneDNN reports this under `ONEDNN_VERBOSE=1`, which TensorFlow reads once, when it starts. So a
Keras row is profiled in a fresh process that builds the row's model as the suite does, runs two
warm-up steps, then profiles one; a timm row's oneDNN is switched on around one call of its timed
step in the case's process (`torch.backends.mkldnn.verbose`). Profiles are taken after a
case's timed rounds, so the figures carry no logging cost, and the Keras rows' processes start
once the case has ended, so their models never add to the case's.
"""

import contextlib
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

START, END = "keras_vit.kernels: start", "keras_vit.kernels: end"
WARMUP_STEPS = 2
TIMEOUT_S = 1800


class Profiler:
    """oneDNN profiles of a case's rows (each a dict, see `summarize`, or `{"error": ...}`).
    `profiler(case, row, measure)` profiles a timm row around one call of `measure` (its timed
    step, `steps_per_repeat` steps for training) in this process, while the case's models are
    loaded; for a Keras row it returns None. `profiler.keras_rows(case, rows)` then profiles the
    Keras rows, each in a fresh process with `threads` threads: call it once the case's models
    are gone, so that a profile's model never shares the memory with them (a ViT-B/16 case's
    models take most of a 24 GiB machine)."""

    def __init__(self, kind, threads):
        self.kind, self.threads = kind, threads

    def __call__(self, case, row, measure):
        if row["implementation"] != "timm":
            return None
        return _guarded(_in_process, measure, case.get("steps_per_repeat", 1))

    def keras_rows(self, case, rows):
        """Adds its profile to each row of `rows` that is not timm's and has none yet (a server
        runtime's row has its runtime's own)."""
        for row in rows:
            if row["implementation"] != "timm" and "kernels" not in row:
                row["kernels"] = _guarded(_in_subprocess, self.kind, case, row, self.threads)


def profiled(rows, measures, case, profile):
    """`rows`, each timm row with its `kernels` profile (`profile(case, row, measure)`) where
    `profile` is given; the Keras rows' come after the case (`Profiler.keras_rows`)."""
    for row, measure in zip(rows, measures) if profile else ():
        kernels = profile(case, row, measure)
        if kernels is not None:
            row["kernels"] = kernels
    return rows


def _guarded(profile, *args):
    """`profile(*args)`, or `{"error": ...}` where it failed: a failed profile leaves the timed
    row as it is."""
    try:
        return profile(*args)
    except Exception as error:
        return dict(error=f"{type(error).__name__}: {error}".strip())


def parse(text):
    """The `exec` records of oneDNN verbose output: dicts of primitive, implementation,
    prop_kind, dtype (the source's; `src>dst` for reorders), shape and ms."""
    records = []
    for line in text.splitlines():
        fields = line.strip().split(",")
        if fields[0] not in ("onednn_verbose", "dnnl_verbose") or "exec" not in fields[1:4]:
            continue
        at = fields.index("exec")
        if "graph" in fields[:at] or len(fields) < at + 7:  # oneDNN Graph partitions: not primitives
            continue
        try:
            ms = float(fields[-1])
        except ValueError:
            continue
        types = _data_types(fields[at + 5])
        if fields[at + 2] == "reorder":
            dtype = f"{types.get('src', '?')}>{types.get('dst', '?')}"
        else:  # the source's, or for a backward primitive the incoming gradient's
            dtype = types.get("src") or types.get("diff_dst") or next(iter(types.values()), None)
        records.append(
            dict(
                primitive=fields[at + 2],
                implementation=fields[at + 3],
                prop_kind=fields[at + 4],
                dtype=dtype or "?",
                shape=fields[-2],
                ms=ms,
            )
        )
    return records


def _data_types(descriptors):
    """{"src": "bf16", "wei": "bf16", ...} of a verbose line's memory descriptors."""
    types = {}
    for descriptor in descriptors.split():
        name, _, rest = descriptor.partition(":")
        if rest.startswith(":") and "_" in name:  # gemm_api's `src_f32::blocked:ab:f0`
            name, rest = name.rsplit("_", 1)
        types[name] = rest.split(":")[0]
    return types


def grouped(records, steps=1):
    """`records` (dicts of primitive, implementation, dtype and ms) grouped by the first three,
    with the calls and ms per step of each group, slowest first."""
    groups = {}
    for record in records:
        key = (record["primitive"], record["implementation"], record["dtype"])
        group = groups.setdefault(key, dict(zip(("primitive", "implementation", "dtype"), key), calls=0, ms=0.0))
        group["calls"] += 1
        group["ms"] += record["ms"]
    kernels = sorted(groups.values(), key=lambda g: -g["ms"])
    for group in kernels:
        group["calls"] = round(group["calls"] / steps)
        group["ms"] /= steps
    return kernels


def summarize(records, steps=1, step_ms=None):
    """A profile: `onednn_ms` per step, `step_ms` (the profiled step's wall time, where given),
    `amx` (whether an AMX kernel ran) and `kernels`: per primitive, implementation and data type,
    the calls and ms per step, slowest first (`grouped`)."""
    kernels = grouped(records, steps)
    profile = dict(onednn_ms=sum(g["ms"] for g in kernels), amx=any("amx" in g["implementation"] for g in kernels))
    if step_ms is not None:
        profile["step_ms"] = step_ms
    profile["kernels"] = kernels
    return profile


def _in_subprocess(kind, case, row, threads):
    spec = dict(kind=kind, case=case, row={k: row.get(k) for k in ("implementation", "mode", "compiler")})
    spec["threads"] = threads
    done = subprocess.run(
        [sys.executable, "-m", "keras_vit.benchmark.kernels", json.dumps(spec)],
        env=dict(os.environ, ONEDNN_VERBOSE="1"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    lines = done.stdout.splitlines()
    ends = [i for i, line in enumerate(lines) if line.startswith(END)]
    starts = [i for i, line in enumerate(lines) if line == START]
    if done.returncode or not ends or not starts:
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return dict(error=f"the profiling run failed: {last}")
    step_ms = float(lines[ends[-1]].split()[-1])
    return summarize(parse("\n".join(lines[starts[-1] + 1 : ends[-1]])), 1, step_ms)


def _in_process(call, steps):
    """The profile of one `call()` that runs `steps` steps on torch, oneDNN's verbose output
    caught from file descriptor 1 while it runs."""
    import torch

    with _stdout_caught() as caught, torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
        start = time.perf_counter()
        call()
        seconds = time.perf_counter() - start
    return summarize(parse("".join(caught)), steps, seconds * 1e3 / steps)


@contextlib.contextmanager
def _stdout_caught():
    """Redirects file descriptor 1 (where oneDNN prints) to a temporary file; yields a list
    that holds what was written once the block has ended."""
    caught = []
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as file:
        os.dup2(file.fileno(), 1)
        try:
            yield caught
        finally:
            with contextlib.suppress(OSError, AttributeError):  # C's stdio buffer, where there is a libc
                ctypes.CDLL(None).fflush(None)
            os.dup2(saved, 1)
            os.close(saved)
            file.seek(0)
            caught.append(file.read().decode(errors="replace"))


def _keras_step(kind, case, row):
    """One step of a Keras row, built as the suite builds it: a forward of the case's batch
    (inference), a `train_on_batch` of `model.fit`'s compiled step (training) or a call of the
    SavedModel's serving signature (serving)."""
    import keras
    import numpy as np

    from keras_vit.benchmark import inference, models, serving, training

    config = models.config_for(case["model"])
    batch = case["batch"]
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 255, (batch,) + tuple(config.image_size) + (config.channels,)).astype("float32")
    if kind == "serving":
        folder = tempfile.TemporaryDirectory()  # held by the step: the SavedModel's files stay while it runs
        runner = serving.SavedModelRunner(models.build_keras_vit(config), row["mode"], Path(folder.name) / "model")
        return lambda folder=folder: runner.predict(images)
    build = models.build_keras_vit if row["implementation"] == "keras_vit" else models.build_keras_hub
    model = build(config, dtype=row["mode"])
    if kind == "inference":
        return inference.keras_forward(model, row["compiler"], keras.ops.convert_to_tensor(images))[0]
    optimizer = training.adamw(row["implementation"])
    training.keras_training(model, batch, 1, optimizer, jit_compile=row.get("compiler", "xla") == "xla")
    labels = rng.integers(0, max(config.num_classes, 1), batch)
    return lambda: model.train_on_batch(images, labels)


def main(argv=None):
    """The profiling run of one Keras row (started by `Profiler` with ONEDNN_VERBOSE=1): the
    row's spec as JSON in argv; oneDNN's lines of one step between START and END (END carries
    the step's wall ms)."""
    spec = json.loads((sys.argv[1:] if argv is None else argv)[0])
    from keras_vit.benchmark.timing import pin_threads

    pin_threads(spec["threads"])
    step = _keras_step(spec["kind"], spec["case"], spec["row"])
    for _ in range(WARMUP_STEPS):
        step()
    print(START, flush=True)
    start = time.perf_counter()
    step()
    print(f"{END} {(time.perf_counter() - start) * 1e3:.3f}", flush=True)


if __name__ == "__main__":
    main()
