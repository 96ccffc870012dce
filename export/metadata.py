"""TFLite model metadata for an image classifier, written with `flatbuffers` directly.

The metadata schema (`tflite/metadata_schema.fbs`, version 1.5, file identifier "M001") is
what MediaPipe Tasks' `ImageClassifier` and the LiteRT support library read: the input is an
RGB image with its normalisation, the output class probabilities with a label file. The
metadata goes into the model's buffer named "TFLITE_METADATA"; associated files follow the
flatbuffer as an uncompressed zip archive. Table slots below follow the schema's field order
(a union takes two slots: its type, then its value).
"""

import io
import json
import zipfile

import flatbuffers
import numpy as np

from keras_vit.names import DATA_SPLIT_FILE, IMAGE_TRANSFORM_FILE
from keras_vit.names import LABELS_FILE as LABELS_NAME

METADATA_NAME = b"TFLITE_METADATA"
_MIN_PARSER_VERSION = "1.0.0"  # only fields of the first schema version are written
_RGB, _TENSOR_AXIS_LABELS = 1, 2  # ColorSpaceType.RGB, AssociatedFileType.TENSOR_AXIS_LABELS
_FEATURE_PROPERTIES, _IMAGE_PROPERTIES = 1, 2  # ContentProperties union members
_NORMALIZATION_OPTIONS = 1  # ProcessUnitOptions union member


def model_records(config, data_split):
    """The JSON files of a keras-vit `.tflite` model (`with_metadata`'s `records`): how an image
    becomes its input (the `ViTConfig`'s crop fraction and interpolation) and how its training
    data was split (None: not known)."""
    transform = {"crop_fraction": config.crop_fraction, "interpolation": config.interpolation}
    return {
        IMAGE_TRANSFORM_FILE: (transform, "how an image becomes the input: its centre crop_fraction resized (JSON)"),
        DATA_SPLIT_FILE: (data_split, "the training data's split (JSON)"),
    }


# The input record of an ONNX or OpenVINO file (their metadata has no image schema as TFLite's has):
# the input's shape and pixel range, and the normalisation a runtime applies before feeding it
# (none: the model maps [0, 255] pixels itself).
INPUT_RECORD = "input.json"


def model_properties(labels, config, data_split):
    """The string properties an ONNX file (metadata_props) or OpenVINO file (rt_info `keras_vit`)
    carries: the label names (`labels.txt`, one per line), `input.json` and the JSON records of
    `model_records`, each under its file name."""
    size = [int(s) for s in config.image_size]
    pixels = {
        "shape": ["batch", *size, int(config.channels)],
        "dtype": "float32",
        "value_range": [0.0, 255.0],
        "mean": [0.0] * int(config.channels),
        "std": [1.0] * int(config.channels),
        "output": "probability: (batch, classes) float32 class probabilities (softmax applied), in label order",
    }
    records = {name: value for name, (value, _) in model_records(config, data_split).items() if value is not None}
    properties = {LABELS_NAME: "\n".join(labels) + "\n", INPUT_RECORD: json.dumps(pixels)}
    properties.update({name: json.dumps(value) for name, value in records.items()})
    return properties


def from_properties(properties):
    """(labels, image transform, data split) of `model_properties`' strings (None where absent)."""
    labels = properties.get(LABELS_NAME)
    records = [properties.get(name) for name in (IMAGE_TRANSFORM_FILE, DATA_SPLIT_FILE)]
    return (None if labels is None else labels.splitlines(), *(None if r is None else json.loads(r) for r in records))


def with_metadata(model_bytes, name, description, labels, image_size, mean=(0.0,) * 3, std=(1.0,) * 3, records=None):
    """`model_bytes` with image-classifier metadata and the label file attached, and `records`
    as JSON files of the model: `{file name: (value, description)}` (see `model_records`; a
    None value writes no file).

    `mean`/`std`: the normalisation a runtime applies to [0, 255] pixels before feeding a
    float input, `(pixel - mean) / std` (identity here: the model normalises itself)."""
    from tensorflow.lite.python import schema_py_generated as schema

    records = {file: entry for file, entry in (records or {}).items() if entry[0] is not None}
    descriptions = {file: text for file, (_, text) in records.items()}
    metadata = _model_metadata(name, description, labels, image_size, mean, std, descriptions)
    model = schema.ModelT.InitFromPackedBuf(bytearray(model_bytes), 0)
    model.metadata = [m for m in (model.metadata or []) if m.name != METADATA_NAME]
    buffer = schema.BufferT()
    buffer.data = np.frombuffer(metadata, np.uint8)
    model.buffers.append(buffer)
    entry = schema.MetadataT()
    entry.name, entry.buffer = METADATA_NAME, len(model.buffers) - 1
    model.metadata.append(entry)
    builder = flatbuffers.Builder(len(model_bytes) + len(metadata) + 1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_STORED) as files:
        files.writestr(LABELS_NAME, "\n".join(labels) + "\n")
        for file, (value, _) in records.items():
            files.writestr(file, json.dumps(value, indent=2) + "\n")
    return bytes(builder.Output()) + archive.getvalue()


def read_labels(model_bytes):
    """The label names attached to a model by `with_metadata` (None when there are none)."""
    text = _attached(model_bytes, LABELS_NAME)
    return None if text is None else text.splitlines()


def read_record(model_bytes, file):
    """The JSON record `file` attached by `with_metadata` (None when there is none)."""
    text = _attached(model_bytes, file)
    return None if text is None else json.loads(text)


def _attached(model_bytes, name):
    try:
        with zipfile.ZipFile(io.BytesIO(model_bytes)) as files:
            return files.read(name).decode()
    except (zipfile.BadZipFile, KeyError):
        return None


def _model_metadata(name, description, labels, image_size, mean, std, records):
    b = flatbuffers.Builder(1024)
    strings = lambda *values: [b.CreateString(v) for v in values]  # noqa: E731

    # Input: ImageProperties(RGB, default size), NormalizationOptions, value range [0, 255].
    size = _table(b, [(0, "u32", int(image_size[1])), (1, "u32", int(image_size[0]))])  # ImageSize(width, height)
    image = _table(b, [(0, "u8", _RGB), (1, "off", size)])
    image_content = _table(b, [(0, "u8", _IMAGE_PROPERTIES), (1, "off", image)])
    norm_mean, norm_std = b.CreateNumpyVector(np.float32(mean)), b.CreateNumpyVector(np.float32(std))
    normalization = _table(b, [(0, "off", norm_mean), (1, "off", norm_std)])
    unit = _table(b, [(0, "u8", _NORMALIZATION_OPTIONS), (1, "off", normalization)])
    input_stats = _stats(b, 255.0, 0.0)
    in_name, in_description = strings("image", "RGB image, pixel values in [0, 255]")
    input_tensor = _table(
        b,
        [
            (0, "off", in_name),
            (1, "off", in_description),
            (3, "off", image_content),
            (4, "off", _vector(b, [unit])),
            (5, "off", input_stats),
        ],
    )

    # Output: class probabilities with the label file along the class axis.
    file_name, file_description = strings(LABELS_NAME, "class names, one per line, in output order")
    labels_file = _table(b, [(0, "off", file_name), (1, "off", file_description), (2, "u8", _TENSOR_AXIS_LABELS)])
    features = _table(b, [])
    output_content = _table(b, [(0, "u8", _FEATURE_PROPERTIES), (1, "off", features)])
    output_stats = _stats(b, 1.0, 0.0)
    out_name, out_description = strings("probability", f"probabilities of the {len(labels)} classes")
    output_tensor = _table(
        b,
        [
            (0, "off", out_name),
            (1, "off", out_description),
            (3, "off", output_content),
            (5, "off", output_stats),
            (6, "off", _vector(b, [labels_file])),
        ],
    )

    subgraph = _table(b, [(2, "off", _vector(b, [input_tensor])), (3, "off", _vector(b, [output_tensor]))])
    # Files of the model, not of a tensor: AssociatedFileType UNKNOWN.
    record_files = [_table(b, [(0, "off", n), (1, "off", d)]) for n, d in (strings(*r) for r in records.items())]
    model_name, model_description, version, author, parser = strings(
        name, description, _version(), "keras-vit", _MIN_PARSER_VERSION
    )
    root = _table(
        b,
        [
            (0, "off", model_name),
            (1, "off", model_description),
            (2, "off", version),
            (3, "off", _vector(b, [subgraph])),
            (4, "off", author),
            *([(6, "off", _vector(b, record_files))] if record_files else []),
            (7, "off", parser),
        ],
    )
    b.Finish(root, file_identifier=b"M001")
    return bytes(b.Output())


def _table(b, fields):
    """A table from (slot, kind, value) fields; every offset must already be built."""
    b.StartObject(max((slot for slot, _, _ in fields), default=-1) + 1)
    for slot, kind, value in fields:
        if kind == "off":
            b.PrependUOffsetTRelativeSlot(slot, value, 0)
        elif kind == "u8":
            b.PrependUint8Slot(slot, value, 0)
        else:
            b.PrependUint32Slot(slot, value, 0)
    return b.EndObject()


def _vector(b, offsets):
    b.StartVector(4, len(offsets), 4)
    for offset in reversed(offsets):
        b.PrependUOffsetTRelative(offset)
    return b.EndVector()


def _stats(b, high, low):
    return _table(
        b, [(0, "off", b.CreateNumpyVector(np.float32([high]))), (1, "off", b.CreateNumpyVector(np.float32([low])))]
    )


def _version():
    import keras_vit

    return f"keras-vit {keras_vit.__version__}"
