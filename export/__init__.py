"""keras_vit.export: SavedModel for TF Serving and LiteRT/TFLite for devices.

Installed as `keras_vit.export` (see `package_dir` in setup.cfg). TensorFlow-only code
(SavedModel, LiteRT, tensorflow-model-optimization) belongs here.

    from keras_vit.training import export_samples   # the run's data (training application)
    source = load_source("runs/digits")               # best checkpoint and labels
    source = source.with_data(export_samples(source.model, "runs/digits"))
    config = ExportConfig(saved_model_dir="export/serving", tflite_dir="export/tflite", modes=("float32", "int8"))
    report = export(source, config)    # or ExportConfig.from_yaml("export.yaml", name="digits")
    load_exported("export/serving").probabilities([open("photo.jpg", "rb").read()])  # as TF Serving answers
"""

from keras_vit.export.config import ExportConfig
from keras_vit.export.exported import load_exported
from keras_vit.export.exporter import export
from keras_vit.export.frozen import freeze
from keras_vit.export.litert import MODES, LiteRTModel, check_ops, convert, keras_module
from keras_vit.export.serving import save_serving_model
from keras_vit.export.source import ExportError, ExportSource, load_source

__all__ = [
    "MODES",
    "ExportConfig",
    "ExportError",
    "ExportSource",
    "LiteRTModel",
    "check_ops",
    "convert",
    "export",
    "freeze",
    "keras_module",
    "load_exported",
    "load_source",
    "save_serving_model",
]
