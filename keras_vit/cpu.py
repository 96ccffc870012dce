"""What this machine's CPU offers, as Linux's /proc/cpuinfo lists it."""

import platform
from pathlib import Path


def _first_processor():
    """The fields of /proc/cpuinfo's first processor as a dict; None where it cannot be read
    (not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    fields = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_flags():
    """The CPU's feature flags (x86 `flags`, Arm `Features`) as a set; None where
    /proc/cpuinfo cannot be read (not Linux)."""
    fields = _first_processor()
    if fields is None:
        return None
    return set((fields.get("flags") or fields.get("Features") or "").split())


def cpu_name():
    """The CPU's name with its x86 family and model where Linux lists them ("AMD EPYC, family 25
    model 1": one marketing name covers several generations); the platform's name elsewhere."""
    fields = _first_processor() or {}
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        return f"{name}, family {fields['cpu family']} model {fields['model']}"
    return name


def has_bf16_instructions():
    """Whether the CPU computes bfloat16 natively: AVX512_BF16 or AMX-BF16 on x86, the BF16
    extension on Arm; None where the flags cannot be read."""
    flags = cpu_flags()
    if flags is None:
        return None
    if platform.machine().lower() in ("aarch64", "arm64"):
        return "bf16" in flags
    return bool(flags & {"avx512_bf16", "amx_bf16"})
