"""The user's journey, as the README tells it: every step is the installed `keras-vit` command or
`python -c` in a fresh process, never the test process, on one real default digits run."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.tensorflow_only, pytest.mark.xdist_group("journey")]

BIN = Path(sys.executable).parent
KERAS_VIT = str(BIN / "keras-vit")
VISUALIZE_METHODS = ("rollout", "attention", "saliency", "smoothgrad", "gradcam++", "scorecam")
LITERT_MODES = ("float32", "float16", "dynamic", "int8", "int8-mixed", "int16x8")
# A digits model trained with every option defaulted reached 98.89% on seed 0 (4 of 359 wrong,
# docs/training.md); the bar leaves 8 images of margin for float rounding on another CPU (it
# moved single runs by up to 5).
DEFAULT_TOP1_BAR = 0.965


def run(*command, backend="tensorflow", expect=0, timeout=600, cwd=None):
    """Runs a command as a user would (a fresh process, TensorFlow's log level left to the
    command); on an unexpected exit status, fails with the command and its last lines."""
    # A user's shell: no log level of the test run, and no TF_USE_LEGACY_KERAS, which importing
    # tensorflow_model_optimization (the export tests, maybe in this worker) sets for the process.
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_USE_LEGACY_KERAS")}
    env["KERAS_BACKEND"] = backend
    result = subprocess.run(
        [str(c) for c in command], capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd
    )
    if result.returncode != expect:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-25:])
        pytest.fail(
            f"`{' '.join(map(str, command))}` (KERAS_BACKEND={backend}) exited {result.returncode}, "
            f"expected {expect}:\n{tail}"
        )
    return result


def python(script, **kwargs):
    return run(sys.executable, "-c", textwrap.dedent(script), **kwargs)


@pytest.fixture(scope="module")
def journey(tmp_path_factory):
    """The README's main job, `keras-vit train --dataset digits --run-dir R`, and three digits
    of classes 0, 1 and 2 written as 8x8 PNG files."""
    from PIL import Image
    from sklearn.datasets import load_digits

    home = tmp_path_factory.mktemp("journey")
    trained = run(KERAS_VIT, "train", "--dataset", "digits", "--run-dir", home / "run", cwd=home)
    digits = load_digits()
    files = []
    for label in (0, 1, 2):
        index = int(np.flatnonzero(digits.target == label)[-1])
        pixels = np.round(digits.images[index] * 255.0 / 16.0).astype(np.uint8)
        files.append(home / f"digit{label}.png")
        Image.fromarray(pixels).convert("RGB").save(files[-1])
    return home, home / "run", files, trained


def test_train_with_every_option_defaulted(journey):
    _, run_dir, _, trained = journey
    result = json.loads(trained.stdout.strip().splitlines()[-1])
    assert result["num_examples"] == 359 and result["top1"] >= DEFAULT_TOP1_BAR, result
    for name in ("config.yaml", "labels.txt", "best.keras", "last.keras", "log.csv", "eval.json"):
        assert (run_dir / name).exists(), name
    # normal output carries no TensorFlow INFO lines and no Keras warnings a user cannot act on
    assert "oneDNN custom operations" not in trained.stderr and "InitializeLog" not in trained.stderr
    assert "UserWarning" not in trained.stderr, trained.stderr[-2000:]
    assert re.search(
        r"keras_vit: training on one device \(/\w+:0\), global batch 32, (XLA|graph mode).*; "
        r"AdamW, peak learning rate 0\.001, 130 epochs of 44 steps\n",
        trained.stderr,
    ), trained.stderr[-2000:]
    # Progress to a pipe: one plain line per epoch on stderr, not the terminal's live bar and its
    # colours; stdout holds the result alone, one JSON line.
    assert "\x1b[" not in trained.stderr and "\r" not in trained.stderr
    assert len(trained.stdout.strip().splitlines()) == 1 and json.loads(trained.stdout)["num_examples"] == 359
    assert re.search(r"^Epoch 130/130\n *44/44 - \d+s - ", trained.stderr, re.M), trained.stderr[-500:]


def test_evaluate_and_predict_from_the_run_and_from_its_keras_file(journey):
    home, run_dir, images, trained = journey
    evaluated = json.loads(run(KERAS_VIT, "evaluate", run_dir).stdout.strip().splitlines()[-1])
    assert evaluated["top1"] == pytest.approx(json.loads(trained.stdout.strip().splitlines()[-1])["top1"], abs=1e-6)
    on_file = json.loads(
        run(KERAS_VIT, "evaluate", run_dir / "best.keras", "--dataset", "digits").stdout.splitlines()[-1]
    )
    assert on_file["top1"] == pytest.approx(evaluated["top1"], abs=1e-6)
    # A checkpoint in its run: the run's own split, without --dataset.
    on_last = json.loads(run(KERAS_VIT, "evaluate", run_dir / "last.keras").stdout)
    assert on_last["num_examples"] == 359 and on_last["checkpoint"].endswith("last.keras")
    lines = run(KERAS_VIT, "predict", run_dir, *images, "--top-k", "1").stdout.strip().splitlines()
    assert [line.split(": ")[1].split()[0] for line in lines] == ["0", "1", "2"]
    same = (
        run(
            KERAS_VIT,
            "predict",
            run_dir / "best.keras",
            *images,
            "--top-k",
            "1",
            "--crop",
            "1",
            "--labels",
            run_dir / "labels.txt",
        )
        .stdout.strip()
        .splitlines()
    )
    assert same == lines


def test_predict_on_a_folder(journey):
    home, run_dir, images, _ = journey
    folder = home / "folder"
    (folder / "more").mkdir(parents=True)
    for i, image in enumerate(images):
        (folder / ("more" if i == 2 else "") / image.name).write_bytes(image.read_bytes())
    (folder / "broken.png").write_text("not an image")
    (folder / "notes.txt").write_text("not an image file name")
    result = run(KERAS_VIT, "predict", run_dir, folder, images[0], "--top-k", "1")
    lines = result.stdout.strip().splitlines()
    expected = [folder / "digit0.png", folder / "digit1.png", folder / "more" / "digit2.png", images[0]]
    assert [line.split(": ")[0] for line in lines] == [str(path) for path in expected]
    assert [line.split(": ")[1].split()[0] for line in lines] == ["0", "1", "2", "0"]
    assert f"keras_vit: skipped image {folder / 'broken.png'}: " in result.stderr and "notes.txt" not in result.stderr
    (folder / "more" / "digit2.png").unlink()
    (folder / "more" / "notes.png").mkdir()  # a folder named like an image is not one
    failed = run(KERAS_VIT, "predict", run_dir, folder / "more", expect=2)
    assert failed.stderr.strip().splitlines()[-1].startswith("keras-vit predict: error: ")
    assert "holds no images" in failed.stderr


def test_summary_of_the_trained_run(journey):
    _, run_dir, images, _ = journey
    out = run(KERAS_VIT, "summary", run_dir, "--image", images[1]).stdout
    assert "parameters: 312,298" in out and "digit1.png resized to 24x24 (whole, bilinear)" in out
    assert re.search(r"^top-5: 1 0\.\d{3}, ", out, re.MULTILINE)  # the class named, with its probability
    assert "random weights" not in out


def test_best_keras_reloads_with_keras_vit_alone_in_safe_mode(journey):
    _, run_dir, _, _ = journey
    loaded = python(f"""
        import sys
        import keras, keras_vit
        model = keras.saving.load_model({str(run_dir / "best.keras")!r}, safe_mode=True)
        assert "keras_vit.training" not in sys.modules
        print(type(model).__name__, model.config.num_classes, model.compiled)
    """)
    assert loaded.stdout.split() == ["ViT", "10", "False"]


@pytest.mark.parametrize("method", VISUALIZE_METHODS)
def test_visualize_every_method(journey, method):
    home, run_dir, images, _ = journey
    out = home / f"visualize_{method}.png"
    written = run(KERAS_VIT, "visualize", run_dir, *images[:2], "--method", method, "--out", out).stdout
    assert all(line.startswith("wrote ") for line in written.strip().splitlines()), written  # no progress bars
    files = [Path(line.removeprefix("wrote ")) for line in written.strip().splitlines()]
    assert files and all(f.is_file() and f.read_bytes()[:4] == b"\x89PNG" for f in files), written


def test_inspect_writes_every_figure(journey):
    home, run_dir, images, _ = journey
    written = run(KERAS_VIT, "inspect", run_dir, "--out", home / "figures", "--images", *images).stdout
    names = sorted(Path(line.removeprefix("wrote ")).stem for line in written.strip().splitlines())
    assert names == [
        "attention_distance",
        "class_token_attention",
        "patch_embedding_components",
        "position_similarity",
        "rollout",
    ]


@pytest.fixture(scope="module")
def exported(journey):
    home, run_dir, _, _ = journey
    result = run(
        KERAS_VIT,
        "export",
        run_dir,
        "--saved-model",
        home / "serving",
        "--tflite",
        home / "tflite",
        "--quantize",
        *LITERT_MODES,
        "--onnx",
        home / "onnx",
        "--openvino",
        home / "openvino",
    )
    return home, json.loads((home / "tflite" / "export_report.json").read_text()), result


def test_export_every_mode_checked_on_the_held_out_split(exported):
    home, report, result = exported
    table = result.stdout
    # The converter's and LiteRT's native notices stay out of normal output.
    for noise in ("InitializeLog", "I0000", "XNNPACK", "fully_quantize"):
        assert noise not in result.stderr, result.stderr[-2000:]
    rows = {row["artifact"]: row for row in report["artifacts"]}
    openvino = {"vit_float32.xml (OpenVINO, f32)"} | {r for r in rows if r == "vit_bfloat16.xml (OpenVINO, bf16)"}
    onnx = {f"vit_{mode}.onnx" for mode in ("float32", "dynamic", "int8")}
    assert (
        set(rows) == {f"vit_{mode}.tflite" for mode in LITERT_MODES} | {"vit/1 (SavedModel, float32)"} | onnx | openvino
    )
    assert report["num_eval"] == 359 and "| vit_int8.tflite |" in table and "| vit_int8.onnx |" in table
    assert rows["vit/1 (SavedModel, float32)"]["agreement"] == 1.0
    assert all(row["agreement"] >= 0.97 for row in rows.values()), rows


def test_saved_model_answers_both_signatures_in_bare_tensorflow(exported, journey):
    home, _, images, _ = journey
    answered = python(f"""
        import sys
        import numpy as np, tensorflow as tf
        from PIL import Image
        loaded = tf.saved_model.load({str(home / "serving" / "vit" / "1")!r})
        files = {[str(p) for p in images]!r}
        pixels = np.stack([np.asarray(Image.open(f).convert("RGB").resize((24, 24), Image.BILINEAR), np.float32)
                           for f in files])
        by_pixels = loaded.signatures["serving_default"](images=tf.constant(pixels))
        encoded = tf.constant([open(f, "rb").read() for f in files])
        by_bytes = loaded.signatures["serve_image_bytes"](image_bytes=encoded)
        assert "keras_vit" not in sys.modules
        print(*[label.decode() for label in by_bytes["top_k_labels"].numpy()[:, 0]])
        print(*by_pixels["top_k_classes"].numpy()[:, 0])
    """)
    by_bytes, by_pixels = answered.stdout.strip().splitlines()
    assert by_bytes.split() == ["0", "1", "2"] and by_pixels.split() == ["0", "1", "2"]


def test_tflite_answers_in_ai_edge_litert_and_mediapipe(exported, journey):
    home, _, images, _ = journey
    answered = python(f"""
        import sys
        import numpy as np
        import mediapipe as mp
        from mediapipe.tasks import python as tasks
        from mediapipe.tasks.python import vision
        from ai_edge_litert.interpreter import Interpreter
        from PIL import Image
        files = {[str(p) for p in images]!r}
        for mode in ("float32", "int8"):
            path = {str(home / "tflite")!r} + f"/vit_{{mode}}.tflite"
            interpreter = Interpreter(model_path=path)
            interpreter.allocate_tensors()
            (inp,), (out,) = interpreter.get_input_details(), interpreter.get_output_details()
            base = tasks.BaseOptions(model_asset_path=path)
            options = vision.ImageClassifierOptions(base_options=base, max_results=1)
            classifier = vision.ImageClassifier.create_from_options(options)
            litert, media = [], []
            for f in files:
                # at the model's size already: MediaPipe's own resize of an 8x8 image is not bilinear
                rgb = Image.open(f).convert("RGB").resize((24, 24), Image.BILINEAR)
                pixels = np.asarray(rgb, np.float32)[None]
                interpreter.set_tensor(inp["index"], pixels)
                interpreter.invoke()
                litert.append(int(interpreter.get_tensor(out["index"]).argmax()))
                image = mp.Image(image_format=mp.ImageFormat.SRGB, data=np.ascontiguousarray(np.asarray(rgb)))
                media.append(classifier.classify(image).classifications[0].categories[0].category_name)
            assert "keras_vit" not in sys.modules
            print(mode, *litert, *media)
    """)
    for line in answered.stdout.strip().splitlines():
        assert line.split()[1:] == ["0", "1", "2", "0", "1", "2"], line


def test_predict_answers_from_the_exported_files(exported, journey):
    """`predict` on what export wrote: the SavedModel through its bytes signature (as a TF Serving
    client), the newest version of an export directory, and a .tflite file with its labels."""
    home, _, images, _ = journey
    for model in (home / "serving", home / "serving" / "vit" / "1"):
        lines = run(KERAS_VIT, "predict", model, *images, "--top-k", "2").stdout.strip().splitlines()
        assert [line.split(": ")[1].split()[0] for line in lines] == ["0", "1", "2"], (model, lines)
        assert all(len(line.split(", ")) == 2 for line in lines)
    tflite = home / "tflite" / "vit_int8-mixed.tflite"
    answers = [json.loads(line) for line in run(KERAS_VIT, "predict", tflite, *images, "--json").stdout.splitlines()]
    assert [a["image"] for a in answers] == [str(image) for image in images]
    assert [a["top_k"][0]["label"] for a in answers] == ["0", "1", "2"] and all(len(a["top_k"]) == 5 for a in answers)
    assert all(1.0 >= a["top_k"][0]["probability"] >= a["top_k"][1]["probability"] >= 0.0 for a in answers)
    refused = run(KERAS_VIT, "predict", home / "serving", images[0], "--crop", "0.9", expect=2)
    assert "a SavedModel crops and resizes in its own graph" in refused.stderr
    (home / "empty_labels.txt").write_text("")  # was taken as no labels file: the model's own names
    refused = run(KERAS_VIT, "predict", tflite, images[0], "--labels", home / "empty_labels.txt", expect=2)
    assert "0 label names for a model of 10 classes" in refused.stderr
    several = run(KERAS_VIT, "predict", home / "tflite", images[0], expect=2)
    assert "holds the LiteRT files vit_dynamic.tflite, vit_float16.tflite" in several.stderr, several.stderr
    one = home / "one_tflite"
    one.mkdir()
    (one / "vit_int8-mixed.tflite").write_bytes(tflite.read_bytes())
    from_folder = run(KERAS_VIT, "predict", one, *images, "--json").stdout.splitlines()
    assert [json.loads(line)["top_k"] for line in from_folder] == [a["top_k"] for a in answers]
    not_a_run = run(KERAS_VIT, "visualize", one, images[0], "--out", home / "x.png", expect=2)
    assert "holds exported LiteRT files" in not_a_run.stderr, not_a_run.stderr


def test_evaluate_the_exported_files_on_a_dataset(exported, tmp_path):
    """`evaluate` on the SavedModel (through its bytes signature) and on .tflite files scores what
    the export report measured on the run's held-out split, within one image: the files record how
    the run split its data, so `--dataset` may be left out (named anyway, on the SavedModel: the
    same split). A SavedModel that records no split is scored on train's default split, said
    so, and only with `--dataset`."""
    home, report, _ = exported
    rows = {row["artifact"]: row for row in report["artifacts"]}
    for model, row, datas in (
        (home / "serving", "vit/1 (SavedModel, float32)", ((), ("--dataset", "digits"))),
        (home / "tflite" / "vit_int8-mixed.tflite", "vit_int8-mixed.tflite", ((),)),
        (home / "tflite" / "vit_int8.tflite", "vit_int8.tflite", ((),)),
    ):
        for data in datas:
            evaluated = run(KERAS_VIT, "evaluate", model, *data)
            result = json.loads(evaluated.stdout)
            assert result["num_examples"] == 359 and result["checkpoint"] == str(model), result
            assert "names no run" not in evaluated.stderr
            assert abs(result["top1"] - rows[row]["top1"]) <= 1.5 / 359, (row, result, rows[row])
            assert result["top1"] <= result["top5"] <= 1.0 and 0.0 < result["loss"] < 1.0, result
    unrecorded = tmp_path / "serving"
    shutil.copytree(home / "serving", unrecorded)
    (unrecorded / "vit" / "1" / "assets.extra" / "data_split.json").unlink()
    refused = run(KERAS_VIT, "evaluate", unrecorded, expect=2)
    assert "records no training data (exported without its run): say which data" in refused.stderr
    guessed = run(KERAS_VIT, "evaluate", unrecorded, "--dataset", "digits")
    assert json.loads(guessed.stdout)["num_examples"] == 359
    assert "names no run to take the split from" in guessed.stderr  # the default split, said so
    own = run(KERAS_VIT, "evaluate", home / "serving", "--dataset", "digits", "--split", "all", expect=2)
    assert "split 'all' of the model's own training data would count its training images" in own.stderr
    whole = run(KERAS_VIT, "evaluate", unrecorded, "--dataset", "digits", "--split", "all").stdout
    assert json.loads(whole)["num_examples"] == 1797


def test_onnx_and_openvino_files_answer_in_their_runtimes_and_in_predict_and_evaluate(exported, journey):
    """The ONNX file in bare onnxruntime and the OpenVINO file in bare openvino (their metadata
    holding the labels); NNCF's int8 OpenVINO file agreeing with Keras on the held-out split;
    `predict` on each; `evaluate` scoring an int8 ONNX file as the report did;
    a .tflite file with eight flipped bytes refused in one line by the export's SHA256SUMS."""
    home, report, _ = exported
    _, _, images, _ = journey
    answered = python(f"""
        import sys
        import numpy as np, onnxruntime, openvino
        from PIL import Image
        files = {[str(p) for p in images]!r}
        pixels = np.stack([np.asarray(Image.open(f).convert("RGB").resize((24, 24), Image.BILINEAR), np.float32)
                           for f in files])
        session = onnxruntime.InferenceSession({str(home / "onnx" / "vit_float32.onnx")!r})
        labels = session.get_modelmeta().custom_metadata_map["labels.txt"].split()
        print(*[labels[i] for i in session.run(["probability"], {{"image": pixels}})[0].argmax(-1)])
        core = openvino.Core()
        model = core.read_model({str(home / "openvino" / "vit_float32.xml")!r})
        compiled = core.compile_model(model, "CPU", {{"INFERENCE_PRECISION_HINT": "f32"}})
        labels = model.get_rt_info(["keras_vit", "labels.txt"]).astype(str).split()
        print(*[labels[i] for i in compiled(pixels)[0].argmax(-1)])
        assert "keras_vit" not in sys.modules
    """)
    assert [line.split() for line in answered.stdout.strip().splitlines()] == [["0", "1", "2"]] * 2
    # NNCF's int8 file, asked for by name, checked on the held-out split as the others
    int8 = run(KERAS_VIT, "export", home / "run", "--openvino", home / "openvino_int8", "--openvino-precision", "int8")
    assert "Statistics collection" not in int8.stdout + int8.stderr  # NNCF's progress bars held back
    (row,) = json.loads((home / "openvino_int8" / "export_report.json").read_text())["artifacts"]
    assert row["artifact"] == "vit_int8.xml (OpenVINO, int8)" and row["agreement"] >= 0.97, row
    for model in (home / "onnx" / "vit_dynamic.onnx", home / "openvino" / "vit_float32.xml", home / "openvino_int8"):
        lines = run(KERAS_VIT, "predict", model, *images, "--top-k", "1").stdout.strip().splitlines()
        assert [line.split(": ")[1].split()[0] for line in lines] == ["0", "1", "2"], (model, lines)
    result = json.loads(run(KERAS_VIT, "evaluate", home / "onnx" / "vit_int8.onnx").stdout)
    row = next(r for r in report["artifacts"] if r["artifact"] == "vit_int8.onnx")
    assert result["num_examples"] == 359 and abs(result["top1"] - row["top1"]) <= 1.5 / 359, (result, row)
    damaged = home / "damaged"
    shutil.copytree(home / "tflite", damaged)
    data = bytearray((damaged / "vit_float32.tflite").read_bytes())
    data[len(data) // 2 : len(data) // 2 + 8] = bytes(b ^ 0xFF for b in data[len(data) // 2 : len(data) // 2 + 8])
    (damaged / "vit_float32.tflite").write_bytes(bytes(data))
    refused = run(KERAS_VIT, "predict", damaged / "vit_float32.tflite", images[0], expect=2)
    assert refused.stdout == "" and refused.stderr.strip().splitlines() == [
        f"keras-vit predict: error: {damaged / 'vit_float32.tflite'} does not match its SHA-256 in "
        f"{damaged / 'SHA256SUMS'}: it changed or was damaged since export; export it again."
    ]


def test_predict_into_a_closed_pipe_stops_quietly(journey, tmp_path):
    """`keras-vit predict ... | head -1`: the reader leaves; predict stops with SIGPIPE's status and
    no traceback."""
    _, run_dir, images, _ = journey
    many = tmp_path / "many"
    many.mkdir()
    for i in range(400):
        (many / f"{i:03d}.png").write_bytes(images[i % 3].read_bytes())
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run(
        f"'{KERAS_VIT}' predict '{run_dir}' '{many}' | head -1; echo \"status ${{PIPESTATUS[0]}}\"",
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith(str(many / "000.png")) and lines[1] == "status 141", result
    assert "Error" not in result.stderr and "error" not in result.stderr, result.stderr


def test_finetune_from_an_official_layout_npz_at_a_larger_resolution(journey):
    home, run_dir, _, _ = journey
    npz = home / "digits_vit.npz"
    python(f"""
        import keras_vit
        model = keras_vit.saving.load_model({str(run_dir)!r})
        keras_vit.save_npz(model, {str(npz)!r})
    """)
    tuned = run(
        KERAS_VIT,
        "train",
        "--dataset",
        "digits",
        "--recipe",
        "finetune",
        "--weights",
        npz,
        "--image-size",
        "36",
        "--epochs",
        "1",
        "--run-dir",
        home / "finetuned",
    )
    result = json.loads(tuned.stdout.strip().splitlines()[-1])
    # one epoch from random weights reaches about 20%; from the trained weights far more
    assert result["top1"] >= 0.9, result
    config = (home / "finetuned" / "config.yaml").read_text()
    assert "recipe: finetune" in config and "image_size: 36" in config


def test_finetune_from_a_hub_name_in_the_local_cache_offline(journey, monkeypatch):
    """The run published as a Hub repository (its best.keras and labels, laid out as
    huggingface_hub caches them) fine-tunes by `hf://` name, offline, with the transform it
    ships: the new run's model normalises and crops as the published one."""
    home, run_dir, _, _ = journey
    cache = home / "hub"
    repository = cache / "models--me--digits-vit"
    snapshot = repository / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for name in ("best.keras", "labels.txt"):
        shutil.copy(run_dir / name, snapshot / name)
    (repository / "refs").mkdir()
    (repository / "refs" / "main").write_text("0" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tuned = run(
        KERAS_VIT,
        "train",
        "--dataset",
        "digits",
        "--weights",
        "hf://me/digits-vit",
        "--epochs",
        "1",
        "--run-dir",
        home / "from_hub",
    )
    assert json.loads(tuned.stdout.strip().splitlines()[-1])["top1"] >= 0.9
    assert "weights: hf://me/digits-vit" in (home / "from_hub" / "config.yaml").read_text()
    transforms = python(f"""
        import keras_vit
        for path in ({str(run_dir)!r}, {str(home / "from_hub")!r}):
            c = keras_vit.saving.load_model(path).config
            print(c.input_mean, c.input_std, c.crop_fraction, c.interpolation)
    """).stdout.splitlines()
    assert len(transforms) == 2 and transforms[0] == transforms[1], transforms


# The commands' code is the same for both backends: PyTorch in the default suite, JAX with -m slow
# (the JAX pass runs the model code under them in process: save_npz and reading .npz files in
# test_checkpoints.py, rollout in test_inspect.py).
@pytest.mark.parametrize("backend", [pytest.param("jax", marks=pytest.mark.slow), "torch"])
def test_verbs_without_tensorflow_code_on_other_backends(journey, backend):
    home, run_dir, images, _ = journey
    summary = run(KERAS_VIT, "summary", "vit_ti16", "--image-size", "32", "--num-classes", "10", backend=backend)
    assert "parameters:" in summary.stdout
    npz = home / f"{backend}.npz"
    python(
        f"import keras_vit; keras_vit.save_npz(keras_vit.saving.load_model({str(run_dir)!r}), {str(npz)!r})",
        backend=backend,
    )
    converted = home / f"{backend}.keras"
    run(KERAS_VIT, "convert", npz, converted, backend=backend)
    lines = (
        run(KERAS_VIT, "predict", converted, *images, "--top-k", "1", "--crop", "1", backend=backend)
        .stdout.strip()
        .splitlines()
    )
    assert [line.split(": ")[1].split()[0] for line in lines] == ["0", "1", "2"]
    out = home / f"rollout_{backend}.png"
    shown = run(KERAS_VIT, "visualize", run_dir, images[0], "--method", "rollout", "--out", out, backend=backend)
    assert out.is_file() and "runs on Keras's" not in shown.stderr  # rollout runs on this backend
    # tf-keras-vis's saliency needs TensorFlow: the command switches to it and says so
    out = home / f"saliency_{backend}.png"
    shown = run(KERAS_VIT, "visualize", run_dir, images[0], "--method", "saliency", "--out", out, backend=backend)
    assert (
        f"keras-vit visualize: runs on Keras's tensorflow backend here, not KERAS_BACKEND={backend}\n" in shown.stderr
    )
    assert out.is_file()
    # export traces TensorFlow graphs: the command switches to that backend and says so
    target = home / f"tflite_{backend}"
    exported = run(KERAS_VIT, "export", converted, "--tflite", target, "--quantize", "float32", backend=backend)
    assert (
        f"keras-vit export: runs on Keras's tensorflow backend here, not KERAS_BACKEND={backend}\n" in exported.stderr
    )
    assert (target / "vit_float32.tflite").is_file()


def test_bad_input_along_the_journey_gets_one_line(journey, tmp_path):
    _, run_dir, images, _ = journey
    empty = tmp_path / "empty_run"
    empty.mkdir()
    truncated = tmp_path / "truncated" / "best.keras"
    truncated.parent.mkdir()
    truncated.write_bytes((run_dir / "best.keras").read_bytes()[:2000])
    not_tflite = tmp_path / "model.tflite"
    not_tflite.write_bytes(b"not a flatbuffer")
    not_image = tmp_path / "photo.png"
    not_image.write_text("not an image")
    copied = tmp_path / "copied.keras"  # outside its run: which data it trained on is not known
    copied.write_bytes((run_dir / "best.keras").read_bytes())
    cases = [
        (("visualize", empty, images[0], "--out", tmp_path / "x.png"), "has no best.keras or last.keras"),
        (("predict", truncated.parent, images[0]), "best.keras is not a whole .keras file (those are zip archives)"),
        (("export", truncated, "--saved-model", tmp_path / "s"), "truncated or corrupt"),
        (("predict", not_tflite, images[0]), "model.tflite"),
        (("predict", run_dir, not_image), "cannot read image"),
        (("predict", run_dir, images[0], "--top-k", "0"), "--top-k must be at least 1; got 0."),
        (("predict", run_dir, images[0], "--crop", "1.5"), "--crop must be in (0, 1] (1: resize without cropping)"),
        (("evaluate", copied), "is not a run directory: say which dataset to evaluate on"),
    ]
    for args, message in cases:
        result = run(KERAS_VIT, *args, expect=2)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("keras-vit ") and message in lines[0], (args, result.stderr)


def test_train_on_a_folder_with_broken_files_says_so_once(tmp_path):
    """A user's folder with a truncated JPEG and a text file named .png: one warning with the
    count, none of the JPEG decoder's per-file lines, and the next command reuses the index."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for c, name in enumerate(("cat", "dog")):
        (tmp_path / "data" / name).mkdir(parents=True)
        for i in range(8):
            pixels = (rng.uniform(0, 255, (40, 48, 3)) * (0.4 + 0.6 * c)).astype("uint8")
            Image.fromarray(pixels).save(tmp_path / "data" / name / f"{i}.jpg")
    jpeg = (tmp_path / "data" / "cat" / "0.jpg").read_bytes()
    (tmp_path / "data" / "cat" / "broken.jpg").write_bytes(jpeg[: len(jpeg) // 3])
    (tmp_path / "data" / "dog" / "notes.png").write_text("not an image")
    (tmp_path / "tiny.yaml").write_text(
        "model: {image_size: 16, patch_size: 4, hidden_size: 32, num_layers: 1, num_heads: 2, mlp_dim: 64}\n"
    )
    command = [KERAS_VIT, "train", "--dataset", tmp_path / "data", "--config", tmp_path / "tiny.yaml"]
    trained = run(*command, "--epochs", "1", "--batch-size", "4", "--run-dir", tmp_path / "run")
    assert trained.stderr.count("skipped 2 unreadable image(s)") == 1, trained.stderr[-2000:]
    for noise in ("jpeg_mem", "Premature end", "JPEG library"):
        assert noise not in trained.stderr, trained.stderr[-2000:]
    assert (tmp_path / "data" / ".keras_vit_index.json").is_file()
    assert json.loads(trained.stdout.strip().splitlines()[-1])["num_examples"] == 4  # 20% of 16 readable
