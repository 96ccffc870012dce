"""`TrainConfig`: everything a training run depends on; YAML file + flag overrides."""

import dataclasses
import os
from pathlib import Path

from keras_vit.config import ViTConfig, check_fields, check_types, read_yaml_options, to_plain_dict
from keras_vit.names import AUGMENTS, DECAYS, PRECISIONS, PROTOCOLS, RECIPES, STRATEGIES

# The offline default: a 0.31M-parameter ViT on scikit-learn's digits upscaled to 24x24, 16 tokens
# of 6x6 pixels (2x2 original pixels) pooled by their mean, evaluated and served resized whole
# (crop_fraction 1: an 8x8 digit has no border to crop), trained 130 epochs. Its held-out top-1
# on seeds 0-4, with the machine and the times, is in docs/training.md ("Data"). Measured on
# seeds 0-4 at the time it was chosen and not chosen: 100 epochs (more images wrong); width 128
# (no fewer wrong, slower); 36 tokens of width 64 or 96 (as many wrong, or too close to the
# 150-s budget).
DIGITS_MODEL = dict(
    image_size=24,
    patch_size=6,
    hidden_size=96,
    num_layers=4,
    num_heads=4,
    mlp_dim=192,
    classifier="gap",
    crop_fraction=1.0,
)

# The fields that decide which examples a run trains on and which it holds out.
SPLIT_FIELDS = (
    "dataset",
    "train_split",
    "eval_split",
    "validation_fraction",
    "selection_fraction",
    "seed",
    "data_fingerprint",
)


@dataclasses.dataclass
class TrainConfig:
    """A training or fine-tuning run. `None` fields take the recipe's or dataset's default.

    Data: `dataset` is "digits", "tfds:NAME" or a folder path; `train_split`/`eval_split`
    use tfds split syntax (e.g. "train[:90%]"); a folder or digits holds out
    `validation_fraction` for evaluation, which never steers training: `best.keras` is the last
    epoch, or, with `selection_fraction`, the best epoch on that share of the training examples,
    held out. Model: a `preset` with `model` overrides (any ViTConfig field), or the digits
    default; `weights` is a checkpoint to start from (the `finetune` recipe unless `recipe` says).
    """

    dataset: str | None = None  # None: "digits", or the protocol's dataset
    run_dir: str | None = None  # None: runs/<the dataset's name>, e.g. runs/digits, runs/cifar10, runs/flowers
    train_split: str | None = None
    eval_split: str | None = None
    validation_fraction: float = 0.2
    selection_fraction: float = 0.0  # of the training examples, held out to choose best.keras; 0: last epoch
    preset: str | None = None
    model: dict = dataclasses.field(default_factory=dict)
    weights: str | None = None
    recipe: str | None = None  # None: "finetune" when starting from `weights`, else "pretrain"
    # A linear probe of the `weights`: their backbone's features computed once, only the head trained.
    freeze_backbone: bool = False
    # Layer-wise learning-rate decay (BEiT): block i of L learns at layer_decay ** (L - i) of the
    # rate, the embeddings at layer_decay ** (L + 1); None: off (recipe finetune-adamw: 0.65).
    layer_decay: float | None = None
    head_lr_scale: float = 1.0  # the head's learning rate over its layer's
    protocol: str | None = None  # one of the paper's fine-tuning protocols (implies recipe finetune)
    epochs: int | None = None
    steps: int | None = None  # total optimizer steps, instead of epochs
    batch_size: int | None = None  # per replica; None: 32 (a protocol: a global batch of 512)
    global_batch_size: int | None = None  # instead of batch_size: split over the replicas
    learning_rate: float | None = None  # for a global batch of base_batch_size
    base_batch_size: int | None = None  # lr * sqrt(global_batch / base) for AdamW, * (global_batch / base) for SGD
    weight_decay: float | None = None
    warmup_fraction: float | None = None  # of all steps; default 0.1 (a protocol: 500 steps, at most 10%)
    decay: str = "cosine"
    clip_norm: float | None = None
    ema: float | None = None  # momentum of a moving average of the weights, saved as the model; None: off
    label_smoothing: float | None = None  # default 0 (0.1 for digits)
    randaugment: float | None = None  # RandAugment strength in (0, 1] (2 ops per image); None = off
    mixup: float = 0.0  # Beta(alpha, alpha) mixing of image pairs; 0 = off
    cutmix: float = 0.0
    augment: str | None = None  # "inception" (random resized crop; default), "translate" or "affine" (digits)
    crop_scale: tuple = (0.08, 1.0)  # area range of the Inception-style crop
    flip: bool | None = None  # horizontal flips; default on (off for digits)
    strategy: str = "auto"
    tpu: str | None = None
    model_parallel: int = 1  # JAX: devices per model replica (Megatron-style split of the blocks)
    # Micro-batches whose gradients are averaged into one optimizer step: the effective batch is
    # the global batch times this, and the learning rate and `steps` follow the effective batch.
    accumulate: int = 1
    remat: bool = False  # JAX: recompute each encoder block in the backward pass (less activation memory)
    precision: str = "float32"
    # XLA and steps per compiled call; None: XLA on GPUs, TPUs and JAX, off on TensorFlow CPUs
    # (see strategy.py), one step per call, except for digits on one device: XLA, several steps per call.
    jit_compile: bool | None = None
    steps_per_execution: int | None = None
    checkpoint_interval: float = 30.0  # seconds between backup (also mid-epoch) and last.keras saves (0: every epoch)
    seed: int = 0
    # An image folder's readable files when the run split it ("N images, sha256 HEX"), written by
    # training: a folder changed since (files added, removed or renamed) would split otherwise, so
    # its held-out share would hold training images; such a folder is refused. None: not recorded.
    data_fingerprint: str | None = None

    def __post_init__(self):
        check_types(self, "training option")
        check_fields(ViTConfig, self.model, "model field")
        self.crop_scale = tuple(float(v) for v in self.crop_scale)
        for name in ("dataset", "run_dir", "weights"):  # `~/data` in a YAML file (no shell expands it)
            if isinstance(getattr(self, name), str) and getattr(self, name).startswith("~"):
                setattr(self, name, os.path.expanduser(getattr(self, name)))
        for name, choices in (
            ("recipe", RECIPES + (None,)),
            ("strategy", STRATEGIES),
            ("precision", PRECISIONS),
            ("decay", DECAYS),
            ("augment", AUGMENTS + (None,)),
        ):
            if getattr(self, name) not in choices:
                listed = ", ".join(filter(None, choices))
                raise ValueError(f"unknown {name} {getattr(self, name)!r}; choose from {listed}.")
        if self.protocol is not None and self.protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {self.protocol!r}; choose from {', '.join(PROTOCOLS)}.")
        if self.steps is not None and self.epochs is not None:
            raise ValueError(f"steps ({self.steps}) and epochs ({self.epochs}) are one or the other; give one.")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"steps must be positive; got {self.steps}.")
        if self.steps_per_execution is not None and self.steps_per_execution < 1:
            raise ValueError(f"steps per execution must be positive; got {self.steps_per_execution}.")
        if self.checkpoint_interval < 0:
            raise ValueError(f"checkpoint interval must be >= 0 seconds; got {self.checkpoint_interval}.")
        if self.model_parallel < 1:
            raise ValueError(f"model-parallel device count must be positive; got {self.model_parallel}.")
        if self.accumulate < 1:
            raise ValueError(f"accumulate (micro-batches per optimizer step) must be positive; got {self.accumulate}.")
        if self.accumulate > 1 and self.ema is not None:
            # Keras updates the moving average at every micro-batch, not at every optimizer step.
            raise ValueError("ema and accumulate are one or the other: Keras would average every micro-batch.")
        for name in ("batch_size", "epochs", "global_batch_size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{_spelled(name)} must be positive; got {getattr(self, name)}.")
        for name, low, high in _RANGES:
            value = getattr(self, name)
            if value is not None and not (low < value < float("inf") if high is None else low <= value < high):
                bound = (
                    f"finite and > {low}"
                    if high is None
                    else f">= {low}"
                    if high == float("inf")
                    else f"in [{low}, {high})"
                )
                raise ValueError(f"{_spelled(name)} must be {bound}; got {value}.")
        if self.layer_decay is not None and not 0.0 < self.layer_decay <= 1.0:
            raise ValueError(f"layer decay must be in (0, 1]; got {self.layer_decay}.")
        if self.freeze_backbone:
            if not self.weights:
                raise ValueError(
                    "freeze backbone (a linear probe) trains a head on a pre-trained backbone's features: give the "
                    "weights to start from."
                )
            augmented = [n for n in ("randaugment", "mixup", "cutmix") if getattr(self, n)]
            if augmented:
                raise ValueError(
                    f"freeze backbone trains on features computed once per image, without augmentation: "
                    f"{', '.join(augmented)} cannot apply; leave {'them' if len(augmented) > 1 else 'it'} out."
                )
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must be in [0, 2**32); got {self.seed}.")
        if self.ema is not None and not 0.0 < self.ema < 1.0:
            raise ValueError(f"ema (the moving average's momentum) must be in (0, 1); got {self.ema}.")
        if self.randaugment is not None and not 0.0 < self.randaugment <= 1.0:
            raise ValueError(f"randaugment must be in (0, 1]; got {self.randaugment}.")
        if not 0.0 < self.validation_fraction < 1.0:
            raise ValueError(f"validation fraction must be in (0, 1); got {self.validation_fraction}.")
        if not 0.0 <= self.selection_fraction < 1.0:
            raise ValueError(f"selection fraction must be in [0, 1); got {self.selection_fraction}.")
        if not (0.0 < self.crop_scale[0] <= self.crop_scale[1] <= 1.0):
            raise ValueError(f"crop scale must be (low, high) with 0 < low <= high <= 1; got {self.crop_scale}.")

    def data_split(self):
        """The fields that decide which examples this run trains on and which it holds out, as a
        plain dict (what an exported model records); a folder there is named by its absolute path."""
        c = self.resolved()
        return {name: getattr(c, name) for name in SPLIT_FIELDS}

    @property
    def is_digits(self):
        return self.dataset == "digits"

    def resolved(self):
        """A copy with the recipe's and dataset's defaults filled in (what the run directory stores)."""
        c = dataclasses.replace(self, model=dict(self.model))
        if c.protocol:
            c = _with_protocol(c)
        if c.dataset is None:
            c.dataset = "digits"
        if c.dataset and not (c.is_digits or c.dataset.startswith("tfds:")) and Path(c.dataset).is_dir():
            # A folder by its place: the run's evaluate and export find it from any working directory.
            c.dataset = str(Path(c.dataset).resolve())
        if c.weights and Path(c.weights).exists():  # a local checkpoint by its place, as the folder
            c.weights = str(Path(c.weights).resolve())
        if c.run_dir is None:
            c.run_dir = str(Path("runs") / dataset_name(c.dataset))
        if c.recipe is None:
            c.recipe = "finetune" if c.weights else "pretrain"
        if c.recipe == "pretrain":
            # The paper: Adam(0.9, 0.999), weight decay 0.1, lr 1e-3 for batch 4096 (scaled below).
            defaults = dict(epochs=300, learning_rate=1e-3, base_batch_size=4096, weight_decay=0.1)
        elif c.recipe == "finetune-adamw":
            # MAE's fine-tune of ViT-B (its Table 9, after BEiT): AdamW(0.9, 0.999), base lr
            # 5e-4 for batch 256 (scaled linearly), weight decay 0.05, layer decay 0.65, label
            # smoothing 0.1, no clipping; 10 epochs (MAE: 100 on ImageNet).
            defaults = dict(epochs=10, learning_rate=5e-4, base_batch_size=256, weight_decay=0.05, label_smoothing=0.1)
            if not c.freeze_backbone:
                defaults["layer_decay"] = 0.65
        elif c.freeze_backbone:
            # MAE's linear probe (its Table 10): base lr 0.1 for batch 256 (scaled linearly), 90
            # epochs, no weight decay; SGD momentum 0.9 here (MAE: LARS), no clipping.
            defaults = dict(epochs=90, learning_rate=0.1, base_batch_size=256, weight_decay=0.0)
        else:
            # Fine-tuning: SGD momentum 0.9, batch 512, lr 0.01 for it (scaled below), clip at 1.
            defaults = dict(epochs=10, learning_rate=0.01, base_batch_size=512, weight_decay=0.0)
            c.clip_norm = 1.0 if c.clip_norm is None else c.clip_norm
        if c.is_digits:
            if c.preset is None:  # the digits model, or the architecture of the weights, seen whole
                digits_model = {"crop_fraction": 1.0} if c.weights else DIGITS_MODEL
                c.model = {**digits_model, **c.model}
            # No flips (a mirrored digit is another symbol) and no crops (an 8x8 digit has no
            # border to spare): small rotations, zooms, shears and shifts, as handwriting varies.
            defaults.update(flip=False, augment="affine", label_smoothing=0.1)
            if c.recipe == "pretrain":  # the digits model from scratch (fine-tuning keeps the paper's recipe)
                defaults.update(epochs=130, learning_rate=1e-3, base_batch_size=32, weight_decay=0.05)
        defaults = {"flip": True, "augment": "inception", "label_smoothing": 0.0, "batch_size": 32, **defaults}
        if not c.protocol:  # a protocol's warm-up is counted in steps, once the run's length is known
            defaults["warmup_fraction"] = 0.1
        if c.steps is not None:
            defaults.pop("epochs")
        for key, value in defaults.items():
            if getattr(c, key) is None:
                setattr(c, key, value)
        return c

    def to_dict(self):
        """The options as plain YAML/JSON values (tuples become lists), accepted by `from_dict`."""
        return to_plain_dict(self)

    @classmethod
    def from_dict(cls, values):
        """The config of a dict of options (as `to_dict` gives); an unknown option is a ValueError
        naming the closest one."""
        check_fields(cls, values, "training option")
        return cls(**values)

    @classmethod
    def from_yaml(cls, path, **overrides):
        """Reads a YAML file of TrainConfig fields; `overrides` (e.g. command-line flags) win."""
        return cls.from_dict({**read_yaml_options(path, "training option"), **overrides})


def dataset_name(dataset):
    """A dataset's short name: "digits", a tfds name without its version ("tfds:cifar10:3.0.2":
    "cifar10"; a config's slash as a dash), a folder's own name."""
    if dataset.startswith("tfds:"):
        return dataset[5:].split(":")[0].replace("/", "-")
    return dataset if dataset == "digits" else Path(dataset).resolve().name


def _spelled(name):
    """A training option's name in words ("learning_rate": "learning rate"), for messages that the
    Python API, a YAML file and the command line's flags (`--learning-rate`) all lead to."""
    return name.replace("_", " ")


# Numeric options and their ranges: (name, low, high) is [low, high); high None: finite, above low.
_RANGES = (
    ("learning_rate", 0.0, None),
    ("base_batch_size", 0, None),
    ("clip_norm", 0.0, None),
    ("weight_decay", 0.0, float("inf")),
    ("label_smoothing", 0.0, 1.0),
    ("warmup_fraction", 0.0, 1.0),
    ("mixup", 0.0, float("inf")),
    ("cutmix", 0.0, float("inf")),
    ("head_lr_scale", 0.0, None),
)


def _with_protocol(c):
    """`c` with its protocol's settings wherever it leaves them open (see `recipes.PROTOCOLS`)."""
    from keras_vit.training import recipes

    protocol = recipes.PROTOCOLS[c.protocol]
    c.recipe = "finetune"
    if c.dataset is None:
        if protocol["dataset"] is None:
            raise ValueError(
                f"protocol {c.protocol} names no dataset: pass --dataset (the task's tfds name or folder)."
            )
        c.dataset = protocol["dataset"]
    for key in ("train_split", "eval_split"):  # the splits of the protocol's own dataset
        if getattr(c, key) is None and c.dataset == protocol["dataset"]:
            setattr(c, key, protocol[key])
    if c.steps is None and c.epochs is None:
        c.steps = protocol["steps"]
    if c.learning_rate is None:
        c.learning_rate = protocol["learning_rates"][0]
    if c.base_batch_size is None:
        c.base_batch_size = recipes.PROTOCOL_BATCH
    if c.global_batch_size is None and c.batch_size is None:
        c.global_batch_size = recipes.PROTOCOL_BATCH
    c.model = {"image_size": recipes.PROTOCOL_IMAGE_SIZE, "crop_fraction": 1.0, **c.model}
    return c
