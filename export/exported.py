"""Classifying images with exported files as their runtimes do: a SavedModel through its
encoded-bytes signature (what a TF Serving client sends), a `.tflite` file on LiteRT's
interpreter, an `.onnx` file on ONNX Runtime and an OpenVINO `.xml` file on its CPU plugin, with
each image cropped and resized to its input as the Keras model's transform does (the crop
fraction and interpolation its metadata records). A file whose export manifest (`SHA256SUMS`)
records another digest is refused."""

import json
from pathlib import Path

import numpy as np
import tensorflow as tf

from keras_vit.export import manifest
from keras_vit.export.litert import LiteRTModel
from keras_vit.export.metadata import from_properties, read_labels, read_record
from keras_vit.export.serving import BYTES_SIGNATURE, DATA_SPLIT_PATH
from keras_vit.export.source import ExportError
from keras_vit.names import DATA_SPLIT_FILE, EXPORTED_FILES, IMAGE_TRANSFORM_FILE, LABELS_FILE, RUN_CHECKPOINTS
from keras_vit.saving import holds_saved_model, read_labels_file, versions
from keras_vit.transform import ImageTransform, to_channels

# Encoded images per call of the SavedModel's bytes signature.
SERVING_BATCH = 32


def is_exported(path):
    """Whether `path` is a `.tflite`, `.onnx` or OpenVINO `.xml` file, a directory of them
    (`export --tflite`, `--onnx`, `--openvino`), a SavedModel directory, an `export --saved-model`
    directory (models.config beside `NAME/VERSION/` SavedModels) or a model's folder in one
    (`NAME`)."""
    path = Path(path)
    if any((path / name).is_file() for name in RUN_CHECKPOINTS):  # a run directory exported into
        return False
    return path.suffix in EXPORTED_FILES or holds_saved_model(path) or bool(_exported_files(path))


def _exported_files(directory):
    return sorted(f for suffix in EXPORTED_FILES for f in Path(directory).glob(f"*{suffix}"))


def load_exported(path, crop=None):
    """A `SavedModelClassifier`, `TFLiteClassifier` or `RuntimeClassifier` (ONNX, OpenVINO) for
    `path` (see `is_exported`), checked against its export manifest; of an export directory or
    model folder with several versions, the newest; of a directory with one exported file, that
    file. `crop`: the centre-crop fraction a file's images get before resizing (default: the one
    its metadata records, the model's own; 1 for files without it); a SavedModel crops as it was
    exported."""
    path = Path(path)
    files = _exported_files(path) if path.is_dir() and not holds_saved_model(path) else []
    if len(files) > 1:
        listed = ", ".join(f.name for f in files)
        runtimes = "/".join(dict.fromkeys(EXPORTED_FILES[f.suffix] for f in files))
        raise ExportError(f"{path} holds the {runtimes} files {listed}; name one, e.g. {files[0]}.")
    path = files[0] if files else path
    if path.suffix in EXPORTED_FILES:
        if not path.is_file():
            raise ExportError(f"{EXPORTED_FILES[path.suffix]} file not found: {path}")
        manifest.verify([path, path.with_suffix(".bin")] if path.suffix == ".xml" else [path])
        if path.suffix == ".tflite":
            return TFLiteClassifier(path, crop)
        return RuntimeClassifier(path, crop)
    if crop is not None:
        raise ExportError(
            "a SavedModel crops and resizes in its own graph, as exported; --crop applies to .tflite files and the "
            "ONNX and OpenVINO files."
        )
    if numbered := versions(path):
        path = numbered[-1]
    elif not (path / "saved_model.pb").is_file():
        found = sorted(path.glob("*/*/saved_model.pb"), key=lambda p: (p.parent.parent.name, _version(p.parent.name)))
        names = sorted({p.parent.parent.name for p in found})
        if len(names) > 1:
            raise ExportError(f"{path} holds the SavedModels {', '.join(names)}; name one, e.g. {path / names[0]}.")
        path = found[-1].parent
    manifest.verify(sorted(p for p in Path(path).rglob("*") if p.is_file()))
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


class RuntimeClassifier:
    """An `.onnx` file on ONNX Runtime or an OpenVINO `.xml` file on its CPU plugin (in the
    precision it records), with the labels, data split and image transform of its metadata, as
    `TFLiteClassifier`'s."""

    takes_bytes = False

    def __init__(self, path, crop=None):
        self.path = Path(path)
        try:
            if self.path.suffix == ".onnx":
                from keras_vit.export import onnx_model

                onnx_model.check_installed(converting=False)
                self._model = onnx_model.OnnxModel(self.path.read_bytes())
            else:
                from keras_vit.export import openvino_model

                openvino_model.check_installed(converting=False)
                self._model = openvino_model.OpenVINOModel(self.path)
        except (ValueError, RuntimeError) as error:
            if isinstance(error, ExportError):
                raise
            runtime = EXPORTED_FILES[self.path.suffix]
            raise ExportError(f"cannot load the {runtime} file {path}: {' '.join(str(error).split())[:200]}") from None
        self.labels, transform, self.data_split = from_properties(self._model.properties)
        transform = transform or {}
        crop = transform.get("crop_fraction", 1.0) if crop is None else crop
        height, width, self._channels = (int(s) for s in self._model.input_shape)
        self._transform = ImageTransform((height, width), crop, transform.get("interpolation", "bilinear"))

    def probabilities(self, images):
        """`(N, classes)` probabilities of uint8 RGB images `(H, W, 3)` of any size (for a
        grayscale file, Pillow's grayscale of them)."""
        pixels = [np.asarray(self._transform(to_channels(image, self._channels))) for image in images]
        return self._model.predict(np.stack(pixels))
