"""The names and constants that the library, its applications and the command line share, each
defined here once, and the rule that reads a run directory's files to tell a finished run.

This module imports only the standard library, so the command line reads it (through
`keras_vit_cli.names`) to build `--help` and check arguments without loading Keras or TensorFlow.
"""

import os
import unicodedata
from pathlib import Path

# Token pooling (keras_vit.layers.TokenPooling): the class token, or the mean of the patch tokens
# ("global average pool").
POOLING_MODES = ("token", "gap")
# The model's classifier (ViTConfig.classifier): a token pooling, or multi-head attention pooling
# by a learned probe ("map", keras_vit.layers.AttentionPool).
CLASSIFIERS = (*POOLING_MODES, "map")
# The block MLP (ViTConfig.mlp_type): Dense-GELU-Dense, or SwiGLU (SiLU(x W_gate) * x W_value, then
# the output Dense).
MLP_TYPES = ("gelu", "swiglu")
# Rotary position embeddings on the patch tokens' queries and keys (ViTConfig.rope, keras_vit.layers.
# RotaryEmbedding): EVA-02's (interleaved pairs, patch indices scaled to a reference grid, theta 1e4) and
# DINOv3's (rotate-half, patch centres in [-1, 1], theta 100).
ROPE_STYLES = {"eva02": 10000.0, "dinov3": 100.0}

# GroupNorm groups of the hybrid's ResNet stem (BiT): every ResNet width must divide by it.
RESNET_GROUPS = 32

# TensorFlow's JPEG decoding (training pipelines, the SavedModel's bytes signature) uses the exact
# integer IDCT, as Pillow (predict, visualize, inspect) does: its default, the fast IDCT, differed
# from Pillow by up to 8 levels per pixel, a skew between training, serving and predict.
JPEG_DCT_METHOD = "INTEGER_ACCURATE"
# Pillow's RGB -> grayscale (`Image.convert("L")`): (R, G, B) . LUMA_WEIGHTS / LUMA_SCALE, rounded
# (ITU-R 601-2 luma in 16-bit fixed point; the weights sum to LUMA_SCALE, so gray stays gray).
LUMA_WEIGHTS, LUMA_SCALE = (19595, 38470, 7471), 1 << 16

# The evaluation transform (keras_vit.transform): resize to size / EVAL_CROP, then centre-crop to
# size (Inception-style), by default; a model's config holds its own crop and interpolation.
EVAL_CROP = 0.875
# Bicubic is left out: TensorFlow's, JAX's and torch's kernels differ by up to ~4 pixel levels, so
# a model would be served (tf.data, SavedModel) other than it predicts on JAX or PyTorch.
INTERPOLATIONS = ("bilinear", "nearest")
# Resampling of position embeddings to another patch grid (keras_vit.resample): bilinear (the
# paper's code), bicubic (Hugging Face's: torch's kernel, a = -0.75) or bicubic_antialias
# (timm's default: torch's antialiased bicubic, PIL's kernel).
POSEMB_INTERPOLATIONS = ("bilinear", "bicubic", "bicubic_antialias")

# Input normalisations by name (`--normalization`, `ViT.from_checkpoint(normalization=...)`):
# ImageNet's statistics (DeiT, DINOv2, BEiT), Inception's x / 127.5 - 1 (the official ViT and AugReg
# releases, SigLIP) and OpenAI CLIP's (EVA-02); `keras_vit.config.NORMALIZATION_STATISTICS` holds
# their values. "MEAN,STD" in pixel units (0-255) gives others.
NORMALIZATIONS = ("imagenet", "inception", "clip")

# The families of the checkpoints `keras-vit checkpoints --family` lists (keras_vit.checkpoints.catalog).
CHECKPOINT_FAMILIES = ("vit", "vit-hybrid", "dinov2", "siglip")

# Class names, one per line, in output order: in a run directory, a SavedModel's assets and a
# .tflite's metadata.
LABELS_FILE = "labels.txt"

# How a model's training data was split (dataset, seed, held-out shares; JSON), recorded by
# `export` from the run: in a SavedModel's assets.extra/ and a .tflite's metadata files, so that
# `evaluate` scores an exported model on the images its training never saw.
DATA_SPLIT_FILE = "data_split.json"

# How an image becomes a .tflite file's input (the model's centre-crop fraction and
# interpolation; JSON), in its metadata files: a .tflite's input is the transformed image, so its
# runtime crops and resizes, and `predict`/`evaluate` do it as the Keras model does.
IMAGE_TRANSFORM_FILE = "image_transform.json"

# Image files read from folders (training's class folders, `keras-vit predict FOLDER`): the
# formats `keras_vit.tf_images.decode_image` reads.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp")
# Image files such folders may hold that are left out (TIFF and HEIF need decoders TensorFlow lacks;
# a .jfif is a JPEG to rename): counted in a warning, so that a folder of them is not read as empty.
UNREAD_IMAGE_EXTENSIONS = (".tif", ".tiff", ".jfif", ".heic", ".heif", ".avif", ".jp2", ".jxl")
# Their warning (logging arguments: the count, the folder, the suffixes found).
UNREAD_IMAGES_WARNING = (
    "keras_vit: left out %d image file(s) in %s in formats keras-vit does not read (%s); convert them to JPEG or "
    "PNG (a .jfif is a JPEG: rename it .jpg)"
)

# A run directory (keras-vit train): the resolved config, the class names, the evaluation, and the
# model files, of which the first one present is the run's model.
RUN_CONFIG = "config.yaml"
RUN_LABELS = LABELS_FILE
RUN_EVAL = "eval.json"
RUN_CHECKPOINTS = ("best.keras", "last.keras")
RUN_BACKUP = "backup"  # the resume state, there until the run's evaluation is written (workers: worker_N/backup)


def run_finished(run_dir):
    """Whether the run in `run_dir` (a pathlib.Path) trained to its end and was evaluated: its
    evaluation is written and its resume state, deleted once the evaluation is written, is gone."""
    return (run_dir / RUN_EVAL).is_file() and not (run_dir / RUN_BACKUP).exists()


def cache_home():
    """Where keras_vit keeps what it fetched or computed once: `$KERAS_HOME/keras_vit` (default
    `~/.keras/keras_vit`), beside Keras's own downloads."""
    return Path(os.environ.get("KERAS_HOME", Path.home() / ".keras")) / "keras_vit"


# The evaluation split that is a whole dataset: every image of a folder or of digits, every
# split of a tfds dataset (tfds's own name for that); for evaluating on data training never saw.
WHOLE_SPLIT = "all"

# Training options with a fixed set of values (keras_vit.training.TrainConfig): the paper's
# pre-training (AdamW) and fine-tuning (SGD) recipes, and the AdamW fine-tune of BEiT and MAE
# (layer-wise learning-rate decay), keras_vit.training.recipes.
RECIPES = ("pretrain", "finetune", "finetune-adamw")
# The checkpoint a refused from-scratch run is pointed to (`scratch_refusal`): ViT-S/16 pre-trained
# on ImageNet-21k and fine-tuned on ImageNet-1k (AugReg), 22M parameters.
SUGGESTED_WEIGHTS = "vit_s16.augreg_in21k_ft_in1k"


def scratch_refusal(dataset, weights=None, preset=None, model=None):
    """Why a run may not train: a dataset other than digits with neither `weights`, a `preset`
    nor `model` fields would train `ViTConfig`'s default, ViT-B/16, from random weights, the
    paper's worst case; one line with the fine-tune to run instead. None when the run may train.
    Standard library only: the command line checks this before it imports Keras."""
    if dataset in (None, "digits") or weights or preset or model:
        return None
    if not dataset.startswith("tfds:") and not os.path.isdir(dataset):  # no folder: the dataset check says why
        return None
    return (
        f"{dataset} with neither --weights nor --preset would train ViT-B/16 (86M parameters) from random weights, "
        "the paper's worst case (a ViT trained from scratch on little data falls behind a ResNet; its accuracy comes "
        f"from pre-training): fine-tune a pre-trained checkpoint instead, `keras-vit train --dataset {dataset} "
        f"--weights {SUGGESTED_WEIGHTS}` (add --freeze-backbone for a fast linear probe), or name a --preset to "
        "train from scratch anyway"
    )


# The paper's fine-tuning protocols (Table 4, appendix B.1.1), `train --protocol NAME`.
PROTOCOLS = ("imagenet", "cifar10", "cifar100", "pets", "flowers", "vtab")
STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker", "tpu")
PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
DECAYS = ("cosine", "linear")
AUGMENTS = ("inception", "translate", "affine")

# LiteRT (TFLite) conversions of keras_vit.export: float32, float16 weights, dynamic-range int8,
# full int8, int8 with float LayerNorm/softmax/GELU, int16 activations with int8 weights.
LITERT_MODES = ("float32", "float16", "dynamic", "int8", "int8-mixed", "int16x8")
# ONNX files (onnxruntime's quantisation): float32, int8 weights with activations quantised per call
# (dynamic), and int8 weights and activations calibrated on training images (int8, QDQ format).
ONNX_MODES = ("float32", "dynamic", "int8")
# OpenVINO IR files by the CPU inference precision they record: float32, or bf16 matmuls (CPUs with
# AVX512_BF16 or AMX; the default precision there would be bf16 for every file without the record);
# int8: NNCF's int8 weights and activations calibrated on training images, the rest in float32.
OPENVINO_MODES = ("float32", "bfloat16", "int8")
# Exported files that hold one classifier each, by suffix: the runtime that answers from them
# (`predict`, `evaluate`); an OpenVINO .xml file has its weights in the .bin beside it.
EXPORTED_FILES = {".tflite": "LiteRT", ".onnx": "ONNX", ".xml": "OpenVINO"}
# Beside every exported file, in its directory: `sha256sum` lines (`HEX  PATH`) of the export's files,
# checked by `predict` and `evaluate` before they load one (`sha256sum -c SHA256SUMS` checks them too).
EXPORT_MANIFEST = "SHA256SUMS"

# Precisions of the exported SavedModel -> the Keras dtype policy its model is built in
# (bfloat16: bf16 matmuls for CPUs with AVX512_BF16 or AMX, float32 logits).
SAVED_MODEL_PRECISIONS = {"float32": "float32", "bfloat16": "mixed_bfloat16"}

# What `keras-vit visualize` draws: attention (keras_vit.inspect) or tf-keras-vis saliency.
ATTENTION_METHODS = ("rollout", "attention")
SALIENCY_METHODS = ("saliency", "smoothgrad", "gradcam++", "scorecam")


def class_key(name):
    """A class name as class names are compared: in Unicode's composed form (NFC), so a folder
    copied from macOS, which spells "é" as "e" and an accent, names the class "é"."""
    return unicodedata.normalize("NFC", name)
