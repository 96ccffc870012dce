"""pytest set-up: full float32 matmuls on every backend, the tensorflow_only and
backend_independent markers. Helpers that tests import live in helpers.py."""

import gc

import keras
import pytest


def _exact_float32_matmuls():
    """On GPUs, JAX and TensorFlow run float32 matmuls and convolutions in TF32 by default, and
    torch its cuDNN convolutions: about 1e-3 from float32 on a ViT's logits, which the parity
    tests would read as a wrong model (seen on an H100 under JAX: 2.5e-3 against the 1e-4
    bar). The tests check the float32 math, so they ask every backend for full float32."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        jax.config.update("jax_default_matmul_precision", "highest")
    elif backend == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_tensor_float_32_execution(False)
    elif backend == "torch":
        import torch

        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False


_exact_float32_matmuls()


def pytest_collection_modifyitems(config, items):
    if keras.backend.backend() == "tensorflow":
        return
    skip = pytest.mark.skip(reason=f"needs the TensorFlow backend (this run: {keras.backend.backend()})")
    once = pytest.mark.skip(reason="checks nothing the Keras backend changes: run in the TensorFlow pass")
    for item in items:
        if "tensorflow_only" in item.keywords:
            item.add_marker(skip)
        elif "backend_independent" in item.keywords:
            item.add_marker(once)


def pytest_collection_finish(session):
    """The objects of the imports and the collected tests are kept out of the garbage collector's
    full passes (`gc.freeze`): in a test worker that has imported TensorFlow, PyTorch, timm and
    transformers, each pass visited them all, a tenth of the time of the training tests."""
    gc.collect()
    gc.freeze()
