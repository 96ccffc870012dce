"""Timing: thread pinning, warm-up, the median of repeats, contenders timed in rounds (with the
FMA peak probed beside them)."""

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


def rate(step, items, min_seconds=0.0):
    """Items per second of one timed run of `step()` (which processes `items` items), repeated
    until the run lasts `min_seconds`."""
    count, start = 0, time.perf_counter()
    while True:
        step()
        count += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return count * items / elapsed


def repeated_rates(step, items, repeats=5, warmup=1, min_seconds=0.0):
    """Items per second of `step()` in each of `repeats` timed runs (see `rate`), after
    `warmup` untimed calls."""
    for _ in range(warmup):
        step()
    return [rate(step, items, min_seconds) for _ in range(repeats)]


def interleaved_rounds(measures, repeats, warmup=1):
    """The `repeats` results of each zero-argument `measures[i]()` (a list per measure),
    measured in rounds that call every measure once (after `warmup` untimed rounds). Load that
    comes and goes on a shared machine then falls on all contenders alike instead of on
    whichever ran during it, so their ratios hold still. Every other round runs in reverse
    order, so no contender always runs first or right after the same one."""
    results = [[] for _ in measures]
    for round_ in range(warmup + repeats):
        order = list(zip(results, measures))
        for result, measure in order if round_ % 2 == 0 else reversed(order):
            value = measure()
            if round_ >= warmup:
                result.append(value)
    return results


def median_and_spread(values):
    """(median, spread) of timed repeats; the spread, (max - min) / median, shows how much the
    machine's load moved them."""
    middle = statistics.median(values)
    return middle, (max(values) - min(values)) / middle


def throughput_rows(rows, measures, repeats, gflop_per_item, log, warmup=1, peak_probe=None):
    """Times `measures[i]()` (items/s of `rows[i]`'s contender) in rounds (`interleaved_rounds`)
    and adds to each row its median `images_per_s`, `spread` and `gflops_per_s`. `peak_probe`
    (`machine.fma_probe`), where given, runs in every round too, and each row gets `peak_share`,
    the median over rounds of its GFLOP/s over the probe's in that round, and the probe's median
    `fp32_peak_gflops`: a peak probed once per run read 176 to 205 GFLOP/s an hour apart on a
    shared machine, while each round sees the load its contenders see. `log` gets each row."""
    rounds = interleaved_rounds(list(measures) + ([peak_probe] if peak_probe else []), repeats, warmup)
    peaks = rounds[-1] if peak_probe else None
    for row, rates in zip(rows, rounds):
        images_per_s, spread = median_and_spread(rates)
        row.update(images_per_s=images_per_s, spread=spread, gflops_per_s=gflop_per_item * images_per_s)
        if peaks:
            row["peak_share"] = statistics.median(gflop_per_item * r / p for r, p in zip(rates, peaks))
            row["fp32_peak_gflops"] = statistics.median(peaks)
        log(row)
    return rows


def seconds(call):
    """(wall seconds of `call()`, its result)."""
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result
