"""Callbacks of a run: atomic best/last checkpoints, resume state at most every so many
seconds and at a stop, and a clean stop on a NaN loss, Ctrl-C or SIGTERM."""

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
import numpy as np

from keras_vit.names import RUN_CHECKPOINTS
from keras_vit.saving import inference_copy, save_model
from keras_vit.training.strategy import agree, this_process_only

logger = logging.getLogger("keras_vit")
_PARTIAL = ".partial"  # the name a resume-state file has until it is complete


class _Every:
    """True on the first call (unless `first=False`), then once at least `seconds` have passed
    since the last True."""

    def __init__(self, seconds):
        self.seconds = float(seconds)
        self._last = None

    def __call__(self, first=True):
        now = time.monotonic()
        if self._last is None and not first:
            self._last = now
            return False
        if self._last is not None and now - self._last < self.seconds:
            return False
        self._last = now
        return True


def _ends_epoch(callback, batch):
    """Whether `batch` (its index in this `fit`'s epoch; a call's last) is the epoch's last."""
    return batch + 1 >= ((callback.params or {}).get("steps") or math.inf)


def _is_last_epoch(callback, epoch):
    return epoch + 1 >= callback.params.get("epochs", 0) if callback.params else True


class _StepsInEpoch(keras.callbacks.Callback):
    """Where training stands within an epoch: `epoch` (0-based) and `step(batch)`, the steps of
    the epoch done after `batch`, counting the `first_step` ones a resumed epoch did before this
    `fit` (set by the caller; it applies to the fit's first epoch only)."""

    def __init__(self):
        super().__init__()
        self.epoch = 0
        self.first_step = 0

    def step(self, batch):
        return self.first_step + batch + 1

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        self.first_step = 0


class ResumeState(_StepsInEpoch):
    """The run's resume state in `backup_dir`: the weights with the optimizer's state, and where
    training stands (epochs done, steps done of the next one). `restore` brings it back before
    `fit`, which then starts there (`train_pipeline(start_step=...)` reads on from the same
    example).

    Written after the first and the last epoch; once `interval` seconds have passed, at an
    epoch's end or, `within_epochs` (one process), at a step's end (0: after every epoch; the
    interval grows to 19 times the last save's duration, so saving takes at most a 20th of the
    time); and at the step after which `stopping()` turns true (Ctrl-C, SIGTERM:
    `StopOnInterrupt.pending`). A stopped run loses no step, a killed one the steps since the
    last save. The weights go to a file of their own and the position, which names it, is
    renamed into place: a kill while saving leaves the previous state whole. The run deletes
    the state once its evaluation is written, so a run stopped while evaluating evaluates again
    rather than training again."""

    POSITION = "position.json"  # names the state's weights and random-state files
    # The state earlier versions wrote (Keras's BackupAndRestore names), still read; a new name
    # keeps them from reading a state of this version as one without weights.
    LEGACY_POSITION, LEGACY_WEIGHTS = "training_metadata.json", "latest.weights.h5"

    def __init__(self, backup_dir, interval=30.0, global_batch=None, within_epochs=False, stopping=None):
        super().__init__()
        self.backup_dir = Path(backup_dir)
        self.within_epochs = within_epochs
        self._interval = float(interval)
        self._due = _Every(interval)
        self._global_batch = global_batch  # recorded with the state: a resumed run keeps its batch
        self._stopping = stopping or (lambda: False)
        self._first_epoch = True
        self.saw_stop = False  # whether a stop was pending when the last epoch's end decided
        self._torch_generators = {}  # PyTorch generator states to set at the next fit's first step

    def restore(self):
        """Loads the saved weights, optimizer state and random-generator states (dropout's,
        stochastic depth's) into the model (built, its optimizer too); returns `(epochs done,
        steps done of the next epoch)`, `(0, 0)` without a state."""
        path = _position_file(self.backup_dir)
        if path is None:
            return 0, 0
        try:
            position = json.loads(path.read_text())
            self.model.load_weights(self.backup_dir / position.get("weights", self.LEGACY_WEIGHTS))
            if position.get("seeds"):
                with np.load(self.backup_dir / position["seeds"]) as saved:
                    states = _seed_states(self.model)
                    count = sum(k[0] == "s" and k[1:].isdigit() for k in saved.files)
                    if count != len(states):
                        raise ValueError(f"{count} random-generator states for {len(states)}")
                    for i, variable in enumerate(states):
                        variable.assign(saved[f"s{i}"])
                    self._torch_generators = {k: saved[k] for k in saved.files if k.startswith("torch_")}
            epoch, step = int(position["epoch"]), int(position.get("step", 0))
        except (OSError, ValueError, KeyError, TypeError) as error:  # h5py: OSError; damaged JSON: ValueError
            raise OSError(
                f"the resume state in {self.backup_dir} cannot be read ({error}); remove that folder to train "
                "this run again from its first epoch"
            ) from error
        where = f"step {step} of epoch {epoch + 1}" if step else f"epoch {epoch}"
        logger.info("keras_vit: resuming after %s, from the resume state in %s", where, self.backup_dir)
        return epoch, step

    def on_train_batch_begin(self, batch, logs=None):
        # PyTorch's generators as they were where training stopped, set once `fit` has drawn
        # from them for itself (its DataLoader's seed, a build's dropout), which the
        # uninterrupted run did once, not at each fit.
        if self._torch_generators:
            _set_torch_generators(self._torch_generators)
            self._torch_generators = {}

    def on_train_end(self, logs=None):
        self._torch_generators = _torch_generators()  # for the next fit of the run (after a resumed epoch)

    def on_train_batch_end(self, batch, logs=None):
        if not self.within_epochs or _ends_epoch(self, batch):  # the epoch's end saves
            return
        if self._stopping() or (self._due.seconds > 0 and self._due(first=False)):
            self._save(self.epoch, self.step(batch))

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        first, self._first_epoch = self._first_epoch, False
        self.saw_stop = self._stopping()  # a later signal waits for the next step's end (StopOnInterrupt)
        # Several JAX processes: process 0's clock decides for all.
        if agree(self._due() or first or _is_last_epoch(self, epoch) or self.saw_stop):
            self._save(epoch + 1, 0)

    @classmethod
    def saved_epochs(cls, backup_dir):
        """The epochs done in the resume state in `backup_dir`, or None when it has none."""
        return _saved(backup_dir, "epoch")

    @classmethod
    def saved_step(cls, backup_dir):
        """The steps done of the next epoch in the resume state in `backup_dir`, or None."""
        return _saved(backup_dir, "step")

    @classmethod
    def saved_global_batch(cls, backup_dir):
        """The global batch the resume state in `backup_dir` was trained at, or None."""
        return _saved(backup_dir, "global_batch")

    def _save(self, epoch, step):
        """Writes the weights and the random-generator states to files of their own, then
        renames the position, which names them, into place: the one rename that replaces the
        state. Older files go after."""
        began = time.monotonic()
        if hasattr(self.model, "jax_state_sync"):  # JAX keeps the state apart from the variables during fit
            self.model.jax_state_sync()
        self.backup_dir.mkdir(parents=True, exist_ok=True)
        stem = f"state-{epoch}-{step}"
        partial = self.backup_dir / (_PARTIAL + ".weights.h5")  # Keras needs the suffix
        self.model.save_weights(partial, overwrite=True)
        os.replace(partial, self.backup_dir / f"{stem}.weights.h5")
        state = {"epoch": epoch, "step": step, "global_batch": self._global_batch, "weights": f"{stem}.weights.h5"}
        # Keras's weights files leave out the random generators' states (SeedGenerator).
        seeds = {f"s{i}": keras.ops.convert_to_numpy(v) for i, v in enumerate(_seed_states(self.model))}
        seeds.update(_torch_generators())
        if seeds:
            with open(self.backup_dir / (_PARTIAL + ".npz"), "wb") as file:
                np.savez(file, **seeds)
            os.replace(self.backup_dir / (_PARTIAL + ".npz"), self.backup_dir / f"{stem}.seeds.npz")
            state["seeds"] = f"{stem}.seeds.npz"
        position = self.backup_dir / (_PARTIAL + ".json")
        position.write_text(json.dumps(state))
        os.replace(position, self.backup_dir / self.POSITION)
        kept = {self.POSITION, state["weights"], state.get("seeds")}
        for older in [*self.backup_dir.glob("state-*"), *self.backup_dir.glob("latest.weights.h5*")]:
            if older.name not in kept:
                older.unlink(missing_ok=True)
        (self.backup_dir / self.LEGACY_POSITION).unlink(missing_ok=True)
        if self._interval > 0:  # saving takes at most a 20th of the time (a large model's state: GBs)
            self._due.seconds = max(self._interval, 19 * (time.monotonic() - began))


def _seed_states(model):
    """The model's random generators' state variables (dropout, stochastic depth), in order."""
    return [v for v in model.non_trainable_variables if v.name == "seed_generator_state"]


def _torch_generators():
    """PyTorch's global generators' states (its Keras backend draws unseeded dropout from them)."""
    if keras.backend.backend() != "torch":
        return {}
    import torch

    states = {"torch_cpu": torch.get_rng_state().numpy()}
    if torch.cuda.is_available():
        states.update({f"torch_cuda{i}": s.numpy() for i, s in enumerate(torch.cuda.get_rng_state_all())})
    return states


def _set_torch_generators(states):
    if keras.backend.backend() != "torch" or "torch_cpu" not in states:
        return
    import torch

    torch.set_rng_state(torch.from_numpy(states["torch_cpu"]))
    cuda = [f"torch_cuda{i}" for i in range(torch.cuda.device_count())]
    if cuda and all(name in states for name in cuda):  # the same number of GPUs
        torch.cuda.set_rng_state_all([torch.from_numpy(states[name]) for name in cuda])


def _position_file(backup_dir):
    for name in (ResumeState.POSITION, ResumeState.LEGACY_POSITION):
        if (Path(backup_dir) / name).is_file():
            return Path(backup_dir) / name
    return None


def _saved(backup_dir, key):
    try:
        return int(json.loads(_position_file(backup_dir).read_text())[key])
    except (AttributeError, OSError, ValueError, KeyError, TypeError):  # AttributeError: no position file
        return None


class StopAfterEpoch(keras.callbacks.Callback):
    """Ends `fit` after its first epoch (a resumed epoch's remaining steps)."""

    def on_epoch_end(self, epoch, logs=None):
        self.model.stop_training = True


class AtomicCheckpoint(keras.callbacks.Callback):
    """Saves `last.keras` after the first epoch, then once `interval` seconds have passed and
    after the last epoch, and `best.keras` whenever `monitor` improves (with `last.keras` when
    `monitor` is None), each written to a temporary file and renamed, so a kill never leaves a
    half-written model, and without the optimizer, so it loads wherever keras_vit is imported
    (`backup/` holds the resumable state). Epochs whose loss is not finite are never saved.
    `saved`: the model that is saved, when `fit` trains a part of it (a linear probe's head);
    default: the model trained."""

    def __init__(self, run_dir, monitor="val_accuracy", interval=0.0, saved=None):
        super().__init__()
        self.run_dir = Path(run_dir)
        self.saved = saved
        self.monitor = monitor
        self.best = -math.inf
        self._due = _Every(interval)
        self._copy = None  # the uncompiled model that is saved, its weights updated each epoch

    def on_train_begin(self, logs=None):
        # A resumed run: ResumeState brings back the weights, not the best value so far,
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
            self._copy = inference_copy(self.saved or self.model, into=self._copy)
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


class StopOnNaN(_StepsInEpoch):
    """Stops training at the first non-finite loss and remembers where (`reason`)."""

    def __init__(self):
        super().__init__()
        self.reason = None

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            self.reason = f"loss became {float(loss)} at epoch {self.epoch + 1}, step {self.step(batch)}"
            self.model.stop_training = True


class Interrupted(KeyboardInterrupt):
    """The KeyboardInterrupt `StopOnInterrupt` raises; `signum` names the signal (SIGINT, SIGTERM)."""

    def __init__(self, signum=signal.SIGINT):
        self.signum = signal.Signals(signum)
        super().__init__(self.signum.name)


class StopOnInterrupt(keras.callbacks.Callback):
    """Ctrl-C (SIGINT) or SIGTERM (`kill`, `docker stop`, a scheduler's preemption) stops `fit`
    or `evaluate` with `Interrupted` at the next step's end (after an epoch's last step or in
    its validation: at the epoch's end, validated and saved whole). Raised
    from Python's own handler,
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
        self._training = False
        self.saver = None  # the run's ResumeState, which saves where the stop comes

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

    @property
    def pending(self):
        """Whether a signal waits to stop the run at the next step's end."""
        return self._pending is not None

    def _raise_pending(self, *args, **kwargs):
        if self._pending is not None:
            signum, self._pending = self._pending, None
            raise Interrupted(signum)

    def on_train_begin(self, logs=None):
        self._training = True

    def on_train_end(self, logs=None):
        self._training = False

    def on_train_batch_end(self, batch, logs=None):
        if not _ends_epoch(self, batch):  # after an epoch's last step: at its end, validated and saved
            self._raise_pending()

    def on_test_batch_end(self, batch, logs=None):
        if not self._training:  # `fit`'s validation goes on to the epoch's end
            self._raise_pending()

    def on_epoch_end(self, epoch, logs=None):
        # A signal that came after `saver` (a `ResumeState`) decided whether to save at this
        # epoch's end is raised at the next step's end, where the state is saved first.
        if not self._training or self.saver is None or self.saver.saw_stop:
            self._raise_pending()
