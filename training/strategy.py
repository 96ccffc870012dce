"""Choosing where training runs: one device, mirrored GPUs/CPUs, many workers, TPU, or
Keras's DataParallel distribution under the JAX backend."""

import contextlib
import json
import os

import keras

from keras_vit.cpu import has_bf16_instructions


class Placement:
    """The distribution of a run: `scope()` to build the model in, and the replica count.

    `supports_jit`: whether XLA can compile the step there at all. `prefers_jit`: whether XLA
    is the default there. On TensorFlow CPU-only machines it is not: on 2 Zen 4 cores TensorFlow's
    graph mode (oneDNN kernels) trained a CIFAR-size ViT 14% faster in float32 and 48% faster in
    mixed_bfloat16 than XLA, ViT-Ti/16 at par in float32 and 48% faster in mixed_bfloat16, and
    traced its first step in 6 s instead of 10 s. On 2 Zen 5 cores it stayed ahead (Ti/16 5%
    float32, bf16 29-33%, first step 5.8 s against 12.1 s) except CIFAR-size float32, 7% behind
    (docs/performance.md). On 2 AVX2-only Zen 3 cores (no bf16 instructions) graph mode was
    0.95x XLA for Ti/16 and 1.01x for CIFAR-size in float32, but 0.62x and 0.71x in
    mixed_bfloat16: on a CPU without bfloat16 instructions (`keras_vit.cpu`),
    mixed_bfloat16 therefore prefers XLA. Keras's own `jit_compile="auto"` leaves XLA off on
    CPU-only machines."""

    def __init__(self, strategy=None, replicas=1, description="one device", supports_jit=True, prefers_jit=True):
        self.strategy = strategy
        self.replicas = replicas
        self.description = description
        self.supports_jit = supports_jit
        self.prefers_jit = prefers_jit
        self.task_index = 0  # multi-worker: this worker's index; 0 is the chief

    @property
    def is_chief(self):
        return self.task_index == 0

    def scope(self):
        return self.strategy.scope() if self.strategy is not None else contextlib.nullcontext()


def make_placement(config):
    if keras.backend.backend() == "jax":
        return _jax_placement(config)
    if keras.backend.backend() == "torch":
        _one_device_under_torch(config)
    if config.model_parallel > 1:
        raise ValueError("model parallel (--model-parallel) runs under the JAX backend (KERAS_BACKEND=jax).")
    if int(os.environ.get(PROCESS_VARIABLES["num_processes"], "1") or 1) > 1:
        raise ValueError(
            "several processes (--num-processes) are for the JAX backend; TensorFlow's workers use "
            "--strategy multi_worker with TF_CONFIG."
        )
    import tensorflow as tf

    name = "one_device" if keras.backend.backend() == "torch" else config.strategy
    # Physical devices: listing logical ones starts TensorFlow's context, after which
    # multi-worker collectives can no longer be configured.
    gpus = tf.config.list_physical_devices("GPU")
    if name == "auto":
        name = "tpu" if (config.tpu or os.environ.get("TPU_NAME")) else ("mirrored" if len(gpus) > 1 else "one_device")
    if name == "one_device":
        device = "/gpu:0" if gpus else "/cpu:0"
        return Placement(
            tf.distribute.OneDeviceStrategy(device),
            1,
            f"one device ({device})",
            prefers_jit=bool(gpus) or _xla_beats_graph_on_cpu(config),
        )
    if name == "mirrored":
        gpus = tf.config.list_logical_devices("GPU")
        devices = [d.name for d in gpus] or [d.name for d in tf.config.list_logical_devices("CPU")]
        strategy = tf.distribute.MirroredStrategy(devices)
        # XLA on CPU compiles the replicated step onto one device and then cannot reach the
        # other replicas' variables: mirrored CPU devices (tests, debugging) run without jit.
        return Placement(
            strategy,
            strategy.num_replicas_in_sync,
            f"mirrored over {', '.join(devices)}",
            supports_jit=bool(gpus) or len(devices) == 1,
            prefers_jit=bool(gpus),
        )
    if name == "multi_worker":
        if "TF_CONFIG" not in os.environ:
            raise ValueError("strategy multi_worker needs TF_CONFIG (the cluster and this worker's task).")
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        task = json.loads(os.environ["TF_CONFIG"]).get("task", {})
        # XLA has no collectives on CPU devices ("not yet implemented"): CPU workers run without jit.
        placement = Placement(
            strategy,
            strategy.num_replicas_in_sync,
            f"multi-worker ({task})",
            supports_jit=bool(gpus),
            prefers_jit=bool(gpus),
        )
        placement.task_index = int(task.get("index", 0)) if task.get("type", "worker") in ("worker", "chief") else 1
        return placement
    if name == "tpu":
        try:  # a name or address it cannot reach: a bare URLError or NotFoundError otherwise
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=config.tpu or "")
        except (OSError, ValueError, tf.errors.OpError) as error:
            where = f"TPU {config.tpu!r}" if config.tpu else "a TPU (TPU_NAME or this machine's)"
            raise RuntimeError(f"cannot reach {where}: {error}") from None
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        strategy = tf.distribute.TPUStrategy(resolver)
        return Placement(strategy, strategy.num_replicas_in_sync, f"TPU {config.tpu or ''}".strip())
    raise ValueError(f"unknown strategy {name!r}.")


def _one_device_under_torch(config):
    """Under PyTorch `train` runs on one device: several devices or processes are refused in
    one line that names the backends that scale out."""
    processes = int(os.environ.get(PROCESS_VARIABLES["num_processes"], "1") or 1)
    several = [
        *([f"--strategy {config.strategy}"] if config.strategy not in ("auto", "one_device") else []),
        *([f"--model-parallel {config.model_parallel}"] if config.model_parallel > 1 else []),
        *([f"--num-processes {processes}"] if processes > 1 else []),
    ]
    if several:
        raise ValueError(
            f"{' and '.join(several)}: the PyTorch backend trains on one device; scale out under JAX "
            "(KERAS_BACKEND=jax: every device, --model-parallel, --num-processes) or TensorFlow "
            "(--strategy mirrored, multi_worker with TF_CONFIG, tpu)."
        )


def _xla_beats_graph_on_cpu(config):
    # Without bf16 instructions oneDNN has no bf16 kernels and graph mode falls back to Eigen's;
    # mixed_bfloat16 trained 1.4-1.6x faster under XLA on 2 AVX2-only Zen 3 cores (docstring
    # of Placement). Unknown CPUs (None) keep graph mode. Under PyTorch jit means torch.compile,
    # which took 3 min to compile a 24k-parameter model's bf16 step (8 steps eager: 19 s).
    return (
        keras.backend.backend() == "tensorflow"
        and config.precision == "mixed_bfloat16"
        and has_bf16_instructions() is False
    )


def batch_multiple(batch_size=None):
    """What every evaluation batch's size must divide by under a Keras distribution on JAX
    (its data-parallel axis), else 1 (tf.distribute strategies split uneven batches
    themselves). With several processes every batch is a whole global batch: Keras gives each
    process an equal slice of each batch, so `batch_size` (rounded up to the axis) then is the
    multiple."""
    if keras.backend.backend() != "jax" or keras.distribution.distribution() is None:
        return 1
    distribution = keras.distribution.distribution()
    mesh = distribution.device_mesh
    replicas = int(mesh.shape[list(mesh.axis_names).index(distribution.batch_dim_name)])
    if batch_size is not None and process_count() > 1:
        return -(-batch_size // replicas) * replicas
    return replicas


# The environment variables of `keras.distribution.initialize` (one home for their names).
PROCESS_VARIABLES = dict(
    job_addresses="KERAS_DISTRIBUTION_JOB_ADDRESSES",
    num_processes="KERAS_DISTRIBUTION_NUM_PROCESSES",
    process_id="KERAS_DISTRIBUTION_PROCESS_ID",
)


def process_count():
    """The processes of this JAX job (1 on TensorFlow, where workers are tf.distribute's)."""
    if keras.backend.backend() != "jax":
        return 1
    import jax

    return jax.process_count()


def agree(flag):
    """Process 0's `flag` on every process (a time-based choice must be the same everywhere)."""
    if process_count() == 1:
        return flag
    import numpy as np
    from jax.experimental import multihost_utils

    return bool(multihost_utils.broadcast_one_to_all(np.asarray(flag)))


def this_process_only():
    """A scope in which this process computes on its own devices alone (DataParallel over
    them, its data not split with the other processes). With several JAX processes every
    computation over the job's devices must run in all of them at once, so what the chief does
    alone (copying the weights to save them, the final evaluation) runs in this scope; with one
    process it changes nothing."""
    if process_count() == 1:
        return contextlib.nullcontext()
    import jax

    return keras.distribution.DataParallel(devices=jax.local_devices(), auto_shard_dataset=False).scope()


def _start_processes():
    """Joins the job the `KERAS_DISTRIBUTION_*` variables describe (several JAX processes, one
    per host or per accelerator group); nothing to do for one process."""
    import jax

    count = int(os.environ.get(PROCESS_VARIABLES["num_processes"], "1") or 1)
    if count <= 1 or jax.distributed.is_initialized():
        return
    missing = [v for v in PROCESS_VARIABLES.values() if not os.environ.get(v)]
    if missing:
        raise ValueError(f"{count} processes need {', '.join(missing)} as well.")
    # CPU devices talk over Gloo (TCP); GPUs and TPUs bring their own collectives.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    keras.distribution.initialize()


def _jax_placement(config):
    import jax

    from keras_vit import ViT

    if config.strategy in ("multi_worker", "tpu"):
        raise ValueError(
            f"strategy {config.strategy} is for the TensorFlow backend; under JAX use auto (Keras "
            "DataParallel over every device of the job; several processes join with --num-processes, "
            "--process-id and --job-addresses)."
        )
    _start_processes()
    devices = jax.devices()
    processes = jax.process_count()
    where = f"{len(devices)} {devices[0].platform} devices" + (f" in {processes} processes" if processes > 1 else "")
    ways = config.model_parallel
    if ways > 1:
        local = jax.local_device_count()
        if local % ways:
            holder = f"each process's {local} devices" if processes > 1 else f"the {local} device{'s' * (local > 1)}"
            raise ValueError(
                f"--model-parallel {ways} must divide {holder} (a model replica lies within one process); "
                f"choose one of {', '.join(str(d) for d in range(1, local + 1) if local % d == 0)}."
            )
        # Each process's devices together: every row of the mesh (a model replica) lies within
        # one process, and the batch axis runs over all of them.
        devices = sorted(devices, key=lambda d: (d.process_index, d.id))
        mesh = keras.distribution.DeviceMesh((len(devices) // ways, ways), ("batch", "model"), devices)
        layout_map = ViT.get_layout_map(mesh, "model", "batch")
        keras.distribution.set_distribution(
            keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")
        )
        placement = Placement(
            None,
            len(devices) // ways,
            f"Keras ModelParallel over {where}, mesh {len(devices) // ways} x {ways} (batch x model)",
        )
    elif (config.strategy == "one_device" and processes == 1) or len(devices) == 1:
        placement = Placement(None, 1, f"one device ({devices[0]})")
    else:
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
        placement = Placement(None, len(devices), f"Keras DataParallel over {where}")
    placement.task_index = jax.process_index()
    return placement
