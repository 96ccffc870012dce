"""Timing: thread pinning, warm-up, the median of repeats."""

import importlib.util
import os
import statistics
import sys
import time


def pin_threads(threads):
    """Limits TensorFlow, XLA, oneDNN/OpenMP and torch in this process to `threads` CPU
    threads on `threads` cores. TensorFlow takes its thread counts when its first op runs:
    call this before running anything."""
    for name in ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = str(threads)
    os.environ["TF_NUM_INTEROP_THREADS"] = "1"
    if hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) > threads:
            os.sched_setaffinity(0, cores[:threads])
    if "tensorflow" in sys.modules:
        import tensorflow as tf

        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(1)
        except RuntimeError:  # already running: the counts it started with stay
            pass
    if importlib.util.find_spec("torch") is not None:
        import torch

        torch.set_num_threads(threads)


def median_rate(step, items, repeats=5, warmup=1, min_seconds=0.0):
    """Items per second of `step()` (which processes `items` items): `warmup` calls are not
    timed, then the median over `repeats` timed calls (each call repeated until it lasts
    `min_seconds`). Returns (median rate, list of rates)."""
    for _ in range(warmup):
        step()
    rates = []
    for _ in range(repeats):
        count, start = 0, time.perf_counter()
        while True:
            step()
            count += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_seconds:
                break
        rates.append(count * items / elapsed)
    return statistics.median(rates), rates


def seconds(call):
    """(wall seconds of `call()`, its result)."""
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result
