"""keras_vit.training: input pipelines, the paper's recipes and `model.fit` at scale.

Installed as `keras_vit.training` (see `package_dir` in setup.cfg). TensorFlow-only code
(tf.data, tf.distribute) belongs here, not in the backend-agnostic `keras_vit` library.
"""
