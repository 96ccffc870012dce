"""The paper's ways of reading a ViT (section 4.5), as numpy results from any keras_vit model.

- attention rollout (Abnar & Zuidema 2020; paper Figures 6 and 14) and the class token's raw
  attention per layer and head;
- mean attention distance per head and layer (Figure 7 right, Figure 11);
- position-embedding similarity (Figure 7 centre, Figure 10);
- principal components of the patch-embedding filters (Figure 7 left).
"""

import keras
import numpy as np

from keras_vit.resample import interpolation_matrix


def attention_rollout(attentions):
    """Rollout `(batch, tokens, tokens)` of per-layer attentions `[(batch, heads, T, T), ...]`.

    Each layer's attention is averaged over heads, the identity is added for the residual
    path, rows are renormalised, and the layers are multiplied from the first to the last.
    Rows of the result sum to 1.
    """
    rollout = None
    for probs in attentions:
        a = np.asarray(probs, np.float64).mean(axis=1)
        a = a + np.eye(a.shape[-1])
        a /= a.sum(axis=-1, keepdims=True)
        rollout = a if rollout is None else a @ rollout
    return rollout


def class_token_map(rows, grid_size, num_prefix_tokens=1):
    """Class-token rows `(..., tokens)` -> maps `(..., rows, cols)` over the patch grid."""
    rows = np.asarray(rows)[..., num_prefix_tokens:]
    return rows.reshape(rows.shape[:-1] + tuple(grid_size))


def upsample(maps, size):
    """Bilinear upsampling of maps `(..., h, w)` to `size` = (H, W) (half-pixel centres)."""
    maps = np.asarray(maps, np.float64)
    rows = interpolation_matrix(maps.shape[-2], size[0])
    cols = interpolation_matrix(maps.shape[-1], size[1])
    return np.einsum("ih,...hw,jw->...ij", rows, maps, cols)


def rollout_maps(model, images):
    """Attention-rollout heat maps `(batch, H, W)` in [0, 1]: the class token's row of the
    rollout, or for a model that pools the patches (`classifier="gap"` or `"map"`) the mean of
    the patch rows; register tokens are left out of the maps."""
    config = model.config
    rollout = attention_rollout(model.attention_probabilities(images))
    rows = _readout_rows(rollout, config)
    return _unit(upsample(class_token_map(rows, config.grid_size, config.num_prefix_tokens), config.image_size))


def class_token_attention(model, images):
    """Raw attention of the class token to every patch (for `classifier="gap"` or `"map"`, the
    mean of the patch tokens' attention): `(layers, batch, heads, rows, cols)`."""
    config = model.config
    probs = np.stack(model.attention_probabilities(images))
    return class_token_map(_readout_rows(probs, config), config.grid_size, config.num_prefix_tokens)


def _readout_rows(matrix, config):
    """The rows `(..., tokens)` of `(..., tokens, tokens)` that the head reads: the class
    token's, or the mean over the patch tokens' rows when the model pools the patches (by their
    mean, or by an attention-pool head, whose probe is outside these matrices); register tokens
    are no readout."""
    matrix = np.asarray(matrix)
    return (
        matrix[..., 0, :] if config.classifier == "token" else matrix[..., config.num_prefix_tokens :, :].mean(axis=-2)
    )


def mean_attention_distance(attentions, grid_size, patch_size, num_prefix_tokens=1):
    """Mean attention distance in pixels, `(layers, heads)`, averaged over queries and images.

    For every patch query, the distance to every patch key (between patch centres, in input
    pixels) weighted by the attention, with the attention renormalised over patch keys (the
    class token has no position).
    """
    rows, cols = np.meshgrid(np.arange(grid_size[0]), np.arange(grid_size[1]), indexing="ij")
    centres = np.stack([rows.ravel() * patch_size[0], cols.ravel() * patch_size[1]], axis=-1).astype(np.float64)
    distance = np.linalg.norm(centres[:, None] - centres[None], axis=-1)  # (N, N)
    out = []
    for probs in attentions:
        p = np.asarray(probs, np.float64)[:, :, num_prefix_tokens:, num_prefix_tokens:]
        p = p / p.sum(axis=-1, keepdims=True)
        out.append((p * distance).sum(axis=-1).mean(axis=(0, 2)))  # over images and queries
    return np.stack(out)


def model_attention_distance(model, images):
    """`mean_attention_distance` of a model on `images`: `(layers, heads)` in pixels."""
    c = model.config
    stride = c.backbone_stride
    patch = (c.patch_size[0] * stride, c.patch_size[1] * stride)
    return mean_attention_distance(model.attention_probabilities(images), c.grid_size, patch, c.num_prefix_tokens)


def position_embedding_similarity(model):
    """Cosine similarity of each patch's position embedding with all others:
    `(rows, cols, rows, cols)`, entry [i, j] the map of patch (i, j). A ValueError for a model
    without a learned position embedding (`position_embedding=False`)."""
    if not model.config.position_embedding:
        raise ValueError("the model has no learned position embedding (its positions are rotary embeddings).")
    layer = model.get_layer("position_embedding")
    grid = keras.ops.convert_to_numpy(layer.embedding)[0, layer.num_prefix_tokens :].astype(np.float64)
    grid /= np.linalg.norm(grid, axis=-1, keepdims=True)
    return (grid @ grid.T).reshape(layer.grid_size + layer.grid_size)


def patch_embedding_components(model, count=28):
    """Principal components of the linear patch-embedding filters.

    Returns `(components, explained)`: `count` components shaped like one filter
    `(P, P, channels)`, and the fraction of variance each explains. A hybrid's embedding reads
    ResNet features, not pixels, so it has no such filters (a ValueError).
    """
    if model.config.resnet_layers is not None:
        raise ValueError(
            "a hybrid ViT embeds ResNet features, not image patches: its embedding filters are not pixel filters."
        )
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
        raise ValueError(f"count must be a positive number of components; got {count!r}.")
    kernel = keras.ops.convert_to_numpy(model.get_layer("patch_embedding").projection.kernel).astype(np.float64)
    filters = kernel.reshape(-1, kernel.shape[-1]).T  # (D, P*P*C): one row per filter
    filters -= filters.mean(axis=0)
    _, singular, components = np.linalg.svd(filters, full_matrices=False)
    count = min(count, components.shape[0])
    explained = singular**2 / np.sum(singular**2)
    return components[:count].reshape((count,) + kernel.shape[:3]), explained[:count]


def _unit(maps):
    """Scales each map to [0, 1]."""
    low = maps.min(axis=(-2, -1), keepdims=True)
    high = maps.max(axis=(-2, -1), keepdims=True)
    return (maps - low) / np.maximum(high - low, 1e-12)
