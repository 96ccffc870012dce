"""timm `VisionTransformer` (and its ResNet hybrids) state dicts: PyTorch layouts.

Linear weights are `(out, in)` and become Keras `(in, out)` kernels; Conv2d weights are OIHW
and become HWIO. timm's fused `attn.qkv` is already `[q | k | v]`, as keras_vit's is.
"""

import logging
import re

import numpy as np

from keras_vit.checkpoints.files import CheckpointError
from keras_vit.checkpoints.official import image_size
from keras_vit.config import IMAGENET_MEAN, IMAGENET_STD, resnet_stride
from keras_vit.names import INTERPOLATIONS

logger = logging.getLogger("keras_vit")

# timm does not store the head count; these are the widths of the paper's variants, SigLIP's
# So400m and DINOv2's giant.
HEADS_BY_WIDTH = {192: 3, 384: 6, 768: 12, 1024: 16, 1152: 16, 1280: 16, 1536: 24}
# Parts of timm ViTs that keras_vit's ViT has no layer for: (state-dict prefix, what it is).
UNSUPPORTED = (
    ("blocks.0.attn.q_norm.", "query/key normalisation"),
    ("blocks.0.norm1_post", "post-norm blocks"),
    ("blocks.0.attn.gate.", "gated attention"),
    ("rope.", "learned rotary frequencies"),
)
# A hybrid's root convolution: inside `stem` of a ResNetV2, or the backbone itself when the
# ResNet is its root alone (R+Ti/16).
ROOT_KEYS = ("patch_embed.backbone.stem.conv.weight", "patch_embed.backbone.conv.weight")


def is_timm(tensors):
    return "patch_embed.proj.weight" in tensors


def _conv(w):
    return w.transpose(2, 3, 1, 0)


def _linear(w):
    return w.T


def _fuse_eva(tensors):
    """timm `Eva` tensors (EVA-02, DINOv3) in `VisionTransformer`'s names: separate q/k/v
    projections fused into `attn.qkv`, q and v biases into `attn.qv_bias`, SwiGLU's `fc1_g` and
    `fc1_x` into one `mlp.fc1` laid out `[gate | value]` (as timm's packed SwiGLU stores it), and
    LayerScale's `gamma_1`/`gamma_2` as `ls1.gamma`/`ls2.gamma`."""
    t = dict(tensors)
    blocks = sorted({int(m.group(1)) for k in t if (m := re.match(r"blocks\.(\d+)\.", k))})
    for i in blocks:
        b = f"blocks.{i}."
        projections = [f"{b}attn.{n}_proj.weight" for n in "qkv"]
        if all(n in t for n in projections):
            t[f"{b}attn.qkv.weight"] = np.concatenate([t.pop(n) for n in projections])
        for q, v in (("attn.q_bias", "attn.v_bias"), ("attn.q_proj.bias", "attn.v_proj.bias")):
            if b + q in t and b + v in t:
                t[f"{b}attn.qv_bias"] = np.concatenate([t.pop(b + q), t.pop(b + v)])
        for kind in ("weight", "bias"):
            gate, value = f"{b}mlp.fc1_g.{kind}", f"{b}mlp.fc1_x.{kind}"
            if gate in t and value in t:
                t[f"{b}mlp.fc1.{kind}"] = np.concatenate([t.pop(gate), t.pop(value)])
        for n in "12":
            if f"{b}gamma_{n}" in t:
                t[f"{b}ls{n}.gamma"] = t.pop(f"{b}gamma_{n}")
    return t


def is_official_dinov2(tensors):
    """Whether a state dict is in the official DINOv2 layout (facebookresearch/dinov2 `.pth`):
    timm's names plus the masked-modelling token."""
    return "mask_token" in tensors and "patch_embed.proj.weight" in tensors


def _from_official_dinov2(tensors):
    """Official DINOv2 tensors in timm's names: `register_tokens` as `reg_token`, the fused
    SwiGLU's `w12`/`w3` as `fc1`/`fc2` (gate first in both), chunked blocks (`blocks.{chunk}.{i}.`,
    `i` counted over the whole model) unchunked; the masked-modelling token, which inference never
    reads, dropped. The position embedding keeps its class slot."""
    if not is_official_dinov2(tensors):
        return tensors
    out = {}
    for name, value in tensors.items():
        if name == "mask_token":
            continue
        name = "reg_token" if name == "register_tokens" else re.sub(r"^blocks\.\d+\.(\d+)\.", r"blocks.\1.", name)
        out[re.sub(r"\.mlp\.w12\.", ".mlp.fc1.", re.sub(r"\.mlp\.w3\.", ".mlp.fc2.", name))] = value
    return out


def _canonical(tensors):
    """Any timm-like layout (timm's own, its `Eva` class, official DINOv2) in timm's names."""
    return _fuse_eva(_from_official_dinov2(tensors))


def is_eva(tensors):
    """Whether a timm state dict is of timm's `Eva` class (EVA-02, DINOv3), whose options and
    default pooling differ from `VisionTransformer`'s."""
    block = "blocks.0."
    return any(
        f"{block}{name}" in tensors for name in ("gamma_1", "attn.q_bias", "attn.q_proj.weight", "mlp.fc1_g.weight")
    ) or ("pos_embed" not in tensors and "patch_embed.proj.weight" in tensors)


def to_keras(tensors):
    """timm state dict -> {keras_vit variable path: array}; unknown names are kept as they are."""
    t = _canonical(tensors)
    out = {}
    rules = [
        (r"cls_token", "class_token/token", None),
        (r"pos_embed", "position_embedding/embedding", None),
        (r"patch_embed\.proj\.weight", "patch_embedding/projection/kernel", _conv),
        (r"patch_embed\.proj\.bias", "patch_embedding/projection/bias", None),
        (r"blocks\.(\d+)\.norm([12])\.weight", r"block_\1/norm\2/gamma", None),
        (r"blocks\.(\d+)\.norm([12])\.bias", r"block_\1/norm\2/beta", None),
        (r"blocks\.(\d+)\.attn\.qkv\.weight", r"block_\1/attention/qkv/kernel", _linear),
        (r"blocks\.(\d+)\.attn\.qkv\.bias", r"block_\1/attention/qkv/bias", None),
        (r"blocks\.(\d+)\.attn\.qv_bias", r"block_\1/attention/qv_bias", None),
        (r"blocks\.(\d+)\.mlp\.norm\.weight", r"block_\1/mlp/norm/gamma", None),
        (r"blocks\.(\d+)\.mlp\.norm\.bias", r"block_\1/mlp/norm/beta", None),
        (r"blocks\.(\d+)\.attn\.proj\.weight", r"block_\1/attention/out/kernel", _linear),
        (r"blocks\.(\d+)\.attn\.proj\.bias", r"block_\1/attention/out/bias", None),
        (r"blocks\.(\d+)\.mlp\.fc([12])\.weight", r"block_\1/mlp/fc\2/kernel", _linear),
        (r"blocks\.(\d+)\.mlp\.fc([12])\.bias", r"block_\1/mlp/fc\2/bias", None),
        (r"blocks\.(\d+)\.ls([12])\.gamma", r"block_\1/scale\2/gamma", None),
        (r"(?:fc_)?norm\.weight", "encoder_norm/gamma", None),
        (r"(?:fc_)?norm\.bias", "encoder_norm/beta", None),
        (r"reg_token", "register_tokens/tokens", None),
        (r"attn_pool\.latent", "attention_pool/probe", None),
        (r"attn_pool\.(q|kv|proj)\.weight", "pool:kernel", _linear),
        (r"attn_pool\.(q|kv|proj)\.bias", "pool:bias", None),
        (r"attn_pool\.norm\.weight", "attention_pool/norm/gamma", None),
        (r"attn_pool\.norm\.bias", "attention_pool/norm/beta", None),
        (r"attn_pool\.mlp\.fc([12])\.weight", r"attention_pool/mlp/fc\1/kernel", _linear),
        (r"attn_pool\.mlp\.fc([12])\.bias", r"attention_pool/mlp/fc\1/bias", None),
        (r"pre_logits\.fc\.weight", "pre_logits/kernel", _linear),
        (r"pre_logits\.fc\.bias", "pre_logits/bias", None),
        (r"head\.weight", "head/kernel", _linear),
        (r"head\.bias", "head/bias", None),
        # hybrid backbones (ResNetV2 without pre-activation; R+Ti/16's is its root alone, no `stem.`)
        (r"patch_embed\.backbone\.(?:stem\.)?conv\.weight", "resnet/conv_root/kernel", _conv),
        (r"patch_embed\.backbone\.(?:stem\.)?norm\.weight", "resnet/gn_root/gamma", None),
        (r"patch_embed\.backbone\.(?:stem\.)?norm\.bias", "resnet/gn_root/beta", None),
        (r"patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\.conv([123])\.weight", "unit:conv\\3/kernel", _conv),
        (r"patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\.norm([123])\.weight", "unit:gn\\3/gamma", None),
        (r"patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\.norm([123])\.bias", "unit:gn\\3/beta", None),
        (
            r"patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\.downsample\.conv\.weight",
            "unit:conv_proj/kernel",
            _conv,
        ),
        (r"patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\.downsample\.norm\.weight", "unit:gn_proj/gamma", None),
        (r"patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\.downsample\.norm\.bias", "unit:gn_proj/beta", None),
    ]
    compiled = [(re.compile(pattern + "$"), target, fn) for pattern, target, fn in rules]
    for name in list(t):
        for pattern, target, fn in compiled:
            match = pattern.match(name)
            if not match:
                continue
            if target.startswith("pool:"):  # timm's q, kv and proj are keras_vit's query, key_value and out
                layer = {"q": "query", "kv": "key_value", "proj": "out"}[match.group(1)]
                path = f"attention_pool/{layer}/{target[5:]}"
            elif target.startswith("unit:"):
                stage, unit = int(match.group(1)) + 1, int(match.group(2)) + 1
                path = f"resnet/block{stage}_unit{unit}/" + match.expand(target[5:])
            else:
                path = match.expand(target)
            value = t.pop(name)
            out[path] = fn(value) if fn else value
            break
    out.update(t)  # leftovers keep their names: reported as unexpected
    return out


def config_fields(tensors):
    """ViTConfig fields read off a timm state dict. timm does not store the head count: it is
    that of the paper's variant of the width (HEADS_BY_WIDTH; logged), None at other widths."""
    for prefix, what in UNSUPPORTED:
        if any(name.startswith(prefix) for name in tensors):
            raise CheckpointError(f"a timm ViT with {what} is not supported yet (tensor {prefix}...).")
    eva = is_eva(tensors)
    tensors = _canonical(tensors)
    if "fc_norm.weight" in tensors and "norm.weight" in tensors:
        raise CheckpointError("a timm ViT with both norm and fc_norm LayerNorms is not supported.")
    kernel = tensors["patch_embed.proj.weight"]  # (D, C, P, P)
    width = kernel.shape[0]
    if width in HEADS_BY_WIDTH:
        logger.info("keras_vit: timm checkpoint of width %d: %d heads assumed", width, HEADS_BY_WIDTH[width])
    depth = len({m.group(1) for k in tensors if (m := re.match(r"blocks\.(\d+)\.", k))})
    fields = dict(
        hidden_size=width,
        num_heads=HEADS_BY_WIDTH.get(width),
        patch_size=tuple(kernel.shape[2:]),
        channels=kernel.shape[1],
        num_layers=depth,
        mlp_dim=tensors["blocks.0.mlp.fc2.weight"].shape[1],
        # timm pools the mean of the patches where it normalises the pooled vector (fc_norm), and
        # its `Eva` models (EVA-02, DINOv3) by default.
        classifier=(
            "map"
            if "attn_pool.latent" in tensors
            else "token"
            if "cls_token" in tensors and "fc_norm.weight" not in tensors and not eva
            else "gap"
        ),
        class_token="cls_token" in tensors,
        num_register_tokens=tensors["reg_token"].shape[1] if "reg_token" in tensors else 0,
        fc_norm="fc_norm.weight" in tensors,
        num_classes=tensors["head.bias"].shape[0] if "head.bias" in tensors else 0,
        posemb_interpolation="bicubic_antialias",  # timm's resample_abs_pos_embed
    )
    if "blocks.0.attn.qv_bias" in tensors:
        fields["key_bias"] = False
    elif "blocks.0.attn.qkv.bias" not in tensors:
        fields["qkv_bias"] = False
    if "blocks.0.ls1.gamma" in tensors:
        fields["layer_scale_init"] = 1e-5
    if tensors["blocks.0.mlp.fc1.weight"].shape[0] == 2 * fields["mlp_dim"]:  # SwiGLU, [gate | value]
        fields["mlp_type"] = "swiglu"
    fields["mlp_norm"] = "blocks.0.mlp.norm.weight" in tensors
    if eva:
        fields.update(_eva_family(tensors, fields))
    stride = 1
    root = next((k for k in ROOT_KEYS if k in tensors), None)
    if root is not None:
        stages = {m.group(1) for k in tensors if (m := re.match(r"patch_embed\.backbone\.stages\.(\d+)\.", k))}
        fields["resnet_layers"] = tuple(
            len(
                {
                    m.group(1)
                    for k in tensors
                    if (m := re.match(rf"patch_embed\.backbone\.stages\.{s}\.blocks\.(\d+)\.", k))
                }
            )
            for s in sorted(stages, key=int)
        )
        fields["resnet_width"] = tensors[root].shape[0]
        fields["channels"] = tensors[root].shape[1]
        fields["resnet_numerics"] = "timm"
        stride = resnet_stride(len(stages))
    if fields["classifier"] == "map" and tensors["attn_pool.latent"].shape[1] != 1:
        raise CheckpointError("a timm attention-pool head with several latent queries is not supported.")
    # The position embedding's class slot: absent from `no_embed_class` files (DINOv2 with
    # registers, DeiT-3), where its value is folded into the class token.
    if "pos_embed" not in tensors:
        return fields  # no size recorded: `_eva_family` chose one
    tokens = tensors["pos_embed"].shape[1]
    fields["no_embed_class"] = fields["class_token"] and int(round(tokens**0.5)) ** 2 == tokens
    fields["image_size"] = image_size(tokens, fields, stride)
    return fields


def _eva_family(tensors, fields):
    """The settings timm's `Eva` class keeps out of its state dict (its rotary embeddings are
    computed, not stored), from the family the tensors point to, logged: DINOv3 (register
    tokens and no learned position embedding: its rotary embedding, LayerNorm epsilon 1e-5, 224
    pixels unless given) or EVA-02 (a SwiGLU MLP beside a learned position embedding: its rotary
    embedding on the 224-pixel grid it was pre-trained at). Others (EVA-01) get none."""
    patch = fields["patch_size"]
    if "pos_embed" not in tensors:
        logger.warning(
            "keras_vit: a timm Eva file without a position embedding: DINOv3's rotary embedding and LayerNorm "
            "epsilon assumed, and 224-pixel images unless image_size is given"
        )
        return dict(
            position_embedding=False,
            rope="dinov3",
            layer_norm_epsilon=1e-5,
            image_size=(224 // patch[0] * patch[0],) * 2,
        )
    if fields.get("mlp_type") == "swiglu":
        reference = (224 // patch[0], 224 // patch[1])
        logger.info("keras_vit: a timm EVA-02 file: its rotary embedding on the %dx%d grid of 224 pixels", *reference)
        return dict(rope="eva02", rope_reference_grid=reference)
    return {}


def pretrained_fields(hf_config, tensors):
    """The image transform a timm hub folder's `config.json` records in `pretrained_cfg`: its
    mean and std (in [0, 1], as pixel units here), input size (down to a multiple of the patch
    in `tensors`, as timm's patch convolution sees it: SigLIP So400m/14's 384 is 378), centre-crop
    fraction and, where keras_vit's transform has it, interpolation; for an official DINOv2 file,
    ImageNet's statistics (its own transforms'); {} without them. Statistics
    are rounded to 1e-5 pixel levels, as keras_vit.config's constants are, so that the same ones
    compare equal."""
    cfg = (hf_config or {}).get("pretrained_cfg")
    if not isinstance(cfg, dict) and is_official_dinov2(tensors):  # DINOv2's own transforms: ImageNet's
        return dict(normalize_inputs=True, input_mean=IMAGENET_MEAN, input_std=IMAGENET_STD)
    if not isinstance(cfg, dict):
        return {}
    fields = {}
    if cfg.get("mean") is not None and cfg.get("std") is not None:
        mean, std = np.atleast_1d(np.asarray(cfg["mean"], float)), np.atleast_1d(np.asarray(cfg["std"], float))
        fields.update(
            normalize_inputs=True,
            input_mean=tuple(round(float(m) * 255, 5) for m in mean),
            input_std=tuple(round(float(s) * 255, 5) for s in std),
        )
    size = cfg.get("input_size")
    if isinstance(size, (list, tuple)) and len(size) == 3:
        patch = tensors["patch_embed.proj.weight"].shape[2:]
        fields["image_size"] = tuple(int(s) // p * p for s, p in zip(size[1:], patch))
    if cfg.get("crop_pct") is not None and cfg.get("crop_mode", "center") == "center":
        fields["crop_fraction"] = float(cfg["crop_pct"])
    if cfg.get("interpolation") in INTERPOLATIONS:  # others (bicubic above all) keep keras_vit's bilinear
        fields["interpolation"] = cfg["interpolation"]
    return fields
