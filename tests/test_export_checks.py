"""keras-vit export refusing bad input before it writes anything, cleaning up on SIGTERM, and
saying which LiteRT files MediaPipe cannot read: on a tiny untrained ViT, fast."""

import json
import os
import signal

import keras
import numpy as np
import pytest
from helpers import images, perturb, tiny_config

import keras_vit

pytestmark = [pytest.mark.tensorflow_only, pytest.mark.xdist_group("export")]

LABELS = ["cat", "dog", "bird"]


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    # seeded: the int8 files' agreement with random weights depends on the weights (4 of 6 to 6 of 6)
    keras.utils.set_random_seed(0)
    model = perturb(keras_vit.ViT(tiny_config(num_classes=len(LABELS))), scale=0.5)
    path = tmp_path_factory.mktemp("tiny") / "tiny.keras"
    model.save(path)
    return path


@pytest.fixture
def export_cli(capsys):
    """`keras-vit export ARGS...`: (exit status, the last line on stderr)."""
    from keras_vit_cli import main

    def run(*args):
        status = main(["export", *map(str, args)])
        err = capsys.readouterr().err.strip().splitlines()
        return status, err[-1] if err else ""

    return run


def tree(directory):
    """Every path under `directory`, relative, sorted (None: no such folder)."""
    if not directory.exists():
        return None
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def test_a_saved_model_version_that_exists_is_refused_before_any_file_is_written(model_file, tmp_path, export_cli):
    serving, tflite = tmp_path / "serving", tmp_path / "tflite"
    (serving / "vit" / "1").mkdir(parents=True)
    (serving / "vit" / "1" / "saved_model.pb").write_bytes(b"served")
    before = tree(serving)
    status, line = export_cli(
        model_file, "--saved-model", serving, "--tflite", tflite, "--quantize", "float32", "--version", 1
    )
    assert status == 2
    assert line.startswith("keras-vit export: error: ") and f"{serving / 'vit' / '1'} exists" in line
    assert tree(tflite) is None and tree(serving) == before  # was: vit_float32.tflite and the report written first
    from keras_vit.export.serving import version_directory

    assert version_directory(serving, "vit") == serving / "vit" / "2"  # the next free version: no conflict
    assert version_directory(serving, "vit", 1, overwrite=True) == serving / "vit" / "1"
    assert tree(serving) == before
    # the .tflite check and the version check, both before anything is written
    tflite.mkdir()
    (tflite / "vit_float32.tflite").write_bytes(b"old")
    status, line = export_cli(model_file, "--saved-model", serving, "--tflite", tflite, "--quantize", "float32")
    assert status == 2 and "vit_float32.tflite exists; pass --overwrite" in line
    assert tree(tflite) == ["vit_float32.tflite"] and tree(serving) == before


@pytest.mark.parametrize("name", ['my "best"', "my best", ".vit", "vit}", "ViT\\1", "naïve"])
def test_a_name_tf_serving_cannot_use_is_refused_in_one_line(model_file, tmp_path, export_cli, name):
    from keras_vit.export import ExportConfig, ExportError

    status, line = export_cli(model_file, "--saved-model", tmp_path / "serving", "--name", name)
    assert status == 2 and line.startswith(f"keras-vit export: error: --name {name!r} is not")  # the flag named
    assert "TF Serving model name" in line and "letters, digits" in line
    assert not (tmp_path / "serving").exists()
    with pytest.raises(ExportError, match="TF Serving model name"):
        ExportConfig(saved_model_dir=str(tmp_path / "serving"), name=name)


def test_models_config_always_parses_and_names_every_saved_model(tmp_path):
    text_format = pytest.importorskip("google.protobuf.text_format")
    config_pb2 = pytest.importorskip("tensorflow_serving.config.model_server_config_pb2")
    from keras_vit.export import ExportConfig, ExportError
    from keras_vit.export.serving import models_config

    for name in ("digits-v2.1", "my_model", "_x", "-y", "7"):  # all fine
        assert ExportConfig(saved_model_dir=str(tmp_path), name=name).name == name
    with pytest.raises(ExportError, match="TF Serving model name"):
        from keras_vit.export.serving import save_serving_model

        save_serving_model(None, tmp_path, name='a"b')  # the Python API refuses it too, before reading the source
    # A folder of a SavedModel that TF Serving cannot name, put there by hand, is left out.
    for folder in ("vit/1", 'we"ird/1', "odd name/2", "fine-1.0/3"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "saved_model.pb").write_bytes(b"")
    parsed = text_format.Parse(models_config(tmp_path, "vit"), config_pb2.ModelServerConfig())
    assert [c.name for c in parsed.model_config_list.config] == ["fine-1.0", "vit"]
    assert [c.base_path for c in parsed.model_config_list.config] == ["/models/fine-1.0", "/models/vit"]


@pytest.mark.parametrize("blank", ["", "  "])
def test_a_labels_file_with_a_blank_name_is_refused_and_repeated_names_pass(model_file, tmp_path, export_cli, blank):
    from keras_vit.export import ExportSource, load_source
    from keras_vit.saving import read_labels_file

    (tmp_path / "labels.txt").write_text(f"cat\n{blank}\nbird\n")
    labels = ("--labels", tmp_path / "labels.txt")
    status, line = export_cli(model_file, *labels, "--tflite", tmp_path / "tflite", "--quantize", "float32")
    assert status == 2 and line.startswith("keras-vit export: error: ")
    assert "labels.txt: line 2 is blank; give one class name per line" in line
    assert not (tmp_path / "tflite").exists()
    (tmp_path / "trailing.txt").write_text(f"cat\ndog\nbird\n{blank}\n\n")  # blank lines at the end: ignored
    assert read_labels_file(tmp_path / "trailing.txt") == ["cat", "dog", "bird"]
    model = load_source(model_file).model
    with pytest.raises(ValueError, match="class name 2 is blank"):
        ExportSource(model, ["cat", blank, "bird"])
    # ImageNet-1k names two classes "crane": a repeated name is not refused
    assert ExportSource(model, ["crane", "dog", "crane"]).labels == ["crane", "dog", "crane"]


def test_sigterm_during_an_export_leaves_no_staging_files(model_file, tmp_path, export_cli, monkeypatch):
    """SIGTERM (`kill`, `docker stop`) stops the export as Ctrl-C does: the staging folders go, the
    status is 128 + 15. The signal is raised in the process itself where the files are staged
    (as a .tflite file and as the SavedModel start to be made)."""
    from keras_vit.export import litert, serving

    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        pytest.skip("SIGTERM is handled by someone else in this process")

    def terminate(*args, **kwargs):
        # Without a handler, SIGTERM would end pytest itself: fail instead.
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL, "SIGTERM has no handler during the export"
        signal.raise_signal(signal.SIGTERM)
        raise AssertionError("SIGTERM did not stop the export")

    with monkeypatch.context() as patch:
        patch.setattr(litert, "convert", terminate)
        status, line = export_cli(model_file, "--tflite", tmp_path / "tflite", "--quantize", "float32")
    assert (status, line) == (128 + signal.SIGTERM, "keras-vit export: stopped by SIGTERM")
    assert tree(tmp_path / "tflite") == []  # was: .export.XXXX/ left behind
    with monkeypatch.context() as patch:
        patch.setattr(serving, "ServingModule", terminate)  # once its staging folder is made
        status, line = export_cli(model_file, "--saved-model", tmp_path / "serving")
    assert (status, line) == (128 + signal.SIGTERM, "keras-vit export: stopped by SIGTERM")
    assert tree(tmp_path / "serving") == ["vit"]  # the .1.XXXX/ staging folder is gone
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored after the command


def test_int8_input_output_files_are_reported_as_not_for_mediapipe(model_file, tmp_path):
    from keras_vit.export import ExportConfig, export, load_source

    pixels = np.round(images(batch=4, seed=1))
    source = load_source(model_file).with_data({"calibration_images": pixels})
    out = tmp_path / "tflite"
    result = export(source, ExportConfig(tflite_dir=str(out), modes=("float32", "int8"), io_type="int8"))
    rows = {row["artifact"]: row for row in result["artifacts"]}
    assert rows["vit_int8.tflite"]["io_type"] == "int8" and rows["vit_int8.tflite"]["mediapipe_ready"] is False
    assert rows["vit_float32.tflite"]["io_type"] == "float32" and rows["vit_float32.tflite"]["mediapipe_ready"] is True
    notes = [line for line in result["table"].splitlines() if "MediaPipe" in line]
    assert notes == [
        "Not for MediaPipe's ImageClassifier, which takes uint8 or float32 input: vit_int8.tflite (int8 "
        "input/output); run it on LiteRT's interpreter."
    ]
    assert (out / "export_report.md").read_text() == result["table"]
    written = {row["artifact"]: row for row in json.loads((out / "export_report.json").read_text())["artifacts"]}
    assert written["vit_int8.tflite"]["mediapipe_ready"] is False
    description = read_description((out / "vit_int8.tflite").read_bytes())
    assert description == (
        "ViT image classifier (float, int8); int8 input/output: not for MediaPipe's ImageClassifier, which takes "
        "uint8 or float32 input"
    )
    assert read_description((out / "vit_float32.tflite").read_bytes()) == "ViT image classifier (float, float32)"


def read_description(model_bytes):
    """The model description in a .tflite model's metadata (None when it has none)."""
    from flatbuffers import encode, packer, table
    from tensorflow.lite.python import schema_py_generated as schema

    from keras_vit.export.metadata import METADATA_NAME

    model = schema.Model.GetRootAs(model_bytes, 0)
    for i in range(model.MetadataLength()):
        if model.Metadata(i).Name() == METADATA_NAME:
            data = model.Buffers(model.Metadata(i).Buffer()).DataAsNumpy().tobytes()
            root = table.Table(data, encode.Get(packer.uoffset, data, 0))
            slot = root.Offset(6)  # ModelMetadata.description: the second field
            return root.String(slot + root.Pos).decode() if slot else None
    return None


def _onnx_runtime_ops(path, optimised):
    """The op types of the graph ONNX Runtime runs for the ONNX file `path` (after its optimiser)."""
    import onnx
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.optimized_model_filepath, options.log_severity_level = str(optimised), 3
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return {node.op_type for node in onnx.load(str(optimised)).graph.node}


def test_onnx_and_openvino_files_pass_the_checks_and_carry_the_model(model_file, tmp_path):
    """Each ONNX mode and the OpenVINO float32 file: a report row beside the LiteRT one, standard
    ops only, the labels and transform in the file, every file's SHA-256 in its directory's
    manifest (and `sha256sum`'s format)."""
    import hashlib

    from keras_vit.export import ExportConfig, export, load_exported, load_source

    pixels = np.round(images(batch=6, seed=1))
    data = {"calibration_images": pixels, "eval_images": pixels, "eval_labels": np.arange(6) % len(LABELS)}
    source = load_source(model_file).with_data(data)
    directories = {f: tmp_path / f for f in ("tflite", "onnx", "openvino")}
    config = ExportConfig(
        tflite_dir=str(directories["tflite"]),
        modes=("float32",),
        onnx_dir=str(directories["onnx"]),
        openvino_dir=str(directories["openvino"]),
        openvino_modes=("float32",),
    )
    rows = {row["artifact"]: row for row in export(source, config)["artifacts"]}
    assert set(rows) == {
        "vit_float32.tflite",
        "vit_float32.onnx",
        "vit_dynamic.onnx",
        "vit_int8.onnx",
        "vit_float32.xml (OpenVINO, f32)",
    }
    for name in ("vit_float32.onnx", "vit_float32.xml (OpenVINO, f32)"):
        assert rows[name]["agreement"] == 1.0 and rows[name]["max_prob_diff"] < 1e-5, rows[name]
    for name in ("vit_dynamic.onnx", "vit_int8.onnx"):  # random weights, 6 images: a trained model's in test_journey
        assert rows[name]["agreement"] >= 4 / 6, rows[name]
    assert "MatMulInteger" in rows["vit_dynamic.onnx"]["ops"] and "QuantizeLinear" in rows["vit_int8.onnx"]["ops"]
    # layer norms as opset 17's LayerNormalization, and GELUs in the form ONNX Runtime fuses
    assert (
        "LayerNormalization" in rows["vit_float32.onnx"]["ops"]
        and "GlobalAveragePool" not in rows["vit_float32.onnx"]["ops"]
    )
    assert _onnx_runtime_ops(tmp_path / "onnx/vit_float32.onnx", tmp_path / "optimised.onnx") >= {
        "Gelu",
        "LayerNormalization",
    }
    for file in ("onnx/vit_int8.onnx", "openvino/vit_float32.xml"):
        loaded = load_exported(tmp_path / file)
        assert loaded.labels == source.labels and loaded.data_split is None
        probabilities = loaded.probabilities([np.uint8(p) for p in pixels[:2]])
        assert probabilities.shape == (2, len(LABELS)) and np.allclose(
            probabilities.sum(-1), 1.0, atol=0.02
        )  # int8: in steps of 1/255
    for folder, files in (
        ("tflite", ["vit_float32.tflite"]),
        ("onnx", ["vit_dynamic.onnx", "vit_float32.onnx", "vit_int8.onnx"]),
        ("openvino", ["vit_float32.bin", "vit_float32.xml"]),
    ):
        lines = (directories[folder] / "SHA256SUMS").read_text().splitlines()
        digests = [hashlib.sha256((directories[folder] / f).read_bytes()).hexdigest() for f in files]
        assert lines == [f"{d}  {f}" for d, f in zip(digests, files)]


def test_a_damaged_exported_file_is_refused_in_one_line(model_file, tmp_path, capsys):
    """Eight flipped bytes in a .tflite file's weights: predict and evaluate refuse it by the export
    manifest, where LiteRT would answer with no word."""
    from PIL import Image

    from keras_vit.export import ExportConfig, ExportError, export, load_exported, load_source
    from keras_vit_cli import main

    export(load_source(model_file), ExportConfig(tflite_dir=str(tmp_path), modes=("float32",)))
    file = tmp_path / "vit_float32.tflite"
    data = bytearray(file.read_bytes())
    middle = len(data) // 2  # inside the weight buffers
    data[middle : middle + 8] = bytes(b ^ 0xFF for b in data[middle : middle + 8])
    file.write_bytes(bytes(data))
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "digit.png")
    capsys.readouterr()
    for command in (["predict", file, tmp_path / "digit.png"], ["evaluate", file, "--dataset", "digits"]):
        assert main([str(c) for c in command]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and len(captured.err.strip().splitlines()) == 1, captured
        assert f"{file} does not match its SHA-256 in {tmp_path / 'SHA256SUMS'}" in captured.err
    # a SavedModel's weights, listed in the manifest of the export's base directory
    export(load_source(model_file), ExportConfig(saved_model_dir=str(tmp_path / "serving")))
    weights = next((tmp_path / "serving" / "vit" / "1" / "variables").glob("variables.data-*"))
    weights.write_bytes(weights.read_bytes()[:-8] + bytes(b ^ 0xFF for b in weights.read_bytes()[-8:]))
    with pytest.raises(ExportError, match=r"variables.data-.* does not match its SHA-256 in .*serving/SHA256SUMS"):
        load_exported(tmp_path / "serving")


@pytest.mark.parametrize(
    "flag, package, line",
    [
        (
            "--onnx",
            "onnxruntime",
            'ONNX files need onnxruntime, which is not installed: pip install "keras3-vit[onnx]"',
        ),
        (
            "--openvino",
            "openvino",
            'OpenVINO files need openvino, which is not installed: pip install "keras3-vit[openvino]"',
        ),
        (  # OpenVINO converts the ONNX graph
            "--openvino",
            "tf2onnx",
            'OpenVINO files need tf2onnx, which is not installed: pip install "keras3-vit[openvino]"',
        ),
        (  # the int8 file only
            "--openvino-precision int8 --openvino",
            "nncf",
            'OpenVINO files need nncf, which is not installed: pip install "keras3-vit[openvino]"',
        ),
    ],
)
def test_a_missing_runtime_is_named_in_one_line(model_file, tmp_path, export_cli, monkeypatch, flag, package, line):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else find_spec(name, *a))
    status, last = export_cli(model_file, *flag.split(), tmp_path / "out")
    assert status == 2 and last == f"keras-vit export: error: {line}."
    assert not (tmp_path / "out").exists()
    if package == "nncf":  # the float32 file needs no NNCF
        assert export_cli(model_file, "--openvino", tmp_path / "out", "--openvino-precision", "float32")[0] == 0


def test_the_openvino_int8_file_without_calibration_images_is_refused_before_any_file(model_file, tmp_path):
    from keras_vit.export import ExportConfig, ExportError, export, load_source

    config = ExportConfig(openvino_dir=str(tmp_path / "openvino"), openvino_modes=("float32", "int8"))
    with pytest.raises(ExportError, match="the OpenVINO int8 mode needs calibration images: export a run directory"):
        export(load_source(model_file), config)
    assert not (tmp_path / "openvino").exists()


def test_onnx_and_openvino_files_given_where_a_model_is_needed_are_named(tmp_path):
    from keras_vit.saving import load_model

    (tmp_path / "vit_int8.onnx").write_bytes(b"")
    with pytest.raises(ValueError, match=r"vit_int8.onnx is an exported ONNX file \(`predict` and `evaluate"):
        load_model(tmp_path / "vit_int8.onnx")
    (tmp_path / "openvino").mkdir()
    (tmp_path / "openvino" / "vit_float32.xml").write_text("")
    with pytest.raises(ValueError, match="openvino holds exported OpenVINO files"):
        load_model(tmp_path / "openvino")


def _resident_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_onnx_conversion_keeps_no_copy_of_the_weights_per_optimiser_pass():
    """tf2onnx rewrites every node's proto after each optimiser pass; under `_lean_tf2onnx` the
    replaced attributes are freed (protobuf's arena kept each pass's copy of every constant:
    ViT-B/16's conversion peaked at over 19 GB), and the nodes keep their values."""
    from tf2onnx.graph import Graph

    from keras_vit.export import onnx_model

    weights = np.arange(4 * 2**20, dtype=np.float32)  # 16 MiB
    graph = Graph([], opset=onnx_model.OPSET)
    graph.make_const("weights", weights)
    with onnx_model._lean_tf2onnx():
        graph.update_proto()
        before = _resident_bytes()
        for _ in range(8):
            graph.update_proto()
        grown = _resident_bytes() - before
    assert grown < 2 * weights.nbytes, f"{grown / 2**20:.0f} MiB kept by 8 passes over a 16 MiB constant"
    (node,) = graph.get_nodes()
    (value,) = node.op.attribute
    from onnx import numpy_helper

    assert value.name == "value" and np.array_equal(numpy_helper.to_array(value.t), weights)
