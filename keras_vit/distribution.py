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


def training_memory(config, batch_per_device, model_parallel=1, remat=False, precision="float32"):
    """Estimated bytes per device to train `config` (a plain, non-hybrid `ViTConfig`) with
    AdamW: `{"state": ..., "activations": ...}`.

    State: weights, gradients and AdamW's two moments, 16 bytes per parameter (float32
    variables under every precision); the blocks' split kernels (see `SHARDED`) count
    1/`model_parallel`. Activations: what the backward pass keeps per example, 4 bytes per
    element (2 under a mixed `precision`, "mixed_bfloat16" or "mixed_float16"): per block the
    two LayerNorms' inputs and outputs (4 x tokens x width, replicated), q, k, v and the
    attention context (4 x tokens x width), the MLP's two hidden activations (2 x tokens x
    mlp_dim) and the attention probabilities (heads x tokens^2), the last three split over the
    model axis; plus the image and the patch embeddings. With `remat` (each block recomputed in
    the backward pass) a block keeps only its input (tokens x width), and one block's count is
    live at a time while it is recomputed."""
    if config.resnet_layers is not None:
        raise ValueError("training_memory covers plain ViTs, not the ResNet hybrid.")
    split, replicated = parameter_counts(config)
    tokens, width = config.num_patches + config.num_prefix_tokens, config.hidden_size
    height, image_width = config.image_size
    sharded = 4 * tokens * width + 2 * tokens * config.mlp_dim + config.num_heads * tokens**2
    block = 4 * tokens * width + sharded / model_parallel
    kept = tokens * width * config.num_layers + block if remat else config.num_layers * block
    elements = kept + config.channels * height * image_width + 2 * tokens * width
    return {
        "state": 16 * (replicated + split / model_parallel),
        "activations": (2 if precision.startswith("mixed") else 4) * elements * batch_per_device,
    }


def parameter_counts(config):
    """(parameters in the kernels and biases that model parallelism splits, all the others)."""
    d, m, layers = config.hidden_size, config.mlp_dim, config.num_layers
    split = layers * (3 * d * d + (3 * d if config.qkv_bias else 0) + d * d + d * m + m + m * d)
    per_block_other = 4 * d + d + d  # two LayerNorms, the attention output's and fc2's biases
    if config.layer_scale_init is not None:
        per_block_other += 2 * d
    patch = config.patch_size[0] * config.patch_size[1] * config.channels * d + d
    prefix = config.num_prefix_tokens  # the class token, and its position embedding
    other = patch + prefix * d + (config.num_patches + prefix) * d + layers * per_block_other + 2 * d
    if config.representation_size:
        other += d * config.representation_size + config.representation_size
        d = config.representation_size
    if config.num_classes:
        other += d * config.num_classes + config.num_classes
    return split, other
