"""The GPU a benchmark runs on, if any: the torch device timm runs on, the synchronisation
its timings need, and the GPU's measured bfloat16 matmul rate and datasheet peak (what
model-FLOPs utilisation is counted against)."""

import os
import time


def share_gpu():
    """JAX takes 75% of a GPU's memory when it starts, which leaves torch (timm, in the same
    process) too little for batch-256 training: let JAX allocate as it goes instead. Call it
    before JAX runs anything."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def torch_device():
    """ "cuda" when torch sees a GPU, else "cpu". On a GPU, torch's float32 matmuls may then use
    TF32, as JAX's and TensorFlow's do by default, so float32 rows compare like with like."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    torch.set_float32_matmul_precision("high")
    return "cuda"


def has_gpu(backend):
    """Whether Keras's `backend` ("jax", "torch" or "tensorflow") runs on a GPU here."""
    if backend == "jax":
        import jax

        return jax.devices()[0].platform == "gpu"
    if backend == "torch":
        import torch

        return torch.cuda.is_available()
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


def synchronize(device):
    """Waits for the work queued on `device` (torch runs CUDA kernels asynchronously)."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


# Dense bfloat16 tensor-core peaks from NVIDIA's datasheets (TFLOP/s, without sparsity), by a
# part of the device name; the first match counts. MFU is usually quoted against these.
DATASHEET_BF16_TFLOPS = (
    ("H200 NVL", 835.0),
    ("H200", 989.0),
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),
    ("A100", 312.0),
)


def datasheet_bf16_tflops(name):
    """The datasheet's dense bf16 peak of the GPU called `name`, or None for one not listed."""
    return next((peak for part, peak in DATASHEET_BF16_TFLOPS if part in name), None)


def describe(backend, size=8192, rounds=5, per_round=20):
    """{name, bf16_matmul_tflops, datasheet_bf16_tflops} of the GPU the Keras `backend` runs on
    ("jax" or "torch"): the rate of `size`-cubed bfloat16 matmuls (the best of `rounds` rounds
    of `per_round`, after a warm-up that brings the clocks up) and the datasheet's peak (None
    for a GPU not in `DATASHEET_BF16_TFLOPS`); None on a CPU or another backend."""
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        device = jax.devices()[0]
        if device.platform != "gpu":
            return None
        a, b = (jax.random.normal(jax.random.key(i), (size, size), jnp.bfloat16) for i in (0, 1))
        matmul, name = jax.jit(jnp.matmul), device.device_kind

        def run(count):
            for _ in range(count):
                c = matmul(a, b)
            c.block_until_ready()
    elif backend == "torch":
        import torch

        if not torch.cuda.is_available():
            return None
        a, b = (torch.randn(size, size, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        name = torch.cuda.get_device_name()

        def run(count):
            for _ in range(count):
                torch.matmul(a, b)
            torch.cuda.synchronize()
    else:
        return None
    run(3 * per_round)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        run(per_round)
        best = min(best, time.perf_counter() - start)
    return dict(
        name=name,
        bf16_matmul_tflops=2 * size**3 * per_round / best / 1e12,
        datasheet_bf16_tflops=datasheet_bf16_tflops(name),
    )
