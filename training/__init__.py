"""keras_vit.training: input pipelines, the paper's recipes and `model.fit` at scale.

    from keras_vit.training import TrainConfig, fit
    fit(TrainConfig(dataset="digits", run_dir="runs/digits"))

Installed as `keras_vit.training` (see `package_dir` in setup.cfg). TensorFlow-only code
(tf.data, tf.distribute) lives here, not in the backend-agnostic `keras_vit` library.
"""

from keras_vit.training.config import TrainConfig
from keras_vit.training.run import TrainingError, evaluate, fit, iter_predict, predict, saved_position
from keras_vit.training.samples import export_samples, held_out_images

__all__ = [
    "TrainConfig",
    "TrainingError",
    "evaluate",
    "export_samples",
    "fit",
    "held_out_images",
    "iter_predict",
    "predict",
    "saved_position",
]
