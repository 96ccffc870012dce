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
    (docs/benchmarks.md). On 2 AVX2-only Zen 3 cores (no bf16 instructions) graph mode was
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
    import tensorflow as tf

    name = config.strategy
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
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=config.tpu or "")
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        strategy = tf.distribute.TPUStrategy(resolver)
        return Placement(strategy, strategy.num_replicas_in_sync, f"TPU {config.tpu or ''}".strip())
    raise ValueError(f"unknown strategy {name!r}.")


def _xla_beats_graph_on_cpu(config):
    # Without bf16 instructions oneDNN has no bf16 kernels and graph mode falls back to Eigen's;
    # mixed_bfloat16 trained 1.4-1.6x faster under XLA on 2 AVX2-only Zen 3 cores (docstring
    # of Placement). Unknown CPUs (None) keep graph mode.
    return config.precision == "mixed_bfloat16" and has_bf16_instructions() is False


def batch_multiple():
    """What every batch's size must divide by: the data-parallel devices of the Keras
    distribution that `make_placement` set under JAX, else 1 (tf.distribute strategies split
    uneven batches themselves)."""
    if keras.backend.backend() != "jax" or keras.distribution.distribution() is None:
        return 1
    distribution = keras.distribution.distribution()
    mesh = distribution.device_mesh
    return int(mesh.shape[list(mesh.axis_names).index(distribution.batch_dim_name)])


def _jax_placement(config):
    import jax

    if config.strategy in ("multi_worker", "tpu"):
        raise ValueError(
            f"strategy {config.strategy} is for the TensorFlow backend; under JAX use auto or mirrored "
            "(Keras DataParallel over the local devices)."
        )
    devices = jax.devices()
    if config.strategy == "one_device" or len(devices) == 1:
        return Placement(None, 1, f"one device ({devices[0]})")
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
    return Placement(None, len(devices), f"Keras DataParallel over {len(devices)} {devices[0].platform} devices")
