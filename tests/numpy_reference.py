"""An independent float64 NumPy implementation of the paper's ViT equations, read from a
keras_vit model's weights. Patches are cut by reshaping (not by a convolution)."""

import keras
import numpy as np
from scipy.special import erf


def _np(variable):
    return keras.ops.convert_to_numpy(variable).astype(np.float64)


def _layer_norm(x, layer):
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + layer.epsilon) * _np(layer.gamma) + _np(layer.beta)


def _gelu(x):
    return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


def _softmax(x):
    x = x - x.max(-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)


def _dense(x, layer):
    y = x @ _np(layer.kernel)
    return y + _np(layer.bias) if layer.use_bias else y


def vit_forward(model, images):
    """Logits (and per-block attention probabilities) of a pure (non-hybrid) ViT."""
    c = model.config
    x = np.asarray(images, np.float64)
    if c.normalize_inputs:
        x = (x - np.array(c.input_mean)) / np.array(c.input_std)
    b, h, w, ch = x.shape
    (ph, pw), (gh, gw) = c.patch_size, (h // c.patch_size[0], w // c.patch_size[1])
    # (b, gh, ph, gw, pw, ch) -> (b, gh*gw, ph*pw*ch): each patch flattened row-major.
    patches = x.reshape(b, gh, ph, gw, pw, ch).transpose(0, 1, 3, 2, 4, 5).reshape(b, gh * gw, -1)
    projection = model.get_layer("patch_embedding").projection
    tokens = patches @ _np(projection.kernel).reshape(-1, c.hidden_size) + _np(projection.bias)
    if c.classifier == "token":
        cls = np.broadcast_to(_np(model.get_layer("class_token").token), (b, 1, c.hidden_size))
        tokens = np.concatenate([cls, tokens], axis=1)
    x = tokens + _np(model.get_layer("position_embedding").embedding)
    heads, head_dim = c.num_heads, c.hidden_size // c.num_heads
    attentions = []
    for i in range(c.num_layers):
        block = model.get_layer(f"block_{i}")
        qkv = _dense(_layer_norm(x, block.norm1), block.attention.qkv).reshape(b, -1, 3, heads, head_dim)
        q, k, v = (qkv[:, :, j].transpose(0, 2, 1, 3) for j in range(3))  # (b, heads, t, d)
        probs = _softmax(q @ k.transpose(0, 1, 3, 2) / np.sqrt(head_dim))
        attentions.append(probs)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(b, -1, c.hidden_size)
        branch = _dense(context, block.attention.out)
        x = x + (branch * _np(block.scale1.gamma) if block.scale1 is not None else branch)
        mlp = block.mlp
        branch = _dense(_gelu(_dense(_layer_norm(x, block.norm2), mlp.fc1)), mlp.fc2)
        x = x + (branch * _np(block.scale2.gamma) if block.scale2 is not None else branch)
    x = _layer_norm(x, model.get_layer("encoder_norm"))
    x = x[:, 0] if c.classifier == "token" else x.mean(axis=1)
    if c.representation_size:
        x = np.tanh(_dense(x, model.get_layer("pre_logits")))
    return _dense(x, model.get_layer("head")), attentions
