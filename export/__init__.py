"""keras_vit.export: SavedModel for TF Serving and LiteRT/TFLite for devices.

Installed as `keras_vit.export` (see `package_dir` in setup.cfg). TensorFlow-only code
(SavedModel, LiteRT, tensorflow-model-optimization) belongs here.
"""
