"""`ViTConfig`: the one description of a Vision Transformer that every model is built from."""

import dataclasses
import difflib
import math
import numbers
import re
import types
import typing
from collections.abc import Iterable
from pathlib import Path

from keras_vit.names import (
    CLASSIFIERS,
    EVAL_CROP,
    INTERPOLATIONS,
    MLP_TYPES,
    NORMALIZATIONS,
    POSEMB_INTERPOLATIONS,
    RESNET_GROUPS,
    ROPE_STYLES,
)

# Official ViT inputs: pixels in [0, 255] mapped to [-1, 1], i.e. (x - 127.5) / 127.5.
OFFICIAL_MEAN = (127.5, 127.5, 127.5)
OFFICIAL_STD = (127.5, 127.5, 127.5)
# ImageNet statistics (DeiT, DINOv2) in pixel units: 255 x (0.485, 0.456, 0.406) and (0.229, 0.224, 0.225).
IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)
# OpenAI CLIP's statistics (EVA-02) in pixel units: 255 x (0.48145466, 0.4578275, 0.40821073) and
# (0.26862954, 0.26130258, 0.27577711).
CLIP_MEAN = (122.77094, 116.74601, 104.09374)
CLIP_STD = (68.50053, 66.63216, 70.32316)
# The statistics of each name of `NORMALIZATIONS` (`normalization_fields`).
NORMALIZATION_STATISTICS = dict(
    zip(NORMALIZATIONS, ((IMAGENET_MEAN, IMAGENET_STD), (OFFICIAL_MEAN, OFFICIAL_STD), (CLIP_MEAN, CLIP_STD)))
)


def normalization_fields(spec):
    """`input_mean` and `input_std` of a normalisation: a name of `NORMALIZATIONS`, or "MEAN,STD"
    in pixel units (0-255), one value each for every channel or one per channel
    ("M1,M2,M3,S1,S2,S3"). Raises ValueError (one line) for anything else."""
    if spec in NORMALIZATION_STATISTICS:
        mean, std = NORMALIZATION_STATISTICS[spec]
        return dict(normalize_inputs=True, input_mean=mean, input_std=std)
    usage = f"normalization must be one of {', '.join(NORMALIZATIONS)} or MEAN,STD in pixel units (0-255)"
    try:
        values = [float(v) for v in str(spec).split(",")]
    except ValueError:
        raise ValueError(f"{usage}; got {spec!r}.") from None
    if (
        len(values) % 2
        or not values
        or not all(math.isfinite(v) for v in values)
        or min(values[len(values) // 2 :]) <= 0
    ):
        raise ValueError(f"{usage}, the stds positive; got {spec!r}.")
    if max(values) <= 1:
        scaled = ",".join(f"{v * 255:g}" for v in values)
        raise ValueError(f"{usage}; {spec!r} looks like [0, 1] units: in pixels that is {scaled}.")
    half = len(values) // 2
    return dict(normalize_inputs=True, input_mean=tuple(values[:half]), input_std=tuple(values[half:]))


def normalization_name(mean, std):
    """The name of `NORMALIZATIONS` whose statistics are `mean` and `std` (to 1e-3 pixel levels),
    else None."""
    for name, (known_mean, known_std) in NORMALIZATION_STATISTICS.items():
        pairs = list(zip(known_mean, mean)) + list(zip(known_std, std))
        if len(mean) == len(known_mean) and all(abs(a - b) < 1e-3 for a, b in pairs):
            return name
    return None


def _pair(value, name):
    value = (value, value) if isinstance(value, numbers.Integral) else tuple(value)
    if len(value) != 2 or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in value):
        raise ValueError(f"`{name}` must be an int or a pair of ints (height, width); got {value!r}.")
    value = tuple(int(v) for v in value)
    if min(value) < 1:
        raise ValueError(f"`{name}` must be positive; got {value[0] if value[0] == value[1] else value!r}.")
    return value


@dataclasses.dataclass(frozen=True)
class ViTConfig:
    """Hyper-parameters of a ViT (paper Table 1 plus the options of the official release).

    Args:
        image_size: input resolution, an int or (height, width). With `dynamic_image_size`, the
            resolution the position embedding is stored at (and exports are fixed to).
        dynamic_image_size: take images of any height and width that are multiples of the patch
            (times the ResNet stride for hybrids), batch by batch: the position embedding is
            resampled inside the call with `posemb_interpolation` and rotary tables are built
            for the batch's grid (timm's `dynamic_img_size=True`).
        patch_size: patch side P, an int or (height, width). For the hybrid this is the
            patch size on the ResNet feature map (1 in the paper's R50+ViT models).
        hidden_size: token width D.
        num_layers: number of encoder blocks L.
        num_heads: attention heads; must divide `hidden_size`.
        mlp_dim: hidden width of the block MLP (4D in the paper).
        num_classes: logits of the head; 0 gives a headless model that returns features.
        classifier: "token" (class token, read after the final LayerNorm), "gap" (no class
            token, mean over patch tokens after the final LayerNorm) or "map" (no class token,
            multi-head attention pooling of the patch tokens by a learned probe, SigLIP's head).
        class_token: whether a class token is prepended; None: when `classifier` is "token"
            (timm's DINOv2 and EVA-02 classifiers keep one and pool the mean of the patches).
        no_embed_class: the position embedding covers the patches only and the class token gets
            none (timm's `no_embed_class`: DeiT-3, DINOv2 with registers).
        num_register_tokens: learned register tokens (DINOv2 with registers), inserted after the
            class token once the position embedding is added: they get no position and are left
            out of pooling and of the patch maps.
        fc_norm: apply the final LayerNorm to the pooled vector instead of to every token
            (timm's `fc_norm`).
        representation_size: width of the pre-logits Dense+tanh layer used in
            pre-training; None for none.
        dropout_rate: dropout after the position embedding and after each MLP Dense.
        attention_dropout_rate: dropout on the attention probabilities.
        drop_path_rate: stochastic depth of the last block (linear schedule from 0).
        layer_scale_init: initial LayerScale value (e.g. 1e-5); None disables LayerScale.
        layer_norm_epsilon: epsilon of every LayerNorm (1e-6 in the reference).
        gelu_approximate: tanh GELU approximation instead of the exact erf form.
        qkv_bias: biases on the query/key/value projections.
        key_bias: with `qkv_bias`, a bias on the keys too; False: query and value biases only
            (EVA-02).
        mlp_type: "gelu" (Dense-GELU-Dense) or "swiglu" (SiLU(x W_gate) * x W_value of width
            `mlp_dim`, then the output Dense; EVA-02, DINOv2-g, DINOv3's largest).
        mlp_norm: a LayerNorm on the MLP's hidden activations before its output Dense (EVA-02's
            sub-LayerNorm).
        position_embedding: a learned position embedding; False for models whose only positions
            are rotary (DINOv3).
        rope: rotary position embeddings on the patch tokens' queries and keys: None, "eva02" or
            "dinov3" (see `keras_vit.layers.RotaryEmbedding`).
        rope_theta: the rotary embedding's base; None: the style's (1e4 for eva02, 100 for dinov3).
        rope_reference_grid: the patch grid EVA-02's rotary coordinates are scaled to (the grid
            the model was pre-trained at); None: the model's own grid when built.
        channels: input channels (3 for RGB, 1 for grayscale).
        resnet_layers: units per ResNet stage for the hybrid, e.g. (3, 4, 9); () for the
            ResNet root alone (AugReg's R+Ti/16); None for a pure ViT.
        resnet_width: width of the ResNet root (64 for R50).
        resnet_numerics: "official" (the Flax reference's GroupNorm and weight-standardisation
            epsilons) or "timm" (timm's); set by the loader to match a checkpoint's source.
        normalize_inputs: map pixels from [0, 255] with `input_mean`/`input_std` inside the model.
        input_mean, input_std: per-channel statistics in pixel units [0, 255]; a value given
            for every channel alike (the official 127.5) serves any `channels`.
        crop_fraction, interpolation: the image transform the model is evaluated and served
            with (`keras_vit.transform.ImageTransform`): resize so that the centre
            `crop_fraction` becomes `image_size`, then crop it (1: resize only).
        posemb_interpolation: how position embeddings saved for another patch grid are
            resampled on load, and for each batch with `dynamic_image_size`: "bilinear" (the
            paper's code), "bicubic" (Hugging Face's) or "bicubic_antialias" (timm's).
    """

    image_size: int | tuple[int, int] = 224
    dynamic_image_size: bool = False
    patch_size: int | tuple[int, int] = 16
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    mlp_dim: int = 3072
    num_classes: int = 1000
    classifier: str = "token"
    class_token: bool | None = None
    no_embed_class: bool = False
    num_register_tokens: int = 0
    fc_norm: bool = False
    representation_size: int | None = None
    dropout_rate: float = 0.0
    attention_dropout_rate: float = 0.0
    drop_path_rate: float = 0.0
    layer_scale_init: float | None = None
    layer_norm_epsilon: float = 1e-6
    gelu_approximate: bool = False
    qkv_bias: bool = True
    key_bias: bool = True
    mlp_type: str = "gelu"
    mlp_norm: bool = False
    position_embedding: bool = True
    rope: str | None = None
    rope_theta: float | None = None
    rope_reference_grid: tuple[int, ...] | None = None
    channels: int = 3
    resnet_layers: tuple[int, ...] | None = None
    resnet_width: int = 64
    resnet_numerics: str = "official"
    normalize_inputs: bool = True
    input_mean: tuple[float, ...] = OFFICIAL_MEAN
    input_std: tuple[float, ...] = OFFICIAL_STD
    crop_fraction: float = EVAL_CROP
    interpolation: str = "bilinear"
    posemb_interpolation: str = "bilinear"

    def __post_init__(self):
        check_types(self, "ViTConfig field")
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731  (frozen dataclass)
        set_("image_size", _pair(self.image_size, "image_size"))
        set_("patch_size", _pair(self.patch_size, "patch_size"))
        if self.resnet_layers is not None:
            set_("resnet_layers", tuple(int(n) for n in self.resnet_layers))
        if self.rope_reference_grid is not None:
            set_("rope_reference_grid", _pair(self.rope_reference_grid, "rope_reference_grid"))
        for name in ("input_mean", "input_std"):
            values = tuple(float(v) for v in getattr(self, name))
            if len(set(values)) == 1 and len(values) != self.channels:  # one value for every channel
                values = values[:1] * max(1, int(self.channels))
            set_(name, values)
        self._validate()

    def _validate(self):
        for name in ("hidden_size", "num_layers", "num_heads", "mlp_dim", "channels"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"`{name}` must be a positive integer; got {getattr(self, name)!r}.")
        if self.num_classes < 0:
            raise ValueError(f"`num_classes` must be >= 0 (0 for no head); got {self.num_classes}.")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"the hidden size {self.hidden_size} is not divisible by {self.num_heads} attention heads; "
                f"choose a number of heads that divides {self.hidden_size} "
                f"(e.g. {_nearest_divisor(self.hidden_size, self.num_heads)})."
            )
        if self.resnet_layers is not None and (self.resnet_width < 1 or self.resnet_width % RESNET_GROUPS):
            raise ValueError(
                f"`resnet_width` must be a positive multiple of {RESNET_GROUPS} (the GroupNorm groups of the "
                f"ResNet stem); got {self.resnet_width}."
            )
        if self.resnet_layers is not None and min(self.resnet_layers, default=1) < 1:
            raise ValueError(
                f"`resnet_layers` must list stages of >= 1 units (() for the root alone); got {self.resnet_layers}."
            )
        if self.resnet_numerics not in ("official", "timm"):
            raise ValueError(f"`resnet_numerics` must be 'official' or 'timm'; got {self.resnet_numerics!r}.")
        if self.classifier not in CLASSIFIERS:
            raise ValueError(f"`classifier` must be one of {CLASSIFIERS}; got {self.classifier!r}.")
        if self.classifier == "token" and self.class_token is False:
            raise ValueError('classifier="token" reads the class token: it needs class_token=True (or None).')
        if self.mlp_type not in MLP_TYPES:
            raise ValueError(f"`mlp_type` must be one of {MLP_TYPES}; got {self.mlp_type!r}.")
        if self.rope is not None and self.rope not in ROPE_STYLES:
            raise ValueError(f"`rope` must be None or one of {tuple(ROPE_STYLES)}; got {self.rope!r}.")
        if self.rope is not None and (self.hidden_size // self.num_heads) % 4:
            raise ValueError(
                f"rotary embeddings need a head width divisible by 4 (two axes, sine and cosine pairs); got "
                f"{self.hidden_size // self.num_heads}."
            )
        if self.rope_theta is not None and not 0 < self.rope_theta < math.inf:
            raise ValueError(f"`rope_theta` must be finite and positive; got {self.rope_theta}.")
        if self.num_register_tokens < 0:
            raise ValueError(f"`num_register_tokens` must be >= 0; got {self.num_register_tokens}.")
        feature = self.feature_size
        for axis, (size, patch) in enumerate(zip(feature, self.patch_size)):
            if size % patch:
                which = "height" if axis == 0 else "width"
                stride = "" if self.resnet_layers is None else f" (ResNet feature map of {feature})"
                raise ValueError(
                    f"image {which} {self.image_size[axis]}{stride} is not divisible by patch size "
                    f"{patch}; use an image size that is a multiple of {patch * self.backbone_stride}, "
                    f"e.g. {max(1, round(size / patch)) * patch * self.backbone_stride}."
                )
        if not 0.0 < self.crop_fraction <= 1.0:
            raise ValueError(f"`crop_fraction` must be in (0, 1]; got {self.crop_fraction}.")
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"`interpolation` must be one of {INTERPOLATIONS}; got {self.interpolation!r}.")
        if self.posemb_interpolation not in POSEMB_INTERPOLATIONS:
            raise ValueError(
                f"`posemb_interpolation` must be one of {POSEMB_INTERPOLATIONS}; got {self.posemb_interpolation!r}."
            )
        for name in ("dropout_rate", "attention_dropout_rate", "drop_path_rate"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"`{name}` must be in [0, 1); got {getattr(self, name)}.")
        if len(self.input_mean) != self.channels or len(self.input_std) != self.channels:
            raise ValueError(
                f"`input_mean` and `input_std` need one value per channel ({self.channels}); "
                f"got {len(self.input_mean)} and {len(self.input_std)}"
                + (" (grayscale: input_mean=(127.5,), input_std=(127.5,))." if self.channels == 1 else ".")
            )
        if not all(math.isfinite(m) for m in self.input_mean) or not all(0 < s < math.inf for s in self.input_std):
            raise ValueError(
                f"`input_mean` must be finite and `input_std` finite and positive; got {self.input_mean} and "
                f"{self.input_std}."
            )
        if not 0.0 < self.layer_norm_epsilon < math.inf:  # 0 divides by zero on a constant token, < 0 gives NaN
            raise ValueError(f"`layer_norm_epsilon` must be finite and positive; got {self.layer_norm_epsilon}.")
        if self.representation_size is not None and int(self.representation_size) < 1:
            raise ValueError(
                f"`representation_size` (the pre-logits width) must be a positive integer, or None for no pre-logits "
                f"layer; got {self.representation_size}."
            )

    @property
    def backbone_stride(self):
        """Downsampling of the hybrid ResNet stem (1 for a pure ViT)."""
        return 1 if self.resnet_layers is None else resnet_stride(len(self.resnet_layers))

    @property
    def feature_size(self):
        """Spatial size of what the patch embedding sees (the image, or the ResNet map)."""
        s = self.backbone_stride
        # The ResNet convolutions and pooling use SAME padding: ceil division.
        return tuple(-(-size // s) for size in self.image_size)

    @property
    def grid_size(self):
        """Patch grid (rows, columns)."""
        return tuple(f // p for f, p in zip(self.feature_size, self.patch_size))

    @property
    def image_multiple(self):
        """(height, width) that every image side must be a multiple of: the patch times the ResNet
        stride (what `dynamic_image_size` models take)."""
        return tuple(p * self.backbone_stride for p in self.patch_size)

    @property
    def num_patches(self):
        return self.grid_size[0] * self.grid_size[1]

    @property
    def rope_settings(self):
        """The rotary embedding's `(style, theta, reference grid)`, with the style's defaults; None
        without one."""
        if self.rope is None:
            return None
        theta = ROPE_STYLES[self.rope] if self.rope_theta is None else self.rope_theta
        return self.rope, float(theta), self.rope_reference_grid or self.grid_size

    @property
    def num_class_tokens(self):
        """Class tokens before the patches: 1 or 0."""
        return int(self.classifier == "token" if self.class_token is None else self.class_token)

    @property
    def num_position_prefix_tokens(self):
        """Slots of the position embedding before the patches' (the class token's, unless
        `no_embed_class`)."""
        return 0 if self.no_embed_class else self.num_class_tokens

    @property
    def num_prefix_tokens(self):
        """Tokens before the patches: the class token, then the register tokens."""
        return self.num_class_tokens + self.num_register_tokens

    def replace(self, **changes):
        """A copy with some fields changed (validated again)."""
        check_fields(type(self), changes, "ViTConfig field")
        return dataclasses.replace(self, **changes)

    def to_dict(self):
        """JSON-friendly dict (tuples become lists) accepted by `from_dict`."""
        return to_plain_dict(self)

    @classmethod
    def from_dict(cls, values):
        """The config of a dict of fields (as `to_dict` gives); an unknown field is a ValueError
        naming the closest one."""
        check_fields(cls, values, "ViTConfig field")
        return cls(**values)


def resnet_stride(num_stages):
    """Downsampling of a hybrid's ResNet of `num_stages` stages: 4 by its root (a stride-2
    convolution and a stride-2 pooling), then 2 by every stage after the first."""
    return 4 * 2 ** max(num_stages - 1, 0)


def to_plain_dict(instance):
    """A dataclass as a YAML/JSON-friendly dict: tuples become lists."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(instance).items()}


def read_yaml_options(path, what):
    """The mapping of options in YAML file `path` (`what` names them in errors)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")

    class Loader(yaml.SafeLoader):
        """PyYAML's safe loader, reading `1e-3` as a number as YAML 1.2 does (PyYAML follows YAML
        1.1, whose floats need a dot, `1.0e-3`, and reads `1e-3` as a string)."""

    Loader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789."))
    try:
        values = yaml.load(path.read_text(), Loader=Loader) or {}
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or type(error).__name__
        raise ValueError(f"{path} is not valid YAML{where}: {problem}.") from None
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a mapping of {what}s.")
    return values


_EXPONENT_FLOAT = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)[eE][-+]?\d+$")


def check_types(instance, what):
    """Raises a ValueError naming the first field of dataclass `instance` whose value does not fit
    its annotation (`epochs: ten` in a YAML file, say): a whole number for `int`, any number for
    `float`, true/false for `bool`, a list for `tuple`, None only where the field allows it.
    NumPy scalars that fit become Python numbers, so configs stay JSON-serializable."""
    for field in dataclasses.fields(instance):
        value = getattr(instance, field.name)
        union = typing.get_origin(field.type) in (typing.Union, types.UnionType)
        kinds = [typing.get_origin(t) or t for t in (typing.get_args(field.type) if union else (field.type,))]
        if not any(_fits(value, kind) for kind in kinds):
            expected = " or ".join(_KIND_NAMES.get(kind, kind.__name__) for kind in kinds)
            raise ValueError(f"{what} `{field.name}` must be {expected}; got {value!r}.")
        if isinstance(value, numbers.Number) and not isinstance(value, (bool, int, float)):
            plain = int(value) if isinstance(value, numbers.Integral) else float(value)
            object.__setattr__(instance, field.name, plain)


_KIND_NAMES = {
    int: "an integer",
    float: "a number",
    bool: "true or false",
    str: "a string",
    tuple: "a list",
    dict: "a mapping",
    type(None): "null",
}


def _fits(value, kind):
    if kind is type(None):
        return value is None
    if kind is bool or isinstance(value, bool):
        return kind is bool and isinstance(value, bool)
    if kind is int:
        return isinstance(value, numbers.Integral)
    if kind is float:
        return isinstance(value, numbers.Real)
    if kind is tuple:
        return isinstance(value, Iterable) and not isinstance(value, (str, bytes, dict))
    return isinstance(value, kind)


def check_fields(cls, values, what):
    """Raises a ValueError naming any key of `values` that is not a field of dataclass `cls`,
    with the closest field of a misspelt one."""
    fields = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(fields))
    if unknown:
        hints = [
            f"{name}: did you mean {close[0]}?"
            for name in unknown
            if (close := difflib.get_close_matches(str(name), fields, n=1, cutoff=0.75))
        ]
        listed = f"unknown {what}(s): {', '.join(map(str, unknown))}"
        raise ValueError(listed + "".join(f"; {h}" for h in hints) if hints else listed + ".")


def _nearest_divisor(n, target):
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    return min(divisors, key=lambda d: (abs(d - target), d))
