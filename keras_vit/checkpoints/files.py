"""Reading and writing checkpoint files: .npz, .safetensors, torch .pth/.bin, Hugging Face folders.

Everything comes back as float32 (or integer) numpy arrays. Errors name the file and what is
wrong with it (missing, truncated, corrupt, unsupported)."""

import json
import os
import struct
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from keras_vit.names import RUN_CHECKPOINTS


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not fit the model."""


_SAFETENSORS_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}
HF_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def read_tensors(path):
    """Returns `(tensors, hf_config)`: a dict name -> numpy array, and the parsed Hugging Face
    `config.json` when `path` is (or sits in) a Hugging Face model folder, else None."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint not found: {path}")
    hf_config = None
    if path.is_dir():
        hf_config = read_json(path / "config.json")
        found = [path / name for name in HF_WEIGHT_FILES if (path / name).is_file()]
        if not found:
            raise CheckpointError(
                f"{path} is a folder without {' or '.join(HF_WEIGHT_FILES)} (a Hugging Face model) "
                f"or {'/'.join(RUN_CHECKPOINTS)} (a keras-vit training run)."
            )
        path = found[0]
    elif (path.parent / "config.json").is_file() and path.name in HF_WEIGHT_FILES:
        hf_config = read_json(path.parent / "config.json")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return read_npz(path), hf_config
    if suffix == ".safetensors":
        return read_safetensors(path), hf_config
    if suffix in (".pth", ".pt", ".bin"):
        return read_torch(path), hf_config
    raise CheckpointError(
        f"{path}: unsupported checkpoint type {suffix or '(no extension)'}; expected .npz, "
        ".safetensors, .pth/.pt/.bin, .keras, a Hugging Face model folder or a keras-vit run directory."
    )


def read_npz(path):
    """All arrays of an .npz file (never unpickles)."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: _as_float32(archive[name]) for name in archive.files}
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError) as error:
        # NumPy takes a file that is no zip archive (nor .npy) for a pickle, and says so.
        why = "not a zip archive of arrays" if "contains pickled" in str(error) else str(error)
        raise CheckpointError(f"{path}: corrupt or truncated .npz file ({why}).") from None


def read_safetensors(path):
    """All tensors of a .safetensors file, parsed directly (no torch needed)."""
    data = Path(path).read_bytes()
    if len(data) < 8:
        raise CheckpointError(f"{path}: truncated .safetensors file (no header).")
    (header_size,) = struct.unpack("<Q", data[:8])
    if header_size > len(data) - 8:
        raise CheckpointError(f"{path}: truncated or corrupt .safetensors file (header runs past the end).")
    try:
        header = json.loads(data[8 : 8 + header_size])
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CheckpointError(f"{path}: corrupt .safetensors header.") from None
    body = memoryview(data)[8 + header_size :]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        if end > len(body) or start > end:
            raise CheckpointError(f"{path}: truncated .safetensors file (tensor {name!r} is cut off).")
        raw = body[start:end]
        if info["dtype"] == "BF16":  # bfloat16 is the top half of a float32
            array = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] in _SAFETENSORS_DTYPES:
            array = np.frombuffer(raw, _SAFETENSORS_DTYPES[info["dtype"]])
        else:
            raise CheckpointError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']}.")
        if array.size != int(np.prod(info["shape"], dtype=np.int64)):
            raise CheckpointError(f"{path}: tensor {name!r} does not match its declared shape {info['shape']}.")
        tensors[name] = _as_float32(array.reshape(info["shape"]))
    return tensors


def read_torch(path):
    """A torch state dict (`torch.load(weights_only=True)`: tensors only, no code)."""
    try:
        import torch  # a file-format reader, only for .pth/.bin files
    except ImportError:
        raise CheckpointError(f"{path}: reading torch files needs PyTorch; or convert it to .safetensors.") from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many types for bad files
        raise CheckpointError(f"{path}: cannot read torch checkpoint ({type(error).__name__}: {error}).") from None
    for key in ("state_dict", "model", "module"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: expected a state dict, found {type(state).__name__}.")
    return {
        name: _as_float32(value.detach().float().numpy() if value.is_floating_point() else value.numpy())
        for name, value in state.items()
        if hasattr(value, "numpy")
    }


def write_npz(path, tensors):
    """Writes arrays to an .npz file atomically (a temporary file, then a rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".npz.tmp")
    try:
        with os.fdopen(handle, "wb") as f:
            np.savez(f, **tensors)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def _as_float32(array):
    array = np.asarray(array)
    return array.astype(np.float32) if np.issubdtype(array.dtype, np.floating) else array


def read_json(path):
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise CheckpointError(f"{path}: invalid JSON ({error}).") from None
