"""The one place where checkpoint tensors meet a model: every check first, then the writes."""

import logging

import keras
import numpy as np

from keras_vit.checkpoints.files import CheckpointError
from keras_vit.checkpoints.official import GRID_PATH
from keras_vit.names import class_key

logger = logging.getLogger("keras_vit")

POSITION = "position_embedding/embedding"
PATCH_KERNELS = ("patch_embedding/projection/kernel", "resnet/conv_root/kernel")


def assign(model, weights, source, class_names=None):
    """Assigns `{variable path: array}` to `model` or raises `CheckpointError` naming the tensor.

    Policy: a head whose class count differs becomes a fresh zero head, and so does one whose
    classes (`class_names`, the checkpoint's) are others than the model's named ones; the same
    names in another order reorder the head to the model's; a pre-logits layer the model does
    not have is dropped; each is logged in one line. The position embedding is
    resampled to the model's grid; a grayscale model sums the RGB input filters. Nothing is
    written unless every tensor fits.
    """
    weights = dict(weights)
    grid = weights.pop(GRID_PATH, None)
    variables = {v.path: v for v in model.weights}
    notes = []
    _head_policy(model, weights, variables, notes, class_names)
    if "pre_logits/kernel" in weights and "pre_logits/kernel" not in variables:
        weights.pop("pre_logits/kernel"), weights.pop("pre_logits/bias", None)
        notes.append("dropped the checkpoint's pre-logits layer (the model has representation_size=None)")
    for name in PATCH_KERNELS:
        if name in weights and name in variables:
            weights[name] = _adapt_input_channels(weights[name], variables[name].shape[2], name, source)

    if POSITION in weights and POSITION in variables:
        weights[POSITION] = _fold_class_slot(model, weights, grid, notes)
    missing = sorted(set(variables) - set(weights))
    unexpected = sorted(set(weights) - set(variables))
    if missing:
        raise CheckpointError(f"{source}: missing tensor(s) for {_listing(missing)}.")
    if unexpected:
        raise CheckpointError(f"{source}: tensor(s) the model has no place for: {_listing(unexpected)}.")
    values = {}
    for path, variable in variables.items():
        value = np.asarray(weights[path], dtype="float32")
        if path == POSITION:
            value = _position_embedding(model.get_layer("position_embedding"), value, grid, source, notes)
        if tuple(value.shape) != tuple(variable.shape):
            raise CheckpointError(
                f"{source}: tensor for {path!r} has shape {tuple(value.shape)}, "
                f"the model expects {tuple(variable.shape)}."
            )
        values[path] = value
    for path, variable in variables.items():
        variable.assign(values[path])
    if notes:
        logger.warning("keras_vit: %s: %s", source, "; ".join(notes))
    return notes


def export(model):
    """`{variable path: float32 array}` of every weight of `model`."""
    return {v.path: np.asarray(keras.ops.convert_to_numpy(v), dtype="float32") for v in model.weights}


def _fold_class_slot(model, weights, grid, notes):
    """The checkpoint's position embedding, without its class-token slot when the model gives
    its class token none (`no_embed_class`): the slot is added to the class token in `weights`,
    which meets the position embedding nowhere else, so the model computes what the
    checkpoint's does."""
    token, value = "class_token/token", np.asarray(weights[POSITION], "float32")
    if model.config.no_embed_class is False or not model.config.num_class_tokens or token not in weights:
        return value
    value = value.reshape((1,) + value.shape[-2:])
    patches = value.shape[1] - 1
    if patches != (int(np.prod(grid)) if grid is not None else int(round(patches**0.5)) ** 2):
        return value
    weights[token] = np.asarray(weights[token], "float32").reshape(1, 1, -1) + value[:, :1]
    notes.append("the position embedding's class-token slot added to the class token (the model gives it no slot)")
    return value[:, 1:]


def _position_embedding(layer, value, grid, source, notes):
    """The checkpoint's position embedding on the model's grid; a resampling or an added class
    slot is noted (from -> to)."""
    value = value.reshape((1,) + value.shape[-2:])
    try:
        source_grid, prefix = layer.source_grid(value.shape[1], None if grid is None else tuple(np.asarray(grid)))
        resampled = layer.resampled(value, source_grid)
    except ValueError as error:
        raise CheckpointError(f"{source}: position embedding {value.shape}: {error}") from None
    if prefix == 0 and layer.num_prefix_tokens:
        notes.append("zero class-token slot added to the position embedding (the source adds none to the class token)")
    rows, cols = layer.grid_size
    if grid is None and source_grid == layer.grid_size and rows != cols:  # e.g. 2x3 and 3x2 hold as many tokens
        notes.append(
            f"position embedding taken as the model's {rows}x{cols} grid (the checkpoint does not record its grid; "
            "give the image_size it was trained at if that was another shape)"
        )
    if source_grid != layer.grid_size:
        rows, cols = source_grid
        notes.append(
            f"position embedding resampled from a {rows}x{cols} to a {layer.grid_size[0]}x{layer.grid_size[1]} grid"
        )
    return resampled


def _head_policy(model, weights, variables, notes, class_names):
    has_head = "head/kernel" in variables
    if "head/kernel" not in weights:
        if has_head:
            target = tuple(variables["head/kernel"].shape)
            weights["head/kernel"] = np.zeros(target, "float32")
            weights["head/bias"] = np.zeros(target[-1:], "float32")
            notes.append(f"new zero head with {target[-1]} classes (the checkpoint has no head)")
        return
    kernel, bias = weights.pop("head/kernel"), weights.pop("head/bias", None)
    if not has_head:
        notes.append(f"dropped the checkpoint's {kernel.shape[-1]}-class head (the model has num_classes=0)")
        return
    target = tuple(variables["head/kernel"].shape)
    if tuple(kernel.shape) != target:
        why = f"the checkpoint's head is {tuple(kernel.shape)}"
    else:
        order, why = _class_order(class_names, model.class_names)
        if why is None:
            if order is not None:
                kernel, bias = kernel[..., order], None if bias is None else bias[..., order]
                notes.append("the checkpoint's head reordered to the model's class order")
            weights["head/kernel"], weights["head/bias"] = kernel, bias
            return
    weights["head/kernel"] = np.zeros(target, "float32")
    weights["head/bias"] = np.zeros(target[-1:], "float32")
    notes.append(f"new zero head {target} ({why})")


def _class_order(checkpoint_names, model_names, shown=3):
    """`(order, why)` for a head of the right shape: `order` the checkpoint's class indices in the
    model's class order (None: as they are); `why` says why the head cannot be kept (its classes
    are others), else None. Unnamed classes on either side are taken to agree."""
    if checkpoint_names is None or model_names is None:
        return None, None
    checkpoint_names = [class_key(name) for name in checkpoint_names]
    model_names = [class_key(name) for name in model_names]
    if checkpoint_names == model_names:
        return None, None
    if sorted(checkpoint_names) == sorted(model_names) and len(set(model_names)) == len(model_names):
        return [checkpoint_names.index(name) for name in model_names], None
    others = [name for name in checkpoint_names if name not in model_names]
    listed = ", ".join(others[:shown]) + (f" and {len(others) - shown} more" if len(others) > shown else "")
    return None, f"the checkpoint's classes are others: {listed or 'repeated names'} not among the model's"


def _adapt_input_channels(kernel, channels, name, source):
    if kernel.shape[2] == channels:
        return kernel
    if channels == 1 and kernel.shape[2] == 3:  # grayscale: the RGB filters of a gray image add up
        return kernel.sum(axis=2, keepdims=True)
    raise CheckpointError(f"{source}: {name} takes {kernel.shape[2]} input channels, the model {channels}.")


def _listing(names, limit=8):
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
