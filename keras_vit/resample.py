"""Resampling learned position embeddings to a new patch grid (paper section 3.2)."""

import numpy as np

from keras_vit.names import POSEMB_INTERPOLATIONS


def resample_position_embeddings(posemb, new_grid, old_grid=None, num_prefix_tokens=1, method="bilinear"):
    """Resizes the 2-D grid of a position embedding; prefix (class-token) slots are kept.

    `method="bilinear"`: half-pixel centres, no antialiasing, the same numbers as
    `torch.nn.functional.interpolate(mode="bilinear", align_corners=False)` and
    `tf.image.resize(method="bilinear", antialias=False)`. `method="bicubic"`: torch's
    `interpolate(mode="bicubic", align_corners=False)` (cubic convolution, a = -0.75, edges
    replicated), what Hugging Face uses. `method="bicubic_antialias"`: torch's
    `interpolate(mode="bicubic", antialias=True)` (PIL's kernel, a = -0.5, widened when
    shrinking, renormalised at the edges), timm's default.

    Args:
        posemb: array `(1, prefix + rows*cols, D)` or `(prefix + rows*cols, D)`.
        new_grid: target `(rows, cols)` or an int for a square grid.
        old_grid: source `(rows, cols)`; inferred when the source grid is square.
        num_prefix_tokens: leading tokens that are not on the grid (1 for the class token).
        method: "bilinear", "bicubic" or "bicubic_antialias".

    Returns:
        float32 array `(1, prefix + new_rows*new_cols, D)`.
    """
    posemb = np.asarray(posemb, dtype=np.float32)
    if posemb.ndim == 2:
        posemb = posemb[None]
    if posemb.ndim != 3 or posemb.shape[0] != 1:
        raise ValueError(f"position embedding must be (1, tokens, D) or (tokens, D); got {posemb.shape}.")
    new_grid = (new_grid, new_grid) if isinstance(new_grid, (int, np.integer)) else tuple(new_grid)
    if len(new_grid) != 2 or not all(isinstance(n, (int, np.integer)) and n > 0 for n in new_grid):
        raise ValueError(f"new_grid must be positive (rows, cols) or one positive int; got {new_grid}.")
    prefix, grid = posemb[:, :num_prefix_tokens], posemb[0, num_prefix_tokens:]
    if old_grid is None:
        side = int(round(np.sqrt(grid.shape[0])))
        if side * side != grid.shape[0]:
            raise ValueError(f"{grid.shape[0]} grid tokens are not a square; pass `old_grid`.")
        old_grid = (side, side)
    old_grid = (old_grid, old_grid) if isinstance(old_grid, (int, np.integer)) else tuple(old_grid)
    if len(old_grid) != 2 or not all(isinstance(n, (int, np.integer)) and n > 0 for n in old_grid):
        raise ValueError(f"old_grid must be positive (rows, cols) or one positive int; got {old_grid}.")
    new_grid, old_grid = tuple(int(n) for n in new_grid), tuple(int(n) for n in old_grid)
    if old_grid[0] * old_grid[1] != grid.shape[0]:
        raise ValueError(f"old_grid {old_grid} does not hold {grid.shape[0]} grid tokens.")
    if old_grid == new_grid:
        return posemb.copy()
    grid = grid.reshape(old_grid + (-1,))
    rows = interpolation_matrix(old_grid[0], new_grid[0], method)
    cols = interpolation_matrix(old_grid[1], new_grid[1], method)
    grid = np.einsum("ir,rcd,jc->ijd", rows, grid, cols)
    grid = grid.reshape(1, new_grid[0] * new_grid[1], -1).astype(np.float32)
    return np.concatenate([prefix, grid], axis=1)


def interpolation_matrix(in_size, out_size, method="bilinear", xp=np):
    """(out_size, in_size) matrix of 1-D interpolation with half-pixel centres.

    `xp`: `numpy` (float64, the default) or `keras.ops` (float32), for a size known only when a
    model runs (`out_size` may then be a scalar tensor). Every method is written as a dense
    matrix, the same numbers in both."""
    if method not in POSEMB_INTERPOLATIONS:
        raise ValueError(f"unknown interpolation {method!r}; choose from {', '.join(POSEMB_INTERPOLATIONS)}.")
    dtype = "float64" if xp is np else "float32"
    out = xp.arange(out_size, dtype=dtype)[:, None]  # output positions, a column
    source = xp.arange(in_size, dtype=dtype)[None, :]  # input positions, a row
    scale = in_size / as_float(xp, out_size, dtype)
    if method == "bicubic_antialias":
        # PIL's filter (torch's antialiased bicubic): the a = -0.5 kernel stretched by the shrink
        # factor, cut at the edges and renormalised. PIL's tap window [centre - support,
        # centre + support) holds every input whose kernel weight is non-zero.
        stretch = xp.maximum(scale, 1.0)
        weights = cubic((source + 0.5 - (out + 0.5) * scale) / stretch, a=-0.5, xp=xp)
        return weights / xp.sum(weights, axis=1, keepdims=True)
    position = (out + 0.5) * scale - 0.5
    if method == "bicubic":  # four neighbours, indices clamped at the edges (torch's upsample_bicubic2d)
        low = xp.floor(position)
        weights = 0.0
        for offset in (-1.0, 0.0, 1.0, 2.0):
            tap = xp.clip(low + offset, 0.0, in_size - 1.0)
            hit = xp.where(xp.equal(tap, source), 1.0, 0.0)
            weights = weights + hit * cubic(position - (low + offset), xp=xp)
        return weights
    position = xp.clip(position, 0.0, in_size - 1.0)  # bilinear: the triangle kernel, edges held
    return xp.maximum(1.0 - xp.abs(position - source), 0.0)


def cubic(x, a=-0.75, xp=np):
    """Keys' cubic convolution kernel at distances `x` (zero from 2 on)."""
    x = xp.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return xp.where(x <= 1, near, xp.where(x < 2, far, 0.0))


def as_float(xp, value, dtype):
    """`value` (a Python number, or a scalar tensor for `keras.ops`) as a float of `dtype`."""
    return np.asarray(value, dtype) if xp is np else xp.cast(value, dtype)
