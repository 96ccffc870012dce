"""Model parallelism: how a ViT's variables are laid out over a device mesh.

Megatron-style tensor parallelism for the encoder blocks: the attention's fused qkv projection
and the MLP's first Dense are split over their output columns (biases with them), the attention
output and the MLP's second Dense over their input rows, so each block needs one all-reduce
after attention and one after the MLP. Embeddings, norms, the class token, the hybrid's ResNet
and the head stay replicated. The qkv columns are ordered (q|k|v, then heads), so a split does
not fall on head boundaries; XLA's partitioner moves the slices where the attention needs them.
"""

import keras

# Variable path patterns (`re.fullmatch` against `variable.path`) -> the mesh axis per dimension;
# "model" stands for the model-parallel axis. Everything else is replicated.
SHARDED = {
    r".*attention/qkv/kernel": (None, "model"),
    r".*attention/qkv/bias": ("model",),
    r".*attention/out/kernel": ("model", None),
    r".*mlp/fc1/kernel": (None, "model"),
    r".*mlp/fc1/bias": ("model",),
    r".*mlp/fc2/kernel": ("model", None),
}


def get_layout_map(device_mesh, model_parallel_dim_name="model", data_parallel_dim_name="batch"):
    """A `keras.distribution.LayoutMap` for every ViT variant on `device_mesh`.

    Use it with `keras.distribution.ModelParallel(layout_map=..., batch_dim_name=...)`; the
    mesh's `model_parallel_dim_name` axis splits the blocks' kernels (see the module docstring),
    and its size must divide `hidden_size` and `mlp_dim` (see `check_model_parallel`).
    `data_parallel_dim_name` names the axis the batch is split over; it only has to exist.
    """
    axes = tuple(device_mesh.axis_names)
    for name in (model_parallel_dim_name, data_parallel_dim_name):
        if name not in axes:
            raise ValueError(f"the device mesh has axes {axes}; it has no axis {name!r}.")
    layout_map = keras.distribution.LayoutMap(device_mesh)
    for pattern, dims in SHARDED.items():
        layout_map[pattern] = tuple(model_parallel_dim_name if d == "model" else d for d in dims)
    return layout_map


def check_model_parallel(config, ways):
    """Raises a clear ValueError when `config` (a `ViTConfig`) cannot be split `ways` ways."""
    for field in ("hidden_size", "mlp_dim"):
        if getattr(config, field) % ways:
            raise ValueError(
                f"model parallel over {ways} devices needs {field} divisible by {ways}; "
                f"this model has {field}={getattr(config, field)}."
            )
