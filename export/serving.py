"""SavedModel for TF Serving: `DIR/<name>/<version>/` with two signatures, the label names
as an asset, a warm-up file, the run's data split (`assets.extra/data_split.json`) and a
`models.config` snippet."""

import functools
import importlib.util
import json
import logging
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import tensorflow as tf

from keras_vit import tf_predict
from keras_vit.export import frozen
from keras_vit.export.config import SERVING_NAME, check_serving_name, saved_model_policy
from keras_vit.export.source import ExportError, require_tensorflow_backend
from keras_vit.names import DATA_SPLIT_FILE, LABELS_FILE
from keras_vit.saving import in_policy, versions
from keras_vit.tf_images import decode_image, to_channels

logger = logging.getLogger("keras_vit")
WARMUP_FILE = "assets.extra/tf_serving_warmup_requests"
DATA_SPLIT_PATH = f"assets.extra/{DATA_SPLIT_FILE}"  # beside the graph, not read by it
IMAGES_SIGNATURE, BYTES_SIGNATURE = "serving_default", "serve_image_bytes"


class ServingModule(tf.Module):
    """The serving graph: float pixels (with the model's channels) or encoded JPEG/PNG bytes
    (decoded to them: Pillow's grayscale for a `channels=1` model) in, class probabilities
    and the top-k scores, class indices and label names out. `freeze`: the weights become
    graph constants instead of variables (`keras_vit.export.frozen.freeze`)."""

    def __init__(self, model, labels_file, top_k=5, freeze=False):
        super().__init__()

        if freeze:
            self._forward = frozen.freeze(model)
        else:
            # Keras 3 variables are not tracked by tf.Module; list their tf.Variables so the
            # SavedModel (and the converter reading it) holds the weights.
            self._weights = [v.value for v in model.variables]
            self._forward = functools.partial(model, training=False)
        self._labels_file = tf.saved_model.Asset(str(labels_file))
        initializer = tf.lookup.TextFileInitializer(
            self._labels_file,
            tf.int64,
            tf.lookup.TextFileIndex.LINE_NUMBER,
            tf.string,
            tf.lookup.TextFileIndex.WHOLE_LINE,
        )
        self._labels = tf.lookup.StaticHashTable(initializer, default_value="")
        self._size, self._channels = tuple(model.config.image_size), model.config.channels
        self._top_k = min(top_k, model.config.num_classes)
        self._transform = model.image_transform  # resize and centre-crop as in evaluation

        height, width = self._size
        self.serve_images = tf.function(
            self._serve_images,
            input_signature=[tf.TensorSpec((None, height, width, self._channels), tf.float32, "images")],
        )
        self.serve_image_bytes = tf.function(
            self._serve_image_bytes, input_signature=[tf.TensorSpec((None,), tf.string, "image_bytes")]
        )

    def probabilities(self, images):
        return tf.nn.softmax(tf.cast(self._forward(images), tf.float32), axis=-1)

    def _outputs(self, images):
        probabilities = self.probabilities(images)
        scores, classes = tf.math.top_k(probabilities, k=self._top_k)
        return {
            "probabilities": probabilities,
            "top_k_scores": scores,
            "top_k_classes": classes,
            "top_k_labels": self._labels.lookup(tf.cast(classes, tf.int64)),
        }

    def _serve_images(self, images):
        return self._outputs(images)

    def _serve_image_bytes(self, image_bytes):
        def decode(data):  # as training decodes its files
            return self._transform(to_channels(decode_image(data), self._channels))

        spec = tf.TensorSpec(self._size + (self._channels,), tf.float32)
        return self._outputs(tf.map_fn(decode, image_bytes, fn_output_signature=spec))


def serving_model(model, precision=None, freeze=None):
    """`(model, policy, freeze)`: the model a SavedModel serves, its Keras dtype policy and
    whether its weights become graph constants. `precision`: "float32" or "bfloat16" (a
    `mixed_bfloat16` copy with the same weights: bf16 matmuls for CPUs with AVX512_BF16 or AMX,
    float32 logits); None keeps the model's own. `freeze` None: frozen for bfloat16, where
    the weights are then stored in bf16 and no call casts them (`keras_vit.tf_predict.fold_weight_casts`),
    if they fit a frozen graph."""
    policy = saved_model_policy(precision) if precision else model.dtype_policy.name
    if model.dtype_policy.name != policy and not hasattr(model, "config"):
        raise ExportError(f"a SavedModel in {precision} needs a keras_vit ViT; {model.name} is not one.")
    model = in_policy(model, policy)
    if freeze is None:
        freeze = policy == "mixed_bfloat16" and tf_predict.fits(model)
        if policy == "mixed_bfloat16" and not freeze:
            logger.warning("keras_vit: %s is over a frozen graph's 2 GiB; its SavedModel keeps variables", model.name)
    return model, policy, freeze


def save_serving_model(
    source, directory, name="vit", version=None, overwrite=False, top_k=5, warmup=True, freeze=None, precision=None
):
    """Writes `directory/<name>/<version>/` (version: the next free number unless
    given; an existing version is replaced only with `overwrite`) and
    `directory/models.config`. `precision` ("float32" or "bfloat16"; None: the model's own) and
    `freeze` (weights as graph constants: faster on CPU, graphs up to 2 GiB; None: for
    bfloat16) as in `serving_model`. Returns the version directory."""
    require_tensorflow_backend()
    target = version_directory(directory, name, version, overwrite)
    base, version = target.parent, int(target.name)
    base.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{version}.", dir=base))
    try:
        with tempfile.TemporaryDirectory() as scratch:
            labels_file = Path(scratch) / LABELS_FILE
            labels_file.write_text("\n".join(source.labels) + "\n")
            model, _, freeze = serving_model(source.model, precision, freeze)
            module = ServingModule(model, labels_file, top_k=top_k, freeze=freeze)
            signatures = {IMAGES_SIGNATURE: module.serve_images, BYTES_SIGNATURE: module.serve_image_bytes}
            tf.saved_model.save(module, str(staging), signatures=signatures)
        if warmup and importlib.util.find_spec("tensorflow_serving") is None:
            logger.warning(
                "keras_vit: no TF Serving warm-up requests (the SavedModel is complete without them): "
                "they need tensorflow-serving-api (pip install --no-deps tensorflow-serving-api==2.21.0)"
            )
        elif warmup:
            write_warmup_requests(
                staging / WARMUP_FILE, name, source.model.config.image_size, source.model.config.channels
            )
        if source.data_split is not None:
            (staging / DATA_SPLIT_PATH).parent.mkdir(exist_ok=True)
            (staging / DATA_SPLIT_PATH).write_text(json.dumps(source.data_split, indent=2) + "\n")
        _replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    write_models_config(directory, name)
    logger.info("SavedModel for TF Serving: %s", target)
    return target


def version_directory(directory, name, version=None, overwrite=False):
    """`directory/<name>/<version>/`, the folder `save_serving_model` writes (version: the next
    free number unless given); ExportError for a name TF Serving cannot use, or for a version
    that exists unless `overwrite`. Reads the disk, writes nothing: `export` asks it before it
    writes any file."""
    check_serving_name(name)
    base = Path(directory) / name
    existing = sorted(int(p.name) for p in base.glob("*") if p.name.isdigit()) if base.is_dir() else []
    version = (existing[-1] + 1 if existing else 1) if version is None else int(version)
    if version < 1:
        raise ExportError(f"the SavedModel version must be a positive integer; got {version}.")
    target = base / str(version)
    if target.exists() and not overwrite:
        raise ExportError(
            f"{target} exists; a version TF Serving may be serving is replaced only with --overwrite (or give another "
            "--version)."
        )
    return target


MODELS_CONFIG = "models.config"
_ENTRY = '  config {{\n    name: "{0}"\n    base_path: "/models/{0}"\n    model_platform: "tensorflow"\n  }}\n'


def models_config(directory, name, listed=()):
    """A TF Serving `--model_config_file` for every model folder in `directory` (one holding a
    numbered SavedModel: TF Serving waits for a version of each model it is given, so a `tflite/`
    or report folder beside them is left out) and the models `listed` already, with the paths of
    the `tensorflow/serving` container's default mount `/models`. A folder whose name TF Serving
    cannot take (`SERVING_NAME`: a quote would break the file) is left out."""
    folders = [p for p in Path(directory).iterdir() if p.is_dir() and SERVING_NAME.fullmatch(p.name)]
    names = sorted({name, *listed} | {p.name for p in folders if versions(p)})
    return "model_config_list {\n" + "".join(_ENTRY.format(n) for n in names) + "}\n"


def write_models_config(directory, name):
    """Writes `directory/models.config` (`models_config`), keeping the models a file written so
    lists. A file with settings of its own (a version policy, another base path, ...) is left as
    it is, with a warning giving the entry to add when it does not name `name`."""
    path = Path(directory) / MODELS_CONFIG
    text = path.read_text() if path.is_file() else None
    listed = _listed_models(text) if text is not None else ()
    if listed is None:
        if f'name: "{name}"' not in text:
            logger.warning(
                "keras_vit: %s has settings of its own and is left as it is; add %s to serve the new model",
                path,
                " ".join(_ENTRY.format(name).split()),
            )
        return
    path.write_text(models_config(directory, name, listed))


def _listed_models(text):
    """The model names of a models.config in the form `models_config` writes; None for one with
    anything else in it."""
    head, tail = "model_config_list {\n", "}\n"
    if not (text.startswith(head) and text.endswith(tail)):
        return None
    body = text[len(head) : len(text) - len(tail)]
    names = re.findall(r'^    name: "([^"]*)"$', body, flags=re.MULTILINE)
    return names if body == "".join(_ENTRY.format(n) for n in names) else None


def write_warmup_requests(path, model_name, image_size, channels=3):
    """TF Serving's warm-up file: one PredictionLog per signature (a grey image), replayed by
    the server when it loads the version so the first real request is not slow."""
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    grey = np.full((1,) + tuple(image_size) + (channels,), 128, np.uint8)
    png = tf.io.encode_png(grey[0]).numpy()
    inputs = {IMAGES_SIGNATURE: ("images", grey.astype(np.float32)), BYTES_SIGNATURE: ("image_bytes", np.array([png]))}
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for signature, (key, value) in inputs.items():
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(name=model_name, signature_name=signature)
            )
            request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
            log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())


def _replace(staging, target):
    """Moves the finished export into place; an old version (overwrite) goes only after."""
    if not target.exists():
        staging.rename(target)
        return
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    target.rename(old)
    staging.rename(target)
    shutil.rmtree(old, ignore_errors=True)
