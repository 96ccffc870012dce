"""`ExportConfig`: everything an export depends on; YAML file + flag overrides."""

import dataclasses
import os
import re
from pathlib import Path

from keras_vit.config import check_fields, check_types, read_yaml_options, to_plain_dict
from keras_vit.export.litert import IO_TYPES
from keras_vit.export.source import ExportError
from keras_vit.names import LITERT_MODES, ONNX_MODES, OPENVINO_MODES, SAVED_MODEL_PRECISIONS

CONFIG_FILE = "export_config.yaml"  # written beside the report: how the export was made
# A model name TF Serving takes: the `name: "..."` of models.config (no quotes, backslashes or
# braces to break it), the model's folder and its REST path `/v1/models/NAME` (no spaces).
SERVING_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")


def check_serving_name(name):
    """Raises ExportError unless `name` is a TF Serving model name (`SERVING_NAME`)."""
    if not isinstance(name, str) or not SERVING_NAME.fullmatch(name):
        raise ExportError(
            f"name {name!r} is not a TF Serving model name: use ASCII letters, digits, '_', '-' and '.' (not first), "
            "e.g. digits-v2."
        )


def saved_model_policy(precision):
    """The Keras dtype policy a SavedModel in `precision` is built in; ExportError for an
    unknown precision."""
    if precision not in SAVED_MODEL_PRECISIONS:
        choices = ", ".join(SAVED_MODEL_PRECISIONS)
        raise ExportError(f"unknown SavedModel precision {precision!r}; choose from {choices}.")
    return SAVED_MODEL_PRECISIONS[precision]


@dataclasses.dataclass
class ExportConfig:
    """An export: what to write, in which LiteRT modes, and how it is checked.

    Artifacts: `saved_model_dir` (TF Serving layout `NAME/VERSION/`; `saved_model_precision`:
    "float32" or "bfloat16", default the model's own; `freeze`: weights as graph constants,
    default only for bfloat16) and/or `tflite_dir` (`{name}_{mode}.tflite` per mode of
    `modes`; `io_type`: the input/output type of the calibrated modes), `onnx_dir`
    (`{name}_{mode}.onnx` per mode of `onnx_modes`) and `openvino_dir` (`{name}_{mode}.xml` and
    `.bin` per mode of `openvino_modes`; None: float32, and bfloat16 where the CPU has it; int8,
    NNCF's calibrated quantisation, when named).
    `prune` (sparsity in (0, 1)) and `cluster` (number of shared values): fine-tuned
    `finetune_epochs` through the tfmot bridge, exported as float32 and, with "int8" among
    `modes`, int8; `qat_epochs`: quantisation-aware fine-tuning, exported as int8. Checks:
    `calibration_size` training images calibrate, `eval_limit` held-out images check every
    artifact, `threads` LiteRT, ONNX Runtime and OpenVINO threads time it; the report goes to
    `report_dir` (default: the TFLite, ONNX, OpenVINO, else SavedModel directory).
    """

    saved_model_dir: str | None = None
    tflite_dir: str | None = None
    modes: tuple = ("float32", "int8")
    io_type: str = "float32"
    name: str = "vit"
    version: int | None = None
    overwrite: bool = False
    saved_model_precision: str | None = None
    freeze: bool | None = None
    qat_epochs: int = 0
    prune: float | None = None
    cluster: int | None = None
    finetune_epochs: int = 2
    calibration_size: int = 200
    eval_limit: int = 2000
    threads: int = 2
    report_dir: str | None = None
    onnx_dir: str | None = None
    onnx_modes: tuple = ONNX_MODES
    openvino_dir: str | None = None
    openvino_modes: tuple | None = None

    def __post_init__(self):
        self.modes = _once_each(self.modes)
        self.onnx_modes = _once_each(self.onnx_modes)
        self.openvino_modes = None if self.openvino_modes is None else _once_each(self.openvino_modes)
        for path in ("saved_model_dir", "tflite_dir", "report_dir", "onnx_dir", "openvino_dir"):
            if getattr(self, path) is not None:  # `~/export` in a YAML file (no shell expands it)
                setattr(self, path, os.path.expanduser(str(getattr(self, path))))
        try:  # a YAML file's `calibration_size: lots`, say
            check_types(self, "export option")
        except ValueError as error:
            raise ExportError(str(error)) from None
        unknown = [m for m in self.modes if m not in LITERT_MODES]
        if unknown:
            raise ExportError(f"unknown quantisation mode {unknown[0]!r}; choose from {', '.join(LITERT_MODES)}.")
        for modes, known, what in (
            (self.onnx_modes, ONNX_MODES, "ONNX"),
            (self.openvino_modes or (), OPENVINO_MODES, "OpenVINO"),
        ):
            if unknown := [m for m in modes if m not in known]:
                raise ExportError(f"unknown {what} mode {unknown[0]!r}; choose from {', '.join(known)}.")
        io_types = {"float32"}.union(*IO_TYPES.values())
        if self.io_type not in io_types:
            raise ExportError(f"unknown input/output type {self.io_type!r}; choose from {', '.join(sorted(io_types))}.")
        if not any(self.directories.values()):
            raise ExportError("nothing to export: give a SavedModel, TFLite, ONNX or OpenVINO directory (or several).")
        if self.io_type != "float32" and not any(self.io_type in IO_TYPES.get(m, ()) for m in self.modes):
            takes = "; ".join(f"{m}: {', '.join(IO_TYPES[m])}" for m in IO_TYPES)
            raise ExportError(
                f"input/output type {self.io_type} applies to none of the modes {', '.join(self.modes)} (the "
                f"calibrated modes take {takes}; the others float32)."
            )
        if self.saved_model_dir:  # it names the model in models.config and its folder
            check_serving_name(self.name)
        if not self.name or self.name in (".", "..") or any(c in self.name for c in "/\\\0\n"):
            raise ExportError(
                f"name {self.name!r} is not a file name (no folders): it names the NAME_MODE.tflite files and the "
                "SavedModel's NAME/VERSION folder."
            )
        for name in ("saved_model_dir", "tflite_dir", "report_dir", "onnx_dir", "openvino_dir"):
            if getattr(self, name) and Path(getattr(self, name)).is_file():
                raise ExportError(f"{name} {getattr(self, name)} is a file; export writes into a folder.")
        if self.tflite_dir and Path(self.tflite_dir).suffix.lower() == ".tflite" and not Path(self.tflite_dir).is_dir():
            raise ExportError(
                f"tflite_dir {self.tflite_dir} names a file; it is the folder the {self.name}_MODE.tflite files go "
                f"into (e.g. {Path(self.tflite_dir).parent / 'tflite'})."
            )
        if self.saved_model_precision is not None:
            saved_model_policy(self.saved_model_precision)
        if self.freeze and not self.saved_model_dir:
            raise ExportError("freezing applies to the SavedModel: give a SavedModel directory.")
        if self.saved_model_precision and not self.saved_model_dir:
            raise ExportError("the SavedModel precision applies to the SavedModel: give a SavedModel directory.")
        if self.fine_tunes and not self.tflite_dir:
            raise ExportError("QAT, pruning and clustering produce LiteRT files: give a TFLite directory.")
        for name in ("calibration_size", "eval_limit", "threads", "finetune_epochs"):
            if int(getattr(self, name)) < 1:
                raise ExportError(f"{name} must be positive; got {getattr(self, name)}.")
        if self.qat_epochs < 0:
            raise ExportError(f"qat_epochs must be >= 0; got {self.qat_epochs}.")
        if self.prune is not None and not 0.0 < self.prune < 1.0:
            raise ExportError(f"prune (the sparsity) must be in (0, 1); got {self.prune}.")
        if self.cluster is not None and self.cluster < 2:
            raise ExportError(f"cluster (the number of shared values) must be at least 2; got {self.cluster}.")
        if self.version is not None and self.version < 1:
            raise ExportError(f"version must be a positive integer; got {self.version}.")

    @property
    def directories(self):
        """`{format: directory}` of the formats to write (SavedModel, TFLite, ONNX, OpenVINO)."""
        formats = ("saved_model", "tflite", "onnx", "openvino")
        return {f: getattr(self, f"{f}_dir") for f in formats if getattr(self, f"{f}_dir")}

    @property
    def fine_tunes(self):
        """Whether QAT, pruning or clustering fine-tune the model (needs training data)."""
        return bool(self.qat_epochs or self.prune or self.cluster)

    def to_dict(self):
        """The options as plain YAML/JSON values (tuples become lists), accepted by `from_dict`."""
        return to_plain_dict(self)

    def write(self, directory):
        """Writes the config as `export_config.yaml` into `directory`; returns its path."""
        import yaml

        path = Path(directory) / CONFIG_FILE
        path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=True))
        return path

    @classmethod
    def from_dict(cls, values):
        """The config of a dict of options (as `to_dict` gives); an unknown or ill-typed option is
        a ValueError naming it."""
        try:
            check_fields(cls, values, "export option")
        except ValueError as error:
            raise ExportError(str(error)) from None
        return cls(**values)

    @classmethod
    def from_yaml(cls, path, **overrides):
        """Reads a YAML file of ExportConfig fields; `overrides` (e.g. command-line flags) win."""
        try:
            values = read_yaml_options(path, "export option")
        except ValueError as error:
            raise ExportError(str(error)) from None
        return cls.from_dict({**values, **overrides})


def _once_each(modes):
    """A tuple of `modes` (one mode or several) without repeats, in order."""
    return (modes,) if isinstance(modes, str) else tuple(dict.fromkeys(modes))
