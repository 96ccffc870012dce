"""Callbacks of a run: atomic best/last checkpoints, resume state at most every so many
seconds, and a clean stop on a NaN loss or Ctrl-C."""

import csv
import json
import logging
import math
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import keras

from keras_vit.names import RUN_CHECKPOINTS
from keras_vit.saving import inference_copy, save_model
from keras_vit.training.strategy import agree, this_process_only

logger = logging.getLogger("keras_vit")
_PARTIAL = ".partial"  # the name a resume-state file has until it is complete


class _Every:
    """True on the first call, then once at least `seconds` have passed since the last True."""

    def __init__(self, seconds):
        self.seconds = float(seconds)
        self._last = None

    def __call__(self):
        now = time.monotonic()
        if self._last is not None and now - self._last < self.seconds:
            return False
        self._last = now
        return True


def _is_last_epoch(callback, epoch):
    return epoch + 1 >= callback.params.get("epochs", 0) if callback.params else True


class PeriodicBackupAndRestore(keras.callbacks.BackupAndRestore):
    """Keras's `BackupAndRestore`, writing the resume state after the first and the last epoch
    and otherwise once `interval` seconds have passed (0: every epoch). Short epochs then do
    not spend their time saving (digits: about 0.15 s of each 1 s epoch on 2 cores); a killed
    run repeats the epoch it was in and at most `interval` seconds of work before it (saves
    happen at epoch ends). Each file is written beside its place and renamed into it, so a
    kill while saving leaves the previous state whole. The state is kept when training ends:
    the run deletes it once its evaluation is written, so a run stopped while evaluating
    evaluates again rather than training again."""

    def __init__(self, backup_dir, interval=30.0, global_batch=None):
        super().__init__(backup_dir, delete_checkpoint=False)
        self._due = _Every(interval)
        self._global_batch = global_batch  # recorded with the state: a resumed run keeps its batch

    def on_train_begin(self, logs=None):
        try:  # restores the weights, the optimizer and the epoch to go on from
            super().on_train_begin(logs)
        except (OSError, ValueError) as error:  # h5py: OSError; a damaged training_metadata.json: ValueError
            raise OSError(
                f"the resume state in {self.backup_dir} cannot be read ({error}); remove that folder to train "
                "this run again from its first epoch"
            ) from error
        done = getattr(self.model, "_initial_epoch", 0)  # where Keras's restore put it
        if done and done >= (self.params or {}).get("epochs", math.inf):
            logger.info("keras_vit: all %d epochs are trained (the resume state in %s)", done, self.backup_dir)
        elif done:
            logger.info("keras_vit: resuming after epoch %d, from the resume state in %s", done, self.backup_dir)

    def on_epoch_end(self, epoch, logs=None):
        # Several JAX processes: process 0's clock decides for all.
        if agree(self._due() or _is_last_epoch(self, epoch)):
            super().on_epoch_end(epoch, logs)

    @staticmethod
    def saved_epochs(backup_dir):
        """The epochs done in the resume state in `backup_dir`, or None when it has none."""
        return _saved(backup_dir, "epoch")

    @staticmethod
    def saved_global_batch(backup_dir):
        """The global batch the resume state in `backup_dir` was trained at, or None."""
        return _saved(backup_dir, "global_batch")

    def _save_model(self):
        # Keras writes both files in place, so a kill during the write (seconds for a large
        # model and its optimizer state) would leave a state no run can load.
        os.makedirs(self.backup_dir, exist_ok=True)
        weights = os.path.join(self.backup_dir, _PARTIAL + ".weights.h5")  # Keras needs the suffix
        self.model.save_weights(weights, overwrite=True)
        metadata = os.path.join(self.backup_dir, _PARTIAL + ".json")
        with open(metadata, "w") as file:
            json.dump(
                {"epoch": self._current_epoch, "batch": self._last_batch_seen, "global_batch": self._global_batch}, file
            )
        os.replace(weights, self._weights_path)
        os.replace(metadata, self._training_metadata_path)


def _saved(backup_dir, key):
    try:
        return int(json.loads((Path(backup_dir) / "training_metadata.json").read_text())[key])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class AtomicCheckpoint(keras.callbacks.Callback):
    """Saves `last.keras` after the first epoch, then once `interval` seconds have passed and
    after the last epoch, and `best.keras` whenever `monitor` improves (with `last.keras` when
    `monitor` is None), each written to a temporary file and renamed, so a kill never leaves a
    half-written model, and without the optimizer, so it loads wherever keras_vit is imported
    (`backup/` holds the resumable state). Epochs whose loss is not finite are never saved."""

    def __init__(self, run_dir, monitor="val_accuracy", interval=0.0):
        super().__init__()
        self.run_dir = Path(run_dir)
        self.monitor = monitor
        self.best = -math.inf
        self._due = _Every(interval)
        self._copy = None  # the uncompiled model that is saved, its weights updated each epoch

    def on_train_begin(self, logs=None):
        # A resumed run: BackupAndRestore brings back the weights, not the best value so far,
        # which log.csv (Keras's CSVLogger, appending) holds.
        log = self.run_dir / "log.csv"
        if self.monitor is not None and log.is_file():
            with log.open(newline="") as file:
                values = [
                    float(row[self.monitor])
                    for row in csv.DictReader(file)
                    if row.get(self.monitor) not in (None, "", "NA")
                ]
            self.best = max([v for v in values if math.isfinite(v)], default=self.best)

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        if not math.isfinite(logs.get("loss", math.nan)):
            return
        best, last = RUN_CHECKPOINTS
        value = logs.get(self.monitor) if self.monitor is not None else None
        improved = value is not None and value > self.best
        save_last = _is_last_epoch(self, epoch) or self._due()
        if not (save_last or improved):
            return
        with this_process_only():  # the copy lives on this process's devices (only it saves)
            self._copy = inference_copy(self.model, into=self._copy)
        if save_last:
            self._save(last)
            if self.monitor is None:  # best is last: the same bytes, copied and renamed into place
                temporary = self.run_dir / ".best.keras.tmp.keras"
                shutil.copyfile(self.run_dir / last, temporary)
                os.replace(temporary, self.run_dir / best)
        if improved:
            self.best = value
            self._save(best)

    def _save(self, name):
        save_model(self._copy, self.run_dir / name)


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


class Interrupted(KeyboardInterrupt):
    """The KeyboardInterrupt `StopOnInterrupt` raises; `signum` names the signal (SIGINT, SIGTERM)."""

    def __init__(self, signum=signal.SIGINT):
        self.signum = signal.Signals(signum)
        super().__init__(self.signum.name)


class StopOnInterrupt(keras.callbacks.Callback):
    """Ctrl-C (SIGINT) or SIGTERM (`kill`, `docker stop`, a scheduler's preemption) stops `fit`
    or `evaluate` with `Interrupted` at the next step's end. Raised from Python's own handler,
    the interrupt could be lost: the main thread waits for each step where Keras converts the
    logs to NumPy, and converting a JAX array there swallows an exception raised in the middle
    (jax-ml/jax#18246), so training went on. This handler only notes the signal, which the
    callback raises between steps; a second signal raises at once. A context manager around the
    call; it changes nothing outside the main thread, and leaves a signal alone where someone
    else's handler is installed (SIGINT: other than Python's own; SIGTERM: any)."""

    _DEFAULTS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}

    def __init__(self):
        super().__init__()
        self._pending = None
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum, default in self._DEFAULTS.items():
                if signal.getsignal(signum) is default:
                    self._previous[signum] = signal.signal(signum, self._note)
        return self

    def __exit__(self, kind, value, traceback):
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}
        if kind is None:
            self._raise_pending()  # noted after the last step

    def _note(self, signum, frame):
        if self._pending is not None:
            raise Interrupted(signum)
        self._pending = signum

    def _raise_pending(self, *args, **kwargs):
        if self._pending is not None:
            signum, self._pending = self._pending, None
            raise Interrupted(signum)

    on_train_batch_end = on_test_batch_end = on_epoch_end = _raise_pending
