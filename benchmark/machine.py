"""The machine a benchmark ran on: CPU, threads, library versions, measured FP32 FMA peak, GPU."""

import ctypes
import os
import platform
import shutil
import subprocess
import tempfile
import time
from importlib import metadata
from pathlib import Path

from keras_vit.benchmark import accelerator, timing
from keras_vit.cpu import cpu_flags, cpu_name

# Twelve independent FMA chains per thread keep both FMA pipes busy despite the 4-cycle
# latency; the result is summed and returned so the compiler cannot drop the loop.
_FMA_SOURCE = r"""
#include <immintrin.h>
#include <omp.h>
#define CHAINS 12
double fma_flops(long iterations, int threads) {
    float total = 0.0f;
    #pragma omp parallel num_threads(threads) reduction(+:total)
    {
        VEC acc[CHAINS];
        VEC m = SET1(0.999999f), c = SET1(1e-7f);
        for (int j = 0; j < CHAINS; j++) acc[j] = SET1((float)j);
        for (long i = 0; i < iterations; i++)
            for (int j = 0; j < CHAINS; j++) acc[j] = FMA(acc[j], m, c);
        float lanes[LANES];
        for (int j = 0; j < CHAINS; j++) { STORE(lanes, acc[j]); total += lanes[0]; }
    }
    return (double)total;
}
"""
_ISAS = {
    "avx512f": dict(
        VEC="__m512",
        SET1="_mm512_set1_ps",
        FMA="_mm512_fmadd_ps",
        STORE="_mm512_storeu_ps",
        LANES=16,
        flags=["-mavx512f"],
    ),
    "avx2": dict(
        VEC="__m256",
        SET1="_mm256_set1_ps",
        FMA="_mm256_fmadd_ps",
        STORE="_mm256_storeu_ps",
        LANES=8,
        flags=["-mavx2", "-mfma"],
    ),
}


def fma_probe(threads, seconds=0.5):
    """A zero-argument callable that runs a small C kernel of FP32 FMAs (compiled once with the
    system's C compiler) on `threads` cores for about `seconds` and returns its GFLOP/s (an FMA
    counts 2 FLOPs); None when there is no compiler or the CPU has neither AVX-512 nor AVX2."""
    isa = next((name for name in _ISAS if name in (cpu_flags() or ())), None)
    compiler = shutil.which("cc") or shutil.which("gcc")
    if isa is None or compiler is None:
        return None
    spec = _ISAS[isa]
    with tempfile.TemporaryDirectory() as folder:
        source, library = Path(folder, "fma.c"), Path(folder, "fma.so")
        defines = "".join(f"#define {k} {v}\n" for k, v in spec.items() if k != "flags")
        source.write_text(defines + _FMA_SOURCE)
        build = [
            compiler,
            "-O3",
            "-funroll-loops",
            "-shared",
            "-fPIC",
            "-fopenmp",
            *spec["flags"],
            str(source),
            "-o",
            str(library),
        ]
        if subprocess.run(build, capture_output=True).returncode:
            return None
        kernel = ctypes.CDLL(str(library)).fma_flops  # stays loaded after the folder goes
    kernel.argtypes, kernel.restype = [ctypes.c_long, ctypes.c_int], ctypes.c_double
    flops_per_iteration = 12 * spec["LANES"] * 2 * threads
    iterations = 1_000_000
    while True:  # grow until one call lasts `seconds`
        elapsed, _ = timing.seconds(lambda n=iterations: kernel(n, threads))
        if elapsed >= seconds:
            break
        iterations = int(iterations * min(10.0, 1.2 * seconds / max(elapsed, 1e-6)))
    return lambda: iterations * flops_per_iteration / timing.seconds(lambda: kernel(iterations, threads))[0] / 1e9


def fma_peak_gflops(threads, seconds=0.5, probe=None):
    """Measured FP32 FMA throughput of `threads` cores in GFLOP/s, the best of three runs of
    `probe` (default: a new `fma_probe`); None where there is no probe."""
    probe = probe or fma_probe(threads, seconds)
    return None if probe is None else max(probe() for _ in range(3))


def torch_cpu_matmul_gflops(size=256, repeats=5):
    """{"float32": GFLOP/s, "bfloat16": GFLOP/s} of torch's `size`-cubed matmul on the CPU (the
    best of `repeats`), or None when torch is missing or sees a GPU. Where the CPU has no
    bfloat16 instructions for oneDNN, torch falls back to a scalar kernel: on 2 AVX2-only Zen 3
    cores its ViT-sized bf16 matmul ran at about 1 GFLOP/s against 130 in float32."""
    try:
        import torch
    except ImportError:
        return None
    if torch.cuda.is_available():
        return None
    rates = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = (torch.randn(size, size).to(dtype) for _ in range(2))
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            torch.matmul(a, b)
            best = min(best, time.perf_counter() - start)
        rates[str(dtype).removeprefix("torch.")] = 2 * size**3 / best / 1e9
    return rates


def versions(*packages):
    """Installed versions of `packages` (absent ones left out)."""
    found = {}
    for name in packages:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def describe(threads, backend=None, peak_probe=None):
    """What `docs/benchmarks.md` records about the machine: the CPU (its FMA peak measured with
    `peak_probe`, an `fma_probe` already compiled, where given), and the GPU that the Keras
    `backend` runs on (None without one)."""
    flags = cpu_flags() or set()
    return {
        "accelerator": accelerator.describe(backend),
        "cpu": cpu_name(),
        "cores_visible": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "threads": threads,
        "isa": [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16") if f in flags],
        "fp32_fma_peak_gflops": fma_peak_gflops(threads, probe=peak_probe),
        "python": platform.python_version(),
    }
