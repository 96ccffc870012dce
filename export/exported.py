"""Classifying images with exported files as their runtimes do: a SavedModel through its
encoded-bytes signature (what a TF Serving client sends), a `.tflite` file on LiteRT's
interpreter with each image cropped and resized to its input as the Keras model's transform does (the
crop fraction and interpolation its metadata records)."""

import json
from pathlib import Path

import numpy as np
import tensorflow as tf

from keras_vit.export.litert import LiteRTModel
from keras_vit.export.metadata import read_labels, read_record
from keras_vit.export.serving import BYTES_SIGNATURE, DATA_SPLIT_PATH
from keras_vit.export.source import ExportError
from keras_vit.names import DATA_SPLIT_FILE, IMAGE_TRANSFORM_FILE, LABELS_FILE, RUN_CHECKPOINTS
from keras_vit.saving import holds_saved_model, read_labels_file, versions
from keras_vit.transform import ImageTransform, to_channels

# Encoded images per call of the SavedModel's bytes signature.
SERVING_BATCH = 32


def is_exported(path):
    """Whether `path` is a `.tflite` file, a directory of them (`export --tflite`), a SavedModel
    directory, an `export --saved-model` directory (models.config beside `NAME/VERSION/`
    SavedModels) or a model's folder in one (`NAME`)."""
    path = Path(path)
    if any((path / name).is_file() for name in RUN_CHECKPOINTS):  # a run directory exported into
        return False
    return path.suffix == ".tflite" or holds_saved_model(path) or any(path.glob("*.tflite"))


def load_exported(path, crop=None):
    """A `SavedModelClassifier` or `TFLiteClassifier` for `path` (see `is_exported`); of an
    export directory or model folder with several versions, the newest; of a directory with one `.tflite` file,
    that file. `crop`: the centre-crop fraction a `.tflite` file's images get before resizing
    (default: the one its metadata records, the model's own; 1 for files without it); a
    SavedModel crops as it was exported."""
    path = Path(path)
    files = sorted(path.glob("*.tflite")) if path.is_dir() and not holds_saved_model(path) else []
    if len(files) > 1:
        listed = ", ".join(f.name for f in files)
        raise ExportError(f"{path} holds the LiteRT files {listed}; name one, e.g. {files[0]}.")
    path = files[0] if files else path
    if path.suffix == ".tflite":
        if not path.is_file():
            raise ExportError(f"LiteRT file not found: {path}")
        return TFLiteClassifier(path, crop)
    if crop is not None:
        raise ExportError(
            "a SavedModel crops and resizes in its own graph, as exported; --crop applies to .tflite files."
        )
    if numbered := versions(path):
        path = numbered[-1]
    elif not (path / "saved_model.pb").is_file():
        found = sorted(path.glob("*/*/saved_model.pb"), key=lambda p: (p.parent.parent.name, _version(p.parent.name)))
        names = sorted({p.parent.parent.name for p in found})
        if len(names) > 1:
            raise ExportError(f"{path} holds the SavedModels {', '.join(names)}; name one, e.g. {path / names[0]}.")
        path = found[-1].parent
    return SavedModelClassifier(path)


def _version(name):
    return int(name) if name.isdigit() else -1


class SavedModelClassifier:
    """A keras-vit SavedModel answering through `serve_image_bytes`: images decoded, resized and
    cropped by the graph itself. `labels`: its class names; `data_split`: how its training data
    was split (a dict; None when it was exported without its run)."""

    takes_bytes = True

    def __init__(self, path):
        self.path = Path(path)
        try:
            self._signature = tf.saved_model.load(str(path)).signatures[BYTES_SIGNATURE]
        except KeyError:
            raise ExportError(f"{path} has no {BYTES_SIGNATURE} signature (not written by keras-vit export).") from None
        except (OSError, ValueError, tf.errors.OpError) as error:
            raise ExportError(f"cannot load the SavedModel {path}: {' '.join(str(error).split())[:200]}") from None
        labels, data_split = self.path / "assets" / LABELS_FILE, self.path / DATA_SPLIT_PATH
        self.labels = read_labels_file(labels) if labels.is_file() else None
        self.data_split = json.loads(data_split.read_text()) if data_split.is_file() else None

    def probabilities(self, encoded):
        """`(N, classes)` probabilities of encoded JPEG/PNG/BMP/GIF/WebP images (bytes)."""
        out = [
            self._signature(image_bytes=tf.constant(encoded[start : start + SERVING_BATCH]))["probabilities"].numpy()
            for start in range(0, len(encoded), SERVING_BATCH)
        ]
        return np.concatenate(out)


class TFLiteClassifier:
    """A `.tflite` classifier with the labels and data split of its metadata (as
    `SavedModelClassifier`'s); each image's centre `crop` fraction is resized to the file's
    input with the interpolation its metadata records (`crop` None: the recorded fraction; files
    without the record: 1 and bilinear)."""

    takes_bytes = False

    def __init__(self, path, crop=None):
        data = Path(path).read_bytes()
        try:
            self._model = LiteRTModel(data)
        except (ValueError, RuntimeError) as error:
            raise ExportError(f"cannot load the LiteRT file {path}: {' '.join(str(error).split())[:200]}") from None
        self.path, self.labels, self.data_split = Path(path), read_labels(data), read_record(data, DATA_SPLIT_FILE)
        transform = read_record(data, IMAGE_TRANSFORM_FILE) or {}
        crop = transform.get("crop_fraction", 1.0) if crop is None else crop
        size = tuple(int(s) for s in self._model.input["shape"][1:3])
        self._transform = ImageTransform(size, crop, transform.get("interpolation", "bilinear"))

    def probabilities(self, images):
        """`(N, classes)` probabilities of uint8 RGB images `(H, W, 3)` of any size (for a
        grayscale file, Pillow's grayscale of them)."""
        channels = int(self._model.input["shape"][3])
        pixels = [np.asarray(self._transform(to_channels(image, channels))) for image in images]
        return self._model.predict(np.stack(pixels))
