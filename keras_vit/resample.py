"""Resampling learned position embeddings to a new patch grid (paper section 3.2)."""

import numpy as np


def resample_position_embeddings(posemb, new_grid, old_grid=None, num_prefix_tokens=1):
    """Resizes the 2-D grid of a position embedding; prefix (class-token) slots are kept.

    Bilinear with half-pixel centres and no antialiasing, the same numbers as
    `torch.nn.functional.interpolate(mode="bilinear", align_corners=False)` and
    `tf.image.resize(method="bilinear", antialias=False)`.

    Args:
        posemb: array `(1, prefix + rows*cols, D)` or `(prefix + rows*cols, D)`.
        new_grid: target `(rows, cols)` or an int for a square grid.
        old_grid: source `(rows, cols)`; inferred when the source grid is square.
        num_prefix_tokens: leading tokens that are not on the grid (1 for the class token).

    Returns:
        float32 array `(1, prefix + new_rows*new_cols, D)`.
    """
    posemb = np.asarray(posemb, dtype=np.float32)
    if posemb.ndim == 2:
        posemb = posemb[None]
    if posemb.ndim != 3 or posemb.shape[0] != 1:
        raise ValueError(f"position embedding must be (1, tokens, D) or (tokens, D); got {posemb.shape}.")
    new_grid = (new_grid, new_grid) if isinstance(new_grid, int) else tuple(new_grid)
    prefix, grid = posemb[:, :num_prefix_tokens], posemb[0, num_prefix_tokens:]
    if old_grid is None:
        side = int(round(np.sqrt(grid.shape[0])))
        if side * side != grid.shape[0]:
            raise ValueError(f"{grid.shape[0]} grid tokens are not a square; pass `old_grid`.")
        old_grid = (side, side)
    old_grid = (old_grid, old_grid) if isinstance(old_grid, int) else tuple(old_grid)
    if old_grid[0] * old_grid[1] != grid.shape[0]:
        raise ValueError(f"old_grid {old_grid} does not hold {grid.shape[0]} grid tokens.")
    if old_grid == new_grid:
        return posemb.copy()
    grid = grid.reshape(old_grid + (-1,))
    rows = interpolation_matrix(old_grid[0], new_grid[0])
    cols = interpolation_matrix(old_grid[1], new_grid[1])
    grid = np.einsum("ir,rcd,jc->ijd", rows, grid, cols)
    grid = grid.reshape(1, new_grid[0] * new_grid[1], -1).astype(np.float32)
    return np.concatenate([prefix, grid], axis=1)


def interpolation_matrix(in_size, out_size):
    """(out_size, in_size) matrix of 1-D linear interpolation with half-pixel centres."""
    src = (np.arange(out_size, dtype=np.float64) + 0.5) * (in_size / out_size) - 0.5
    src = np.clip(src, 0.0, in_size - 1)
    low = np.floor(src).astype(int)
    high = np.minimum(low + 1, in_size - 1)
    frac = src - low
    weights = np.zeros((out_size, in_size))
    np.add.at(weights, (np.arange(out_size), low), 1.0 - frac)
    np.add.at(weights, (np.arange(out_size), high), frac)
    return weights
