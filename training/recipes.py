"""The optimisation recipes: the paper's `pretrain` (AdamW) and `finetune` (SGD + momentum), and
`finetune-adamw` (AdamW with layer-wise learning-rate decay, as BEiT and MAE fine-tune), all with
fused per-variable updates (`optimizers.py`). Their defaults, with their sources: `config.py`
(`TrainConfig.resolved`) and docs/training.md."""

import math
import re

import keras

from keras_vit.training.optimizers import FusedAdamW, FusedSGD

# Biases, norms, the class token and the position embedding take no weight decay.
NO_DECAY = ["bias", "gamma", "beta", "token", "embedding"]
# The model's layers after its encoder blocks (keras_vit.ViT): BEiT's last layer id, with the head.
_TOP_LAYERS = ("encoder_norm", "attention_pool", "pooling", "pre_logits", "head")
_BLOCK = re.compile(r"block_(\d+)")


@keras.saving.register_keras_serializable(package="keras_vit")
class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up from 0 to `peak` over `warmup_steps`, then cosine or linear decay to 0
    at `total_steps`. With `accumulate` N the steps are optimizer updates of N accumulated
    batches: Keras calls a schedule with its count of batches, which this divides by N."""

    def __init__(self, peak, warmup_steps, total_steps, decay="cosine", accumulate=1):
        self.peak = float(peak)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)
        self.decay = decay
        self.accumulate = int(accumulate)

    def __call__(self, step):
        step = keras.ops.cast(keras.ops.floor_divide(step, self.accumulate) if self.accumulate > 1 else step, "float32")
        warmup = self.peak * step / max(self.warmup_steps, 1)
        progress = keras.ops.clip((step - self.warmup_steps) / max(self.total_steps - self.warmup_steps, 1), 0.0, 1.0)
        if self.decay == "cosine":
            decayed = 0.5 * self.peak * (1.0 + keras.ops.cos(math.pi * progress))
        else:
            decayed = self.peak * (1.0 - progress)
        return keras.ops.where(step < self.warmup_steps, warmup, decayed)

    def get_config(self):
        return {
            "peak": self.peak,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            "decay": self.decay,
            **({"accumulate": self.accumulate} if self.accumulate > 1 else {}),
        }


# The paper's fine-tuning protocols (Table 4, appendix B.1.1, and the official code's configs):
# SGD momentum 0.9, batch 512, no weight decay, global-norm clipping at 1, cosine decay after
# 500 warm-up steps (capped at 10% of a short run), fine-tuned at 384 and evaluated on the image
# resized whole. `learning_rates` is the paper's sweep; the first listed default is the
# official code's 0.03 (VTAB: the one rate it used). VTAB names no dataset: pass its task's.
PROTOCOLS = {
    "imagenet": dict(
        dataset="tfds:imagenet2012",
        train_split="train[:99%]",
        eval_split="validation",
        steps=20_000,
        learning_rates=(0.03, 0.003, 0.01, 0.06),
    ),
    "cifar10": dict(
        dataset="tfds:cifar10",
        train_split="train[:98%]",
        eval_split="test",
        steps=10_000,
        learning_rates=(0.03, 0.001, 0.003, 0.01),
    ),
    "cifar100": dict(
        dataset="tfds:cifar100",
        train_split="train[:98%]",
        eval_split="test",
        steps=10_000,
        learning_rates=(0.03, 0.001, 0.003, 0.01),
    ),
    "pets": dict(
        dataset="tfds:oxford_iiit_pet",
        train_split="train",
        eval_split="test",
        steps=500,
        learning_rates=(0.03, 0.001, 0.003, 0.01),
    ),
    "flowers": dict(
        dataset="tfds:oxford_flowers102",
        train_split="train",
        eval_split="test",
        steps=500,
        learning_rates=(0.03, 0.001, 0.003, 0.01),
    ),
    "vtab": dict(dataset=None, train_split=None, eval_split=None, steps=2_500, learning_rates=(0.01,)),
}
PROTOCOL_BATCH, PROTOCOL_WARMUP_STEPS, PROTOCOL_IMAGE_SIZE = 512, 500, 384
# The recipes that train with AdamW; the others with SGD and momentum.
ADAMW_RECIPES = ("pretrain", "finetune-adamw")


def schedule(config, num_train, global_batch):
    """`(steps_per_epoch, epochs)` of a resolved config, in training steps (micro-batches of
    `global_batch`; `config.accumulate` of them make one optimizer step): one pass over the
    training examples per epoch, in whole optimizer steps, or with `steps` (optimizer steps),
    epochs of equal length that add up to at least `steps` (at most one step per epoch more)."""
    effective = global_batch * config.accumulate
    natural = num_train // effective
    if natural < 1:
        shares = f"{config.validation_fraction:g} held out for evaluation"
        shares += f", {config.selection_fraction:g} of the rest for selection" if config.selection_fraction else ""
        held = "" if (config.dataset or "").startswith("tfds:") else f" (the data less {shares})"
        batch = f"the global batch {global_batch}"
        if config.accumulate > 1:
            batch = f"the effective batch {effective} ({config.accumulate} accumulated micro-batches of {global_batch})"
        raise ValueError(
            f"{batch} is larger than the {num_train} training examples{held}; lower the batch size"
            + (" or the held-out shares." if held else ".")
        )
    if config.steps is None:
        return natural * config.accumulate, config.epochs
    epochs = math.ceil(config.steps / natural)
    return math.ceil(config.steps / epochs) * config.accumulate, epochs


def steps_per_call(requested, steps_per_epoch, fused, resumed_step=0):
    """Training steps per compiled call (Keras's `steps_per_execution`), a divisor of
    `steps_per_epoch`: Keras runs whole calls, so on a repeated dataset a call size that did not
    divide the epoch would train past every epoch's end (44 steps in calls of 8: 48) and past
    the schedule's end at learning rate 0. A run resumed `resumed_step` steps into an epoch
    needs a divisor of the rest of that epoch too. `requested`: the user's choice, refused with
    the divisors when it does not divide. `fused`: where many steps per call pay off (the small
    digits model); the largest divisor up to 16 then, else 1."""
    whole = math.gcd(steps_per_epoch, resumed_step)  # resumed_step 0: steps_per_epoch
    if requested is None:
        return max(d for d in range(1, 17) if whole % d == 0) if fused else 1
    if whole % requested:
        divisors = [d for d in range(1, whole + 1) if whole % d == 0]
        if resumed_step:
            trains = (
                f"both the {steps_per_epoch} steps of an epoch and the {resumed_step} of the epoch this run resumes"
            )
        else:
            trains = f"the {steps_per_epoch} steps of an epoch, so Keras would train "
            trains += f"{math.ceil(steps_per_epoch / requested) * requested} per epoch"
        raise ValueError(
            f"{requested} steps per execution do not divide {trains}; choose one of {', '.join(map(str, divisors))}."
        )
    return requested


def peak_learning_rate(config, global_batch):
    """`learning_rate` scaled from `base_batch_size` to the effective batch (the global batch
    of a step times `accumulate`): with the square root of their ratio for pre-training (AdamW),
    linearly for fine-tuning (SGD, and AdamW as MAE scales it). Linear scaling took the paper's
    1e-3 at 4096 to 7.8e-6 at batch 32, where the digits model learned nothing in 40 epochs
    (18.9% held-out top-1; 8.8e-5 by the square root: 73.5%)."""
    ratio = global_batch * config.accumulate / config.base_batch_size
    return config.learning_rate * (math.sqrt(ratio) if config.recipe == "pretrain" else ratio)


def warmup_steps(config, total):
    """Warm-up steps of a resolved config's run of `total` steps: `warmup_fraction` of them, or
    for a protocol that leaves it open, the paper's 500 steps, at most a tenth of the run."""
    if config.warmup_fraction is None:
        return min(PROTOCOL_WARMUP_STEPS, total // 10)
    return int(total * config.warmup_fraction)


def layer_rates(variables, num_layers, layer_decay=1.0, head_scale=1.0):
    """{variable path: learning-rate factor} of a ViT's `variables` (those whose factor is not 1),
    BEiT's layer-wise decay: the embeddings (patch, class token, position, registers, a hybrid's
    ResNet) are layer 0, block i is layer i + 1, and the final norm, pooling and head layer
    `num_layers` + 1; layer n learns at `layer_decay` ** (`num_layers` + 1 - n) of the peak rate,
    and the head at `head_scale` times its layer's."""
    rates = {}
    for variable in variables:
        top = variable.path.split("/")[0]
        block = _BLOCK.fullmatch(top)
        if top in _TOP_LAYERS:
            factor = head_scale if top == "head" else 1.0
        else:
            factor = layer_decay ** (num_layers - int(block[1]) if block else num_layers + 1)
        if factor != 1.0:
            rates[variable.path] = factor
    return rates


def build_optimizer(config, steps_per_epoch, global_batch, epochs=None, variables=(), num_layers=0):
    """The optimizer of a resolved `TrainConfig`'s recipe, for `epochs` (default: the
    config's) of `steps_per_epoch` training steps of `global_batch` examples; with
    `accumulate` N, every N steps' gradients are averaged into one update (Keras's
    `gradient_accumulation_steps`), and the schedule counts updates. `variables`: the trained
    model's, of a ViT of `num_layers` blocks, for the config's layer decay and head scale
    (`layer_rates`)."""
    total = (epochs or config.epochs) * steps_per_epoch // config.accumulate
    peak = peak_learning_rate(config, global_batch)
    schedule = WarmupDecay(peak, warmup_steps(config, total), total, config.decay, config.accumulate)
    rates = layer_rates(variables, num_layers, config.layer_decay or 1.0, config.head_lr_scale)
    if config.recipe in ADAMW_RECIPES:
        optimizer = FusedAdamW(
            schedule,
            beta_1=0.9,
            beta_2=0.999,
            weight_decay=config.weight_decay,
            global_clipnorm=config.clip_norm,
            rates=rates,
            **_averaging(config),
        )
        optimizer.exclude_from_weight_decay(var_names=NO_DECAY)
        return optimizer
    optimizer = FusedSGD(
        schedule,
        momentum=0.9,
        global_clipnorm=config.clip_norm,
        weight_decay=config.weight_decay or None,
        rates=rates,
        **_averaging(config),
    )
    if config.weight_decay:
        optimizer.exclude_from_weight_decay(var_names=NO_DECAY)
    return optimizer


def _averaging(config):
    """Keras's gradient accumulation (`gradient_accumulation_steps`) and moving average of the
    weights (`use_ema`), where the config asks for them."""
    accumulation = dict(gradient_accumulation_steps=config.accumulate) if config.accumulate > 1 else {}
    return {**accumulation, **(dict(use_ema=True, ema_momentum=config.ema) if config.ema else {})}
