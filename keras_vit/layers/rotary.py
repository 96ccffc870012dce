"""2-D rotary position embeddings (RoPE) on the patch tokens' queries and keys."""

import keras
import numpy as np
from keras import ops

from keras_vit.names import ROPE_STYLES
from keras_vit.resample import as_float


def rope_tables(style, grid_size, head_dim, theta, reference_grid=None, xp=np):
    """`(sin, cos)`, each `(rows * cols, head_dim)`, of the patches in row-major order.

    Half the rotation pairs turn with the patch's row coordinate, half with its column, at
    `head_dim // 4` frequencies each. "eva02": coordinates are patch indices scaled to
    `reference_grid` (`i / rows * ref_rows`), frequencies `theta ** -(j / (head_dim / 4))`, and
    pairs interleaved `(x0, x1), (x2, x3), ...`. "dinov3": coordinates are patch centres mapped
    to [-1, 1] (`2 (i + 0.5) / rows - 1`), angles `2 pi coordinate / theta ** (2 j / (head_dim /
    2))`, and pairs `(x_j, x_{j + head_dim / 2})` (rotate-half).

    `xp`: `numpy` (float64 tables of a fixed grid) or `keras.ops` (float32, for a grid known only
    when the model runs: `grid_size` may then hold scalar tensors)."""
    if style not in ROPE_STYLES:
        raise ValueError(f"rotary style must be one of {tuple(ROPE_STYLES)}; got {style!r}.")
    dtype = "float64" if xp is np else "float32"
    bands = head_dim // 4
    j = np.arange(bands, dtype=np.float64)
    counts = [as_float(xp, n, dtype) for n in grid_size]
    if style == "eva02":
        reference = grid_size if reference_grid is None else reference_grid
        axes = [xp.arange(n, dtype=dtype) / c * as_float(xp, r, dtype) for n, c, r in zip(grid_size, counts, reference)]
        frequencies = theta ** -(j / bands)
    else:
        axes = [2.0 * (xp.arange(n, dtype=dtype) + 0.5) / c - 1.0 for n, c in zip(grid_size, counts)]
        frequencies = 2.0 * np.pi / theta ** (2.0 * j / (head_dim // 2))
    rows, cols = xp.meshgrid(*axes, indexing="ij")
    coordinates = xp.stack([xp.reshape(rows, (-1,)), xp.reshape(cols, (-1,))], axis=-1)  # (N, 2)
    angles = xp.reshape(coordinates[:, :, None] * frequencies.astype(dtype), (-1, 2 * bands))
    if style == "eva02":
        angles = xp.repeat(angles, 2, axis=-1)  # [a0, a0, a1, a1, ...]
    else:
        angles = xp.concatenate([angles, angles], axis=-1)  # [a0, a1, ..., a0, a1, ...]
    return xp.sin(angles), xp.cos(angles)


def rotation_matrix(style, head_dim):
    """The `(head_dim, head_dim)` matrix R with `x @ R` the rotated partner of `x`: interleaved
    `(-x1, x0, -x3, x2, ...)` for "eva02", rotate-half `(-x_h.., x_0..)` for "dinov3". One +-1 per
    column, so the product is exact in any precision."""
    matrix = np.zeros((head_dim, head_dim), np.float32)
    half = head_dim // 2
    for i in range(half):
        if style == "eva02":
            a, b = 2 * i, 2 * i + 1
        else:
            a, b = i, i + half
        matrix[b, a], matrix[a, b] = -1.0, 1.0  # out[a] = -x[b], out[b] = x[a]
    return matrix


@keras.saving.register_keras_serializable(package="keras_vit")
class RotaryEmbedding(keras.layers.Layer):
    """Rotates queries or keys `(batch, heads, tokens, head_dim)` (or token-first with
    `token_axis=1`) by their patch's 2-D position: `x cos + rot(x) sin` (see `rope_tables`). The
    first `num_prefix_tokens` tokens (class and register tokens) are left as they are. The
    tables are constants of the grid, computed once; the layer has no weights. Called with
    `grid` (a tensor whose shape is `(batch, rows, cols, ...)`, see `PatchEmbedding`) of another
    grid, it builds that grid's tables in the call (EVA-02's coordinates still scaled to
    `reference_grid`, or to this layer's grid when None)."""

    def __init__(self, style, grid_size, num_prefix_tokens=0, theta=None, reference_grid=None, **kwargs):
        super().__init__(**kwargs)
        if style not in ROPE_STYLES:
            raise ValueError(f"rotary style must be one of {tuple(ROPE_STYLES)}; got {style!r}.")
        self.style = style
        self.grid_size = tuple(int(g) for g in grid_size)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.theta = float(ROPE_STYLES[style] if theta is None else theta)
        self.reference_grid = None if reference_grid is None else tuple(int(g) for g in reference_grid)

    def build(self, input_shape):
        head_dim = int(input_shape[-1])
        if head_dim % 4:
            raise ValueError(f"rotary embeddings need a head width divisible by 4; got {head_dim}.")
        sin, cos = rope_tables(self.style, self.grid_size, head_dim, self.theta, self.reference_grid)
        prefix = self.num_prefix_tokens
        self._sin = np.concatenate([np.zeros((prefix, head_dim)), sin]).astype("float32")  # prefix: unrotated
        self._cos = np.concatenate([np.ones((prefix, head_dim)), cos]).astype("float32")
        self._rotation = rotation_matrix(self.style, head_dim)

    def call(self, x, token_axis=2, grid=None):
        grid_size = self.grid_size if grid is None else tuple(ops.shape(grid)[1:3])
        shape = [1] * len(x.shape)
        shape[token_axis], shape[-1] = -1, x.shape[-1]
        if all(isinstance(n, int) for n in grid_size) and grid_size == self.grid_size:
            tokens = x.shape[token_axis]
            if tokens is not None and tokens != len(self._sin):
                raise ValueError(
                    f"{self.name}: built for {len(self._sin)} tokens ({self.num_prefix_tokens} prefix + grid "
                    f"{self.grid_size}); got {tokens}."
                )
            sin, cos = self._sin, self._cos
        else:
            sin, cos = self._tables_of(grid_size, x.shape[-1])
        sin, cos = (ops.cast(ops.reshape(t, shape), x.dtype) for t in (sin, cos))
        rotated = ops.matmul(x, ops.cast(self._rotation, x.dtype))
        return x * cos + rotated * sin

    def _tables_of(self, grid_size, head_dim):
        """`(sin, cos)` of another grid, prefix rows included, computed with `keras.ops`."""
        reference = self.reference_grid or self.grid_size
        sin, cos = rope_tables(self.style, grid_size, head_dim, self.theta, reference, xp=ops)
        prefix = self.num_prefix_tokens
        return (
            ops.concatenate([ops.zeros((prefix, head_dim)), sin], axis=0),
            ops.concatenate([ops.ones((prefix, head_dim)), cos], axis=0),
        )

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "style": self.style,
            "grid_size": list(self.grid_size),
            "num_prefix_tokens": self.num_prefix_tokens,
            "theta": self.theta,
            "reference_grid": None if self.reference_grid is None else list(self.reference_grid),
        }
