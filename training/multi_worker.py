"""A narrow workaround so `model.fit` runs under MultiWorkerMirroredStrategy.

Two bugs in Keras 3.15's TensorFlow trainer (tensorflow/tensorflow#72388):
1. Before `fit`, the model is built symbolically from one input batch obtained with an eager
   `strategy.reduce("MEAN", batch)`, which fails for a PerReplica batch ("Attempt to convert a
   value (PerReplica ...)"). Only the batch's shapes matter there: the local replica's value
   is used instead (patched on the model instance).
2. After each step, per-replica logs are reduced with `strategy.reduce("MEAN", v, axis=0)`,
   which fails for the scalar metric values ("Invalid reduction dimension 0 for input with 0
   dimensions"). Scalars are reduced with `axis=None` (patched in the trainer module, active
   only for multi-worker collective strategies).
Applied only to the affected Keras versions; a test fails when unpatched Keras starts to work,
so the workaround can be dropped then.
"""

import keras
import tensorflow as tf
from packaging.version import Version

AFFECTED = (Version("3.0"), Version("3.16"))  # Keras versions with the reduce-based build


def needs_patch():
    return AFFECTED[0] <= Version(keras.__version__) < AFFECTED[1]


def patch_symbolic_build(model):
    """Makes `model.fit` build from the local replica's batch instead of a cross-worker reduce."""
    if not needs_patch():
        return model
    strategy = model.distribute_strategy

    def local(value):
        return (
            strategy.experimental_local_results(value)[0]
            if isinstance(value, tf.distribute.DistributedValues)
            else value
        )

    def maybe_symbolic_build(iterator=None, data_batch=None):
        if iterator is not None:
            for _, _, it in iterator:
                data_batch = tf.nest.map_structure(local, next(it))
                break
        with strategy.scope():
            model._symbolic_build(data_batch=data_batch)

    model._maybe_symbolic_build = maybe_symbolic_build
    return model


def patch_log_reduction():
    """Reduces scalar per-replica logs over workers with `axis=None` (bug 2 above)."""
    from keras.src.backend.tensorflow import trainer

    if not needs_patch() or getattr(trainer.reduce_per_replica, "keras_vit_patched", False):
        return
    original = trainer.reduce_per_replica

    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and trainer._collective_all_reduce_multi_worker(strategy):

            def reduce(v):
                return strategy.reduce("MEAN", v, axis=None if v.shape.rank == 0 else 0)

            return tf.nest.map_structure(reduce, values)
        return original(values, strategy, reduction)

    reduce_per_replica.keras_vit_patched = True
    trainer.reduce_per_replica = reduce_per_replica


def apply(model):
    """Both workarounds, for a model compiled under MultiWorkerMirroredStrategy."""
    patch_log_reduction()
    return patch_symbolic_build(model)
