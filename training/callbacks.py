"""Callbacks of a run: atomic best/last checkpoints and a clean stop on a NaN loss."""

import math
import os
from pathlib import Path

import keras


class AtomicCheckpoint(keras.callbacks.Callback):
    """Saves `last.keras` after every epoch and `best.keras` when `monitor` improves, each
    written to a temporary file and renamed, so a kill never leaves a half-written model.
    Epochs whose loss is not finite are never saved."""

    def __init__(self, run_dir, monitor="val_accuracy"):
        super().__init__()
        self.run_dir = Path(run_dir)
        self.monitor = monitor
        self.best = -math.inf

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        if not math.isfinite(logs.get("loss", math.nan)):
            return
        self._save("last.keras")
        value = logs.get(self.monitor)
        if value is not None and value > self.best:
            self.best = value
            self._save("best.keras")

    def _save(self, name):
        temporary = self.run_dir / f".{name}.tmp.keras"
        self.model.save(temporary)
        os.replace(temporary, self.run_dir / name)


class StopOnNaN(keras.callbacks.Callback):
    """Stops training at the first non-finite loss and remembers where (`reason`)."""

    def __init__(self):
        super().__init__()
        self.reason = None
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            self.reason = f"loss became {float(loss)} at epoch {self.epoch + 1}, step {batch + 1}"
            self.model.stop_training = True
