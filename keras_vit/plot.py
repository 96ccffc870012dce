"""Matplotlib figures of the paper's inspections (section 4.5). Each function saves to
`path` (PNG by default; SVG/PDF by extension) and returns the path."""

from pathlib import Path

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    return plt


def figure_path(path):
    """`path` as a figure is saved to: with `.png` added when it has no suffix. Raises
    ValueError for a suffix matplotlib does not write, and for a folder (`viz` would have
    become `viz.png` beside it)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a folder; a figure is a file: give its name (e.g. {path / 'figure.png'}).")
    if not path.suffix:
        return path.with_suffix(".png")
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    if path.suffix[1:].lower() not in formats:
        raise ValueError(f"cannot write a figure to {path}: the formats are {', '.join(sorted(formats))}")
    return path


def _save(fig, path):
    path = figure_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    _pyplot().close(fig)
    return path


def _show_image(ax, image):
    """An image's pixels in [0, 255]: RGB, or one channel in gray (not a colour map's false colours)."""
    pixels = np.clip(image, 0, 255).astype("uint8")
    if pixels.shape[-1] == 1:
        ax.imshow(pixels[..., 0], cmap="gray", vmin=0, vmax=255)
    else:
        ax.imshow(pixels)


def heatmap_overlays(images, maps, path, title, labels=None):
    """Each image beside the image with its heat map overlaid, with a colour bar."""
    plt = _pyplot()
    images, maps = np.asarray(images), np.asarray(maps)
    if len(maps) != len(images) or (labels is not None and len(labels) != len(images)):
        given = f"{len(maps)} maps" + (f" and {len(labels)} labels" if labels is not None else "")
        raise ValueError(f"{given} for {len(images)} images; give one of each per image.")
    fig, axes = plt.subplots(len(images), 2, figsize=(7, 3.4 * len(images)), squeeze=False)
    for i, (image, heat) in enumerate(zip(images, maps)):
        name = labels[i] if labels else f"image {i}"
        _show_image(axes[i, 0], image)
        axes[i, 0].set_title(name, fontsize=9)
        _show_image(axes[i, 1], image)
        shown = axes[i, 1].imshow(heat, cmap="jet", alpha=0.5, vmin=0, vmax=1)
        axes[i, 1].set_title(title, fontsize=9)
        fig.colorbar(shown, ax=axes[i, 1], fraction=0.046, pad=0.04, label="relevance (0-1)")
        for ax in axes[i]:
            ax.axis("off")
    return _save(fig, path)


def class_token_attention(maps, path, image_index=0, image_name=None, mean_pooled=False):
    """Raw class-token attention per layer (rows) and head (columns) for one image, named in the
    title when `image_name` is given; `maps` is `(layers, batch, heads, rows, cols)` from
    `keras_vit.inspect`. `mean_pooled`: the model has no class token (`classifier="gap"`), the
    maps are the mean of the tokens' attention."""
    query = "the mean of the tokens" if mean_pooled else "the class token"
    plt = _pyplot()
    maps = np.asarray(maps)[:, image_index]
    layers, heads = maps.shape[:2]
    fig, axes = plt.subplots(layers, heads, figsize=(1.6 * heads + 1, 1.6 * layers + 0.6), squeeze=False)
    for layer in range(layers):
        for head in range(heads):
            ax = axes[layer, head]
            shown = ax.imshow(maps[layer, head], cmap="viridis")
            ax.set_xticks([]), ax.set_yticks([])
            if layer == 0:
                ax.set_title(f"head {head}", fontsize=8)
            if head == 0:
                ax.set_ylabel(f"layer {layer}", fontsize=8)
    fig.colorbar(shown, ax=axes, fraction=0.02, label=f"attention of {query}")
    fig.suptitle(f"Attention of {query} to each patch, per layer and head" + (f": {image_name}" if image_name else ""))
    return _save(fig, path)


def attention_distance(distances, path):
    """Mean attention distance of every head against network depth (paper Figure 7 right)."""
    plt = _pyplot()
    distances = np.asarray(distances)
    fig, ax = plt.subplots(figsize=(6, 4.5))
    layers, heads = distances.shape
    for head in range(heads):
        ax.scatter(np.arange(layers), distances[:, head], s=14, label=f"head {head}" if heads <= 16 else None)
    ax.set_xlabel("network depth (layer)")
    ax.set_ylabel("mean attention distance (pixels)")
    ax.set_title("Mean attention distance per head")
    ax.set_xticks(np.arange(layers))
    if heads <= 16:
        ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def position_similarity(similarity, path):
    """Grid of small maps: cosine similarity of each patch's position embedding with all
    others (paper Figure 7 centre); `similarity` is `(rows, cols, rows, cols)`."""
    plt = _pyplot()
    similarity = np.asarray(similarity)
    rows, cols = similarity.shape[:2]
    fig, axes = plt.subplots(rows, cols, figsize=(0.6 * cols + 1.5, 0.6 * rows + 0.8), squeeze=False)
    for i in range(rows):
        for j in range(cols):
            shown = axes[i, j].imshow(similarity[i, j], cmap="viridis", vmin=-1, vmax=1)
            axes[i, j].set_xticks([]), axes[i, j].set_yticks([])
    for j in range(cols):
        axes[-1, j].set_xlabel(str(j + 1), fontsize=6)
    for i in range(rows):
        axes[i, 0].set_ylabel(str(i + 1), fontsize=6)
    fig.supxlabel("input patch column")
    fig.supylabel("input patch row")
    fig.colorbar(shown, ax=axes, fraction=0.02, label="cosine similarity")
    fig.suptitle("Position embedding similarity")
    return _save(fig, path)


def patch_components(components, explained, path):
    """The principal components of the patch-embedding filters as image tiles (Figure 7 left)."""
    plt = _pyplot()
    components = np.asarray(components)
    count = len(components)
    cols = 7
    rows = -(-count // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(1.3 * cols, 1.45 * rows + 0.6), squeeze=False)
    for k, ax in enumerate(axes.ravel()):
        ax.axis("off")
        if k >= count:
            continue
        tile = components[k]
        tile = (tile - tile.min()) / max(tile.max() - tile.min(), 1e-12)
        ax.imshow(tile if tile.shape[-1] == 3 else tile[..., 0], cmap=None if tile.shape[-1] == 3 else "gray")
        ax.set_title(f"PC {k + 1} ({100 * explained[k]:.1f}%)", fontsize=7)
    kind = "RGB" if components.shape[-1] == 3 else f"{components.shape[-1]}-channel"
    fig.suptitle(f"{kind} embedding filters: first principal components")
    return _save(fig, path)
