"""What this machine's CPU offers, as Linux's /proc/cpuinfo lists it."""

import platform
from pathlib import Path


def cpu_flags():
    """The CPU's feature flags (x86 `flags`, Arm `Features`) as a set; None where
    /proc/cpuinfo cannot be read (not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    return {word for line in text.splitlines() if line.split(":")[0].strip() in ("flags", "Features")
            for word in line.split(":", 1)[1].split()}  # fmt: skip


def has_bf16_instructions():
    """Whether the CPU computes bfloat16 natively: AVX512_BF16 or AMX-BF16 on x86, the BF16
    extension on Arm; None where the flags cannot be read."""
    flags = cpu_flags()
    if flags is None:
        return None
    if platform.machine().lower() in ("aarch64", "arm64"):
        return "bf16" in flags
    return bool(flags & {"avx512_bf16", "amx_bf16"})
