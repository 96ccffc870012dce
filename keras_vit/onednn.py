"""TensorFlow's oneDNN CPU kernels, asked for before TensorFlow loads."""

import os
import platform

# TensorFlow 2.21 turns its oneDNN kernels on by itself only on x86 CPUs with AVX-512-class
# features; on an AVX2-only CPU (2 AMD Zen 3 cores) it left them off, and keras_vit ran on
# Eigen's kernels: ViT-S/16 inference 1.14-1.75x and ViT-Ti/16 `fit` 1.27-1.44x slower than
# with oneDNN on (docs/performance.md).


def prefer_onednn():
    """Sets `TF_ENABLE_ONEDNN_OPTS=1` on x86-64 unless the variable is set already (`0` keeps
    them off). TensorFlow reads it once, when it loads: `import keras_vit` calls this before
    it imports Keras, so it holds wherever keras_vit is imported before TensorFlow."""
    if platform.machine().lower() in ("x86_64", "amd64"):
        os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
