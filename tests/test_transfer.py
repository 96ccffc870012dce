"""A measured transfer: a small ViT pre-trained on the digits 0-4, published as a Hugging Face
repository in a local hub cache and fine-tuned offline through `weights="hf://me/digits-0-4"` on
the digits 5-9 with a tenth of their images labelled, beats the
same ViT trained from scratch for the same steps, by a clear margin, with each fine-tune recipe:
the full fine-tune (the paper's SGD), layer-wise learning-rate decay (AdamW, BEiT/MAE) and the
linear probe (the frozen backbone's features computed once). docs/training.md's transfer table
gives each row's accuracy and time."""

import shutil
import time

import numpy as np
import pytest
from PIL import Image

from keras_vit.training import TrainConfig, fit
from keras_vit.training.config import DIGITS_MODEL

# One worker for the module: `transfer` (pre-training and four fine-tunes) is set up once, not on
# each worker that runs one of its rows (it was, about 55 s each).
pytestmark = pytest.mark.xdist_group("transfer")

# The transfer task: digits 5-9, 10% of them for training (about 18 per class), 90% held out.
FEW_LABELS = 0.9
STEPS, BATCH = 120, 16
# What each row fine-tunes with; all start from the checkpoint and train STEPS steps of BATCH.
# The fine-tunes' heads start at zero for the new classes: they learn at 10 times the rate.
RECIPES = {
    "full fine-tune (SGD)": dict(recipe="finetune", learning_rate=0.03, base_batch_size=BATCH, head_lr_scale=10),
    "layer decay 0.65 (AdamW)": dict(
        recipe="finetune-adamw", learning_rate=1e-3, base_batch_size=BATCH, head_lr_scale=10
    ),
    "linear probe": dict(freeze_backbone=True, learning_rate=0.1, base_batch_size=BATCH),
}
# Pixels and shapes as the digits default trains them: no flips, small affine changes.
DIGITS_AUGMENT = dict(augment="affine", flip=False, label_smoothing=0.1)
# Each fine-tune's held-out top-1 over the model trained from scratch: 81 of the 807 held-out
# images (one run's binomial spread is about 1.7 points).
MARGIN = 0.10


def _digits_folder(root, digits):
    """scikit-learn's 8x8 digits of the classes `digits`, as PNG files in one folder per class."""
    from sklearn.datasets import load_digits

    data = load_digits()
    for digit in digits:
        (root / str(digit)).mkdir(parents=True)
        for i, image in enumerate(data.images[data.target == digit]):
            Image.fromarray((image * 255 / 16).astype(np.uint8)).save(root / str(digit) / f"{i}.png")
    return root


def _publish(run_dir, cache, repository, sha="0" * 40):
    """A run's `best.keras` and `labels.txt` as `hf upload` publishes them, laid out in the hub
    cache `cache` as huggingface_hub keeps a download: `models--ORG--NAME/snapshots/SHA/` and
    the ref `refs/main` naming it."""
    root = cache / f"models--{repository.replace('/', '--')}"
    (root / "snapshots" / sha).mkdir(parents=True)
    for name in ("best.keras", "labels.txt"):
        shutil.copy(run_dir / name, root / "snapshots" / sha / name)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(sha)


@pytest.fixture(scope="module")
def transfer(tmp_path_factory):
    pytest.importorskip("huggingface_hub")
    """{row: (held-out top-1, seconds, CPU seconds)} of the transfer task: from scratch, then
    each recipe from the checkpoint pre-trained on the digits 0-4 (row "pre-training": its own
    held-out top-1 on the digits 0-4)."""
    root = tmp_path_factory.mktemp("transfer")
    pretrain = TrainConfig(
        dataset=str(_digits_folder(root / "0-4", range(5))),
        run_dir=str(root / "pretrained"),
        model=DIGITS_MODEL,
        epochs=15,
        learning_rate=1e-3,
        base_batch_size=32,
        weight_decay=0.05,
        **DIGITS_AUGMENT,
    )
    began, cpu = time.monotonic(), time.process_time()
    results = {"pre-training": (fit(pretrain, verbose=0)["top1"], time.monotonic() - began, time.process_time() - cpu)}
    _publish(root / "pretrained", root / "hub", "me/digits-0-4")
    target = str(_digits_folder(root / "5-9", range(5, 10)))
    task = dict(dataset=target, validation_fraction=FEW_LABELS, steps=STEPS, batch_size=BATCH, **DIGITS_AUGMENT)
    rows = {
        "from scratch (AdamW)": dict(model=DIGITS_MODEL, learning_rate=1e-3, base_batch_size=32, weight_decay=0.05),
        **{name: dict(weights="hf://me/digits-0-4", **options) for name, options in RECIPES.items()},
    }
    with pytest.MonkeyPatch.context() as environment:
        environment.setenv("HF_HUB_CACHE", str(root / "hub"))
        environment.setenv("HF_HUB_OFFLINE", "1")
        for i, (name, options) in enumerate(rows.items()):
            began, cpu = time.monotonic(), time.process_time()
            result = fit(TrainConfig(run_dir=str(root / f"run{i}"), **task, **options), verbose=0)
            results[name] = (result["top1"], time.monotonic() - began, time.process_time() - cpu)
    print(
        "".join(
            f"\n| {name} | {top1:.1%} | {wall:.1f} s | {cpu:.1f} s |" for name, (top1, wall, cpu) in results.items()
        )
    )
    return results


@pytest.mark.tensorflow_only  # one backend measures it; tests/test_finetune.py runs the recipes on each
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_a_pretrained_checkpoint_transfers_to_a_task_with_few_labels(transfer, recipe):
    scratch = transfer["from scratch (AdamW)"][0]
    assert transfer[recipe][0] > scratch + MARGIN, transfer
