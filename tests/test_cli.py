import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from keras_vit_cli import main

pytestmark = pytest.mark.tensorflow_only  # the CLI runs the TensorFlow backend by default


def test_summary_runs_a_preset_on_a_real_photo(capsys):
    assert main(["summary", "vit_ti16", "--image-size", "64", "--num-classes", "10"]) == 0
    out = capsys.readouterr().out
    assert "parameters: 5,491,786" in out  # Ti/16 at 64x64 (16 patches) with 10 classes
    assert "scikit-learn's china.jpg resized to 64x64" in out
    assert "output: shape (1, 10), dtype float32" in out


def test_summary_on_a_given_image_file(tmp_path, capsys):
    path = tmp_path / "gray.png"
    Image.new("L", (50, 40), color=128).save(path)  # grayscale becomes RGB
    assert main(["summary", "vit_ti16", "--image", str(path), "--image-size", "32", "48"]) == 0
    assert "resized to 32x48" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["summary", "vit_b61"], "unknown preset 'vit_b61'; did you mean vit_b16"),
        (["summary", "runs/vit_b61"], "checkpoint not found: runs/vit_b61 (neither a file nor a known name)"),
        (["summary", "vit_b16.keras"], "model file not found: vit_b16.keras"),
        (["summary", "vit_ti16", "--image", "/no/such.jpg"], "image file not found: /no/such.jpg"),
        (["summary", "vit_ti16", "--image-size", "230"], "image height 230 is not divisible by patch size 16"),
        # named by the flag or in words, not as ViTConfig's `num_classes`/`image_size` or `num_heads=5`
        (["summary", "vit_ti16", "--num-classes", "-1"], "--num-classes must be >= 0 (0: no head); got -1."),
        (["summary", "vit_ti16", "--image-size", "0"], "--image-size must be positive; got 0."),
        (["summary", "vit_ti16", "--num-heads", "5"], "the hidden size 192 is not divisible by 5 attention heads"),
    ],
)
def test_bad_input_gives_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and err[0].startswith("keras-vit summary: error:")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--batch-size", "16", "--global-batch-size", "32"], "--batch-size (per replica) and --global-b"),
        (["train", "--train-split", "train[:50%]"], "a training split ('train[:50%]') is for tfds datasets; digits"),
        (["train", "--config", "bad.yaml"], "unknown model field(s): num_lyers; num_lyers: did you mean num_layers?"),
        (["train", "--weights", "cut.keras"], "cut.keras is not a whole .keras file (those are zip archives)"),
        (["predict", "cut.keras", "x.png"], "cut.keras is not a whole .keras file (those are zip archives)"),
        (["predict", "m.keras", "x.png", "--labels", "no.txt"], "labels file not found: no.txt"),
        (["evaluate", "no_run"], "no_run does not exist: give a run directory, or a model and the dataset to eva"),
        # what a user of the command line types, not the Python API's `dataset=...` or the fields' names
        (["evaluate", "m.keras"], "m.keras is not a run directory: say which dataset to evaluate on ('digits', "),
        (["summary", "m.keras", "--num-classes", "3"], "m.keras is a complete model: its number of classes cannot"),
        (["export", "m.keras", "--tflite", "t", "--calibration-size", "0"], "--calibration-size must be positive"),
        (["export", "m.keras", "--saved-model", "x.png"], "--saved-model x.png is a file; export writes into a fo"),
        (["predict", "h.keras", "x.png"], "h.keras has no classification head (0 classes): it gives image features"),
        (["export", "m.keras", "--tflite", "t", "--finetune-epochs", "3"], "--finetune-epochs sets how long --prune"),
        (["export", "m.keras", "--tflite", "t", "--io-type", "int16"], "input/output type int16 applies to none of"),
    ],
)
def test_bad_training_and_export_input_gives_one_line_and_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text("model:\n  num_lyers: 2\n")
    (tmp_path / "cut.keras").write_bytes(b"PK\x03\x04" + bytes(100))  # a zip's first bytes, cut short
    Image.new("RGB", (8, 8)).save(tmp_path / "x.png")
    if "m.keras" in argv or "h.keras" in argv:  # a model, and one without a head
        import keras_vit

        config = keras_vit.ViTConfig(image_size=8, patch_size=4, hidden_size=8, num_layers=1, num_heads=2, mlp_dim=8)
        for name, classes in (("m.keras", 2), ("h.keras", 0)):
            model = keras_vit.ViT(dataclasses.replace(config, num_classes=classes))
            keras_vit.saving.save_model(model, tmp_path / name)
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if "keras-vit" in line]
    assert len(err) == 1 and message in err[0] and err[0].startswith(f"keras-vit {argv[0]}: error:"), err
    assert not (tmp_path / "runs").exists()


def test_a_headless_model_is_summarised_without_a_top_5(capsys):
    assert main(["summary", "vit_ti16", "--num-classes", "0", "--image-size", "32"]) == 0
    out = capsys.readouterr().out
    assert "output: shape (1, 192)" in out and "no head (num_classes 0)" in out and "top-5" not in out


@pytest.mark.parametrize(
    "command", [["inspect", "vit_ti16", "--out", "figures"], ["evaluate", "vit_ti16", "--dataset", "digits"]]
)
def test_a_preset_given_as_a_model_names_its_published_weights(command, capsys):
    assert main(command) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0] == (
        f"keras-vit {command[0]}: error: vit_ti16 is a preset (an architecture without weights); its weights: "
        "vit_ti16.augreg_in21k_ft_in1k, vit_ti16.augreg_in21k_ft_in1k_384, vit_ti16.augreg_in21k."
    ), err


@pytest.mark.parametrize(
    "argv, message",
    [
        # abbreviations are off: `--model` was taken as `--model-parallel`, `--epoch` as `--epochs`
        (["train", "--epoch", "3"], "keras-vit train: error: unrecognized arguments: --epoch 3; --epoch: did you mean"),
        (["train", "--model", "x"], "unrecognized arguments: --model x; --model: did you mean --model-parallel?"),
        (["predict", "m.keras", "a.png", "--topk", "3"], "keras-vit predict: error: unrecognized arguments: --topk 3"),
        (["train", "--learning_rate=0.1"], "--learning_rate: did you mean --learning-rate?"),
        (["train", "--frobnicate"], "keras-vit train: error: unrecognized arguments: --frobnicate"),
    ],
)
def test_unknown_options_are_named_with_the_closest_one(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and message in err[0], err
    assert err[0].endswith(f"; see `keras-vit {argv[0]} --help`"), err


def test_argument_errors_are_one_line_without_the_usage_block(capsys):
    for argv, message in [
        (["train", "--epochs", "x"], "keras-vit train: error: argument --epochs: invalid int value: 'x'"),
        (["predict"], "keras-vit predict: error: the following arguments are required: model, images"),
        (["frobnicate"], "keras-vit: error: argument COMMAND: invalid choice: 'frobnicate'"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_.value.code == 2 and len(err) == 1 and err[0].startswith(message), err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["visualize", "M", "a.png", "--out", "figure.xyz"], "cannot write a figure to figure.xyz: the formats are "),
        # a folder was taken as a name without a suffix: /tmp became /tmp.png beside it
        (["visualize", "M", "a.png", "--out", "/tmp"], "/tmp is a folder; a figure is a file: give its name"),
        (["visualize", "M", "/no/such.jpg", "--out", "figure.png"], "image file not found: /no/such.jpg"),
        (["visualize", "M", "/tmp", "--out", "figure.png"], "/tmp is a folder: name its image files"),
        (["inspect", "M", "--images", "/no/such.jpg", "--out", "figures"], "image file not found: /no/such.jpg"),
    ],
)
def test_figure_commands_refuse_bad_input_before_loading_the_model(argv, message, capsys, monkeypatch):
    from keras_vit import saving

    def loaded(*args, **kwargs):
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr(saving, "load_model", loaded)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"keras-vit {argv[0]}: error: ") and message in err[0], err


def test_a_run_that_has_not_finished_is_noted_where_its_model_is_read(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    for name in ("config.yaml", "best.keras"):
        (run / name).write_text("")  # the files are read after the note: this test stops at the image
    notes = []
    for state in ("stopped", "finished", "stopped while evaluating"):
        if state == "finished":
            (run / "eval.json").write_text("{}")
        if state == "stopped while evaluating":
            (run / "backup").mkdir()
        assert main(["predict", str(run), str(tmp_path / "no.png")]) == 2
        notes.append([line for line in capsys.readouterr().err.splitlines() if "note:" in line])
    note = (
        f"keras-vit predict: note: the run in {run} has not finished (stopped, or still training); its best.keras "
        "may not be its final model"
    )
    assert notes == [[note], [], [note]]


def test_train_notes_a_run_it_starts_from_that_has_not_finished(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    for name in ("config.yaml", "best.keras"):
        (run / name).write_text("")  # read after the note: the command stops there
    assert main(["train", "--weights", str(run), "--run-dir", str(tmp_path / "tuned")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        f"keras-vit train: note: the run in {run} has not finished (stopped, or still training); its best.keras "
        "may not be its final model"
    )
    assert len(err) == 2 and err[1].startswith("keras-vit train: error: ")


def test_train_notes_an_unfinished_run_named_by_its_config_file(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    for name in ("config.yaml", "best.keras"):
        (run / name).write_text("")
    options = tmp_path / "finetune.yaml"
    options.write_text(f"weights: {run}\nrun_dir: {tmp_path / 'tuned'}\n")
    assert main(["train", "--config", str(options)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        f"keras-vit train: note: the run in {run} has not finished (stopped, or still training); its best.keras "
        "may not be its final model"
    )
    assert len(err) == 2 and err[1].startswith("keras-vit train: error: ")


def test_corrupt_image_file(tmp_path, capsys):
    path = tmp_path / "broken.jpg"
    path.write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    assert main(["summary", "vit_ti16", "--image", str(path)]) == 2
    assert "cannot read image" in capsys.readouterr().err
    path.write_bytes(b"")  # was "not an image format Pillow reads"
    assert main(["summary", "vit_ti16", "--image", str(path)]) == 2
    assert f"cannot read image {path}: an empty file (0 bytes)" in capsys.readouterr().err


def test_a_grayscale_model_reads_images_as_grayscale(tmp_path, capsys):
    """A model built with channels=1 takes any image file, as Pillow's grayscale of it, in every
    command (each refused it: "expects 1-channel images but got 3 channels")."""
    import keras_vit
    from keras_vit.transform import to_channels
    from keras_vit_cli.images import load_image

    config = keras_vit.ViTConfig(
        image_size=16, patch_size=4, hidden_size=16, num_heads=2, num_layers=1, mlp_dim=16, num_classes=3,
        channels=1, input_mean=(127.5,), input_std=(127.5,),
    )  # fmt: skip
    keras_vit.saving.save_model(keras_vit.ViT(config), tmp_path / "gray.keras")
    rgb = np.random.default_rng(0).integers(0, 256, (20, 24, 3)).astype(np.uint8)
    Image.fromarray(rgb).save(tmp_path / "photo.png")
    gray = np.asarray(Image.fromarray(rgb).convert("L"))[..., None]
    np.testing.assert_array_equal(load_image(tmp_path / "photo.png", channels=1)[0], gray)
    np.testing.assert_array_equal(to_channels(rgb, 1), gray)  # Pillow's luma, value for value
    np.testing.assert_array_equal(to_channels(gray, 3), np.repeat(gray, 3, axis=-1))
    model, photo = str(tmp_path / "gray.keras"), str(tmp_path / "photo.png")
    for argv in (
        ["predict", model, photo],
        ["summary", model, "--image", photo],
        ["visualize", model, photo, "--method", "gradcam++", "--out", str(tmp_path / "cam.png")],
        ["inspect", model, "--out", str(tmp_path / "figures"), "--images", photo],
    ):
        assert main(argv) == 0, (argv, capsys.readouterr().err)
    assert (tmp_path / "cam.png").is_file()


def test_convert_refuses_an_output_it_cannot_write_before_the_work(tmp_path, capsys):
    (tmp_path / "out.keras").mkdir()
    (tmp_path / "file").write_text("")
    for output, message in (
        (tmp_path / "out.keras", "out.keras is a folder; the output is a .keras file."),  # had left a temp file
        (tmp_path / "file" / "x.keras", "file is a file, not a folder."),  # was [Errno 17] File exists
    ):
        assert main(["convert", "vit_ti16", str(output), "--overwrite"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "out.keras"]


def test_images_given_as_urls(tmp_path, capsys):
    """predict, visualize and summary read http(s) URLs as they read files (a local HTTP server
    here); a failed download or a non-image is one line and exit status 2."""
    import functools
    import http.server
    import threading

    import keras_vit

    model = keras_vit.ViT(
        keras_vit.ViTConfig(
            image_size=16, patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32, num_classes=3
        ),
        class_names=["a", "b", "c"],
    )
    model.save(tmp_path / "m.keras")
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (40, 30, 3), dtype=np.uint8)).save(tmp_path / "photo.jpg", quality=90)
    (tmp_path / "notes.txt").write_text("not an image")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # the server's request lines would mix into stderr
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        model_path = str(tmp_path / "m.keras")
        assert main(["predict", model_path, f"{url}/photo.jpg", str(tmp_path / "photo.jpg")]) == 0
        from_url, from_file = capsys.readouterr().out.strip().splitlines()
        assert from_url.startswith(f"{url}/photo.jpg: ") and from_url.split(": ")[1] == from_file.split(": ")[1]
        assert main(["visualize", model_path, f"{url}/photo.jpg", "--out", str(tmp_path / "v.png")]) == 0
        assert main(["summary", model_path, "--image", f"{url}/photo.jpg"]) == 0
        assert f"input: {url}/photo.jpg resized to 16x16" in capsys.readouterr().out
        for name, message in [("missing.jpg", "HTTP 404"), ("notes.txt", "not an image format Pillow reads")]:
            assert main(["predict", model_path, f"{url}/{name}"]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and f"{url}/{name}: " in err[0] and message in err[0], err
    finally:
        server.shutdown()


def test_sixteen_bit_images_read_as_tensorflow_decodes_them(tmp_path):
    """predict/visualize/inspect (Pillow) and training/serving (TensorFlow) see the same pixels
    of a 16-bit grayscale PNG: its high byte (Pillow's own conversion clipped it to white)."""
    from keras_vit_cli.images import load_image

    values = np.random.default_rng(0).integers(0, 65536, (20, 30)).astype(np.uint16)
    Image.fromarray(values).save(tmp_path / "deep.png")
    pixels, _ = load_image(tmp_path / "deep.png")
    assert pixels.shape == (20, 30, 3) and pixels.dtype == np.uint8
    np.testing.assert_array_equal(pixels[..., 0], (values >> 8).astype(np.uint8))
    tf = pytest.importorskip("tensorflow")
    from keras_vit.tf_images import decode_image

    decoded = decode_image(tf.constant((tmp_path / "deep.png").read_bytes()))
    np.testing.assert_array_equal(pixels, decoded.numpy())


def test_console_script_help_and_presets():
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    exe = os.path.join(os.path.dirname(sys.executable), "keras-vit")
    result = subprocess.run([exe, "--help"], capture_output=True, text=True, env=env)
    assert result.returncode == 0 and "summary" in result.stdout and "presets" in result.stdout
    result = subprocess.run([exe, "presets"], capture_output=True, text=True, env=env)
    assert result.returncode == 0 and "vit_r50_b16" in result.stdout and "vit_h14" in result.stdout
    result = subprocess.run([exe, "frobnicate"], capture_output=True, text=True, env=env)
    assert result.returncode == 2 and "invalid choice" in result.stderr


def test_convert_reads_the_architecture_off_the_checkpoint(tmp_path, capsys):
    import keras
    import numpy as np
    from helpers import images, perturb, tiny_config

    import keras_vit

    source = perturb(keras_vit.ViT(tiny_config()))
    keras_vit.save_npz(source, tmp_path / "src.npz")
    out = tmp_path / "model.keras"
    assert main(["convert", str(tmp_path / "src.npz"), str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    converted = keras.saving.load_model(out, safe_mode=True)
    np.testing.assert_array_equal(np.asarray(converted(images())), np.asarray(source(images())))
    assert main(["convert", str(tmp_path / "src.npz"), str(out)]) == 2  # never overwrites silently
    assert "exists; pass --overwrite" in capsys.readouterr().err
    assert (
        main(
            ["convert", str(tmp_path / "src.npz"), str(out), "--overwrite", "--image-size", "64", "--num-classes", "3"]
        )
        == 0
    )
    assert keras.saving.load_model(out).config.image_size == (64, 64)
    # A timm file stores no head count; at a width no paper variant has, --num-heads gives it.
    from test_checkpoints import _timm_state_dict, _write_safetensors

    _write_safetensors(tmp_path / "w64.safetensors", _timm_state_dict(source))
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "w64.safetensors"), str(out), "--overwrite"]) == 2
    assert "pass num_heads (num_heads=..., --num-heads) or a preset" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "w64.safetensors"), str(out), "--overwrite", "--num-heads", "4"]) == 0
    converted = keras.saving.load_model(out)
    np.testing.assert_allclose(np.asarray(converted(images())), np.asarray(source(images())), atol=1e-5)


def test_convert_names_the_classes_of_the_written_model_from_a_labels_file(tmp_path, capsys):
    # An official ImageNet .npz names no classes: the converted model predicted indices only.
    import keras
    import numpy as np
    from helpers import images, perturb, tiny_config

    import keras_vit

    source = perturb(keras_vit.ViT(tiny_config(num_classes=3)))
    source.class_names = ("red", "green", "blue")
    keras_vit.save_npz(source, tmp_path / "src.npz")
    (tmp_path / "labels.txt").write_text("n04000001\nn04000002\nn04000003\n")
    out = tmp_path / "model.keras"
    argv = ["convert", str(tmp_path / "src.npz"), str(out), "--labels", str(tmp_path / "labels.txt")]
    assert main(argv) == 0 and "3 classes with names" in capsys.readouterr().out
    converted = keras.saving.load_model(out, safe_mode=True)
    assert converted.class_names == ("n04000001", "n04000002", "n04000003")  # renamed, the head kept
    np.testing.assert_array_equal(np.asarray(converted(images())), np.asarray(source(images())))
    assert main([*argv[:3], "--overwrite", "--labels", str(tmp_path / "no.txt")]) == 2
    assert "labels file not found" in capsys.readouterr().err
    (tmp_path / "two.txt").write_text("cat\ndog\n")
    assert main([*argv[:3], "--overwrite", "--labels", str(tmp_path / "two.txt")]) == 2
    assert "two.txt names 2 classes; the model has 3 (--num-classes" in capsys.readouterr().err
    assert keras.saving.load_model(out).class_names[0] == "n04000001"  # the refused command wrote nothing
    assert main([*argv[:3], "--overwrite", "--num-classes", "2", "--labels", str(tmp_path / "two.txt")]) == 0
    assert keras.saving.load_model(out).class_names == ("cat", "dog")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["convert", "/no/such.npz", "out.keras"], "checkpoint not found: /no/such.npz"),
        (
            ["convert", "vit_b16.augreg_in21k_ft_in1k_385", "out.keras"],
            "Close known names: vit_b16.augreg_in21k_ft_in1k_384",
        ),
        (["convert", "x.npz", "out.h5"], "the output must be a .keras file"),
    ],
)
def test_convert_bad_input(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_help_and_argument_errors_answer_without_importing_keras():
    for argv in (["--help"], ["--version"], ["train", "--help"], ["export", "--help"], ["train", "--recipe", "nope"]):
        result = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "keras_vit_cli", *argv],
            capture_output=True,
            text=True,
            timeout=60,
        )
        imported = {
            line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time")
        }
        heavy = sorted(m for m in imported if m.split(".")[0] in ("keras", "tensorflow", "jax", "torch", "keras_vit"))
        assert imported and not heavy, (argv, heavy[:5])
        assert result.returncode == (2 if argv[-1] == "nope" else 0), argv
        if argv == ["--version"]:
            import keras_vit

            assert result.stdout.strip() == f"keras-vit {keras_vit.__version__}"


def test_the_command_lines_own_choice_lists_match_the_library():
    """The parser reads its choices from keras_vit/names.py without importing keras_vit (so that
    --help needs no Keras): they are the lists the library checks against."""
    from keras_vit import names
    from keras_vit.export import MODES
    from keras_vit.training import config
    from keras_vit_cli import build_parser, export_command

    assert export_command._MODES == MODES == names.LITERT_MODES
    train = build_parser()._subparsers._group_actions[0].choices["train"]
    choices = {action.dest: tuple(action.choices) for action in train._actions if action.choices}
    assert choices == {
        "recipe": config.RECIPES,
        "protocol": config.PROTOCOLS,
        "strategy": config.STRATEGIES,
        "precision": config.PRECISIONS,
    }


def test_native_noise_filter_keeps_real_errors():
    """TensorFlow's native lines that need no action are held back; other errors still show."""
    from keras_vit_cli import _NATIVE_NOISE

    held = [
        b"I0000 00:00:1795694975.756651   20413 port.cc:153] oneDNN custom operations are on.\n",
        b"E0000 00:00:1795694975.756651   20413 util.cc:131] oneDNN supports DT_HALF only on platforms "
        b"with AVX-512. Falling back to the default Eigen-based implementation if present.\n",
        b"E0000 00:00:1795694975.1 20413 jpeg_mem.cc:332] Premature end of JPEG data\n",
    ]
    shown = [b"E0000 00:00:1795694975.756651   20413 util.cc:131] something else failed\n", b"Traceback\n"]
    assert all(_NATIVE_NOISE.match(line) for line in held)
    assert not any(_NATIVE_NOISE.match(line) for line in shown)


def test_progress_goes_to_stderr_from_native_code_too():
    """Inside `progress_on_stderr` what Python and native libraries (Gloo's connection lines)
    write to standard output goes to stderr; the result after it alone reaches stdout."""
    code = (
        "import os\n"
        "from keras_vit_cli.output import progress_on_stderr\n"
        "with progress_on_stderr():\n"
        "    print('python', flush=True)\n"
        "    os.write(1, b'native\\n')\n"
        "print('result')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout == "result\n" and done.stderr == "python\nnative\n"


HIDE_TENSORFLOW = """
import importlib.abc, sys

class Hidden(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "tensorflow":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Hidden())
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--epochs", "1"],
        ["visualize", "vit_ti16", "photo.png", "--method", "gradcam++", "--out", "g.png"],
    ],
    ids=["train", "saliency"],
)
def test_a_command_that_needs_tensorflow_says_so_in_one_line_where_it_is_missing(tmp_path, argv):
    """A JAX-only install (TensorFlow hidden from imports, in a fresh process): one line naming
    the install, exit status 2, no traceback."""
    (tmp_path / "sitecustomize.py").write_text(HIDE_TENSORFLOW)
    Image.new("RGB", (32, 32)).save(tmp_path / "photo.png")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "KERAS_BACKEND": "jax"}
    done = subprocess.run(
        [sys.executable, "-m", "keras_vit_cli", *argv], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"keras-vit {argv[0]}: error: this command needs TensorFlow, which is not installed: "
        "pip install 'keras3-vit[tensorflow]'."
    )
    assert "Traceback" not in done.stderr


def _tiny_model_file(path, num_classes=3, dtype=None):
    """A small random ViT saved as a .keras file at `path` (its weights moved off their initial values)."""
    from helpers import perturb, tiny_config

    import keras_vit

    keras_vit.saving.save_model(perturb(keras_vit.ViT(tiny_config(num_classes=num_classes), dtype=dtype)), path)
    return path


def test_predict_on_a_folder_none_of_whose_images_can_be_read_fails_in_one_line(tmp_path, capsys, caplog):
    """A folder of unreadable files (text files named .jpg) answered nothing and exited 0. It is
    now bad input: one line naming what was skipped and why, exit status 2, after the answers for
    the other arguments; a folder with some readable images still answers and names the others."""
    model = str(_tiny_model_file(tmp_path / "model.keras"))
    bad, mixed = tmp_path / "bad", tmp_path / "mixed"
    for folder in (bad, mixed):
        folder.mkdir()
        (folder / "a.jpg").write_text("not a photo")
    (bad / "sub").mkdir()
    (bad / "sub" / "b.png").write_text("nor this")
    Image.fromarray(np.zeros((12, 12, 3), np.uint8)).save(mixed / "good.png")
    capsys.readouterr()

    assert main(["predict", model, str(bad)]) == 2
    out, err = capsys.readouterr()
    why = "not an image format Pillow reads"
    assert out == "" and err.strip().splitlines() == [
        f"keras-vit predict: error: no image could be read in {bad}: skipped all 2 image file(s): a.jpg ({why}); "
        f"sub/b.png ({why})"
    ]
    assert "skipped image" not in caplog.text  # said once, in the error line

    assert main(["predict", model, str(mixed)]) == 0
    out, _ = capsys.readouterr()
    assert [line.split(":")[0] for line in out.splitlines()] == [str(mixed / "good.png")]
    assert f"skipped image {mixed / 'a.jpg'}: {why}" in caplog.text
    caplog.clear()

    assert main(["predict", model, str(mixed), str(bad)]) == 2  # the readable ones answered first
    out, err = capsys.readouterr()
    assert [line.split(":")[0] for line in out.splitlines()] == [str(mixed / "good.png")]
    assert err.strip().splitlines()[-1].startswith(f"keras-vit predict: error: no image could be read in {bad}:")


def test_evaluate_of_an_export_folder_names_the_saved_model_version_it_scored(tmp_path, capsys):
    """`evaluate` of an `export --saved-model` folder scores its newest version; the result says
    which SavedModel that was (it named only the folder given)."""
    import json
    import shutil

    import keras_vit
    from keras_vit.export import ExportSource, save_serving_model

    model = keras_vit.saving.load_model(_tiny_model_file(tmp_path / "model.keras", num_classes=2))
    version_1 = save_serving_model(ExportSource(model=model, labels=["cat", "dog"]), tmp_path / "serving", warmup=False)
    shutil.copytree(version_1, tmp_path / "serving" / "vit" / "2")
    rng = np.random.default_rng(0)
    for name in ("cat", "dog"):
        (tmp_path / "data" / name).mkdir(parents=True)
        for i in range(2):
            pixels = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "data" / name / f"{i}.png")
    capsys.readouterr()
    for given in (tmp_path / "serving", tmp_path / "serving" / "vit"):
        argv = ["evaluate", str(given), "--dataset", str(tmp_path / "data"), "--split", "all"]
        assert main(argv) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["checkpoint"] == str(given) and result["num_examples"] == 4
        assert (result["saved_model"], result["version"]) == (str(tmp_path / "serving" / "vit" / "2"), 2)


def test_convert_keeps_the_dtype_policy_of_a_keras_vit_model_unless_told(tmp_path, capsys):
    """A run trained in mixed_bfloat16 (its best.keras computes so) converted, e.g. to another
    resolution, was written as float32 without a word. It keeps its policy, said in the line
    `convert` prints; `--dtype` picks another, and other checkpoints stay float32."""
    import keras

    import keras_vit

    run = tmp_path / "run"
    run.mkdir()
    source = keras_vit.saving.load_model(_tiny_model_file(run / "best.keras", dtype="mixed_bfloat16"))
    capsys.readouterr()
    for given, argv, policy in (
        (run, [], "mixed_bfloat16"),
        (run / "best.keras", [], "mixed_bfloat16"),
        (run, ["--dtype", "float32"], "float32"),
    ):
        out = tmp_path / "out.keras"
        assert main(["convert", str(given), str(out), "--overwrite", *argv]) == 0
        printed = capsys.readouterr().out
        assert f"dtype policy {policy}" in printed
        assert ("(the source's; --dtype float32 for float32)" in printed) == (policy != "float32")
        converted = keras.saving.load_model(out)
        assert converted.dtype_policy.name == policy
        for a, b in zip(converted.get_weights(), source.get_weights()):  # float32 variables in both policies
            np.testing.assert_array_equal(a, b)
    keras_vit.save_npz(source, tmp_path / "weights.npz")  # a checkpoint records no policy: float32
    assert main(["convert", str(tmp_path / "weights.npz"), str(tmp_path / "npz.keras")]) == 0
    assert "dtype policy float32" in capsys.readouterr().out
    assert keras.saving.load_model(tmp_path / "npz.keras").dtype_policy.name == "float32"


def test_warnings_of_a_shell_command_are_plain_lines_also_after_absl_set_up_logging(tmp_path):
    # TensorFlow logs through absl, which gives the root logger a handler on first use: a
    # keras_vit warning then came out as "WARNING:keras_vit:keras_vit: ..." (before it, as the
    # bare message), depending on what the command had run.
    from helpers import tiny_config

    import keras_vit

    keras_vit.saving.save_model(keras_vit.ViT(tiny_config(num_classes=3)), tmp_path / "m.keras")
    folder = tmp_path / "photos"
    folder.mkdir()
    Image.new("RGB", (20, 20), "red").save(folder / "a.png")
    (folder / "b.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    command = [sys.executable, "-m", "keras_vit_cli", "predict", str(tmp_path / "m.keras"), str(folder)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    skipped = [line for line in result.stderr.splitlines() if "b.jpg" in line]
    assert len(skipped) == 1 and skipped[0].startswith(f"keras_vit: skipped image {folder / 'b.jpg'}: "), skipped
    script = (
        "import logging, absl.logging\n"
        "from keras_vit_cli.output import show_log\n"
        "show_log()\n"
        "absl.logging.info('as TensorFlow logs')\n"
        "logging.getLogger('keras_vit').warning('keras_vit: a warning')\n"
        "logging.getLogger('keras_vit').info('keras_vit: not shown at WARNING')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert result.stderr == "keras_vit: a warning\n"


def test_predict_json_is_valid_utf8_for_a_file_name_that_is_not(tmp_path):
    # The name's raw bytes went out as they were: the line was not UTF-8 and JSON readers failed.
    from helpers import tiny_config

    import keras_vit

    keras_vit.saving.save_model(keras_vit.ViT(tiny_config(num_classes=3)), tmp_path / "m.keras")
    folder = tmp_path / "photos"
    folder.mkdir()
    for name in (b"caf\xe9.png", "café.png".encode()):  # Latin-1 bytes, then UTF-8
        Image.new("RGB", (20, 20), "red").save(os.path.join(os.fsencode(folder), name))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    command = [sys.executable, "-m", "keras_vit_cli", "predict", str(tmp_path / "m.keras"), str(folder), "--json"]
    result = subprocess.run(command, capture_output=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    lines = [json.loads(line) for line in result.stdout.decode("utf-8").splitlines()]
    assert sorted(os.fsencode(line["image"]) for line in lines) == sorted(
        os.path.join(os.fsencode(folder), name) for name in (b"caf\xe9.png", "café.png".encode())
    )
    assert "café.png" in result.stdout.decode("utf-8")  # a UTF-8 name stays readable


def test_predict_prints_one_line_per_image_whatever_the_file_names(tmp_path):
    # A newline in a file name split its answer over two lines; a name that is not UTF-8 went out
    # as raw bytes. Both are written as Python escapes, every other character as it is.
    from helpers import tiny_config

    import keras_vit

    keras_vit.saving.save_model(keras_vit.ViT(tiny_config(num_classes=3)), tmp_path / "m.keras")
    folder = tmp_path / "photos"
    folder.mkdir()
    for name in (b"two\nlines.png", b"caf\xe9.png", "café.png".encode()):
        Image.new("RGB", (20, 20), "red").save(os.path.join(os.fsencode(folder), name))
    Image.new("RGB", (20, 20), "red").save(folder / "scan.tif")  # a format left out, with a count
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONIOENCODING": "utf-8"}
    command = [sys.executable, "-m", "keras_vit_cli", "predict", str(tmp_path / "m.keras"), str(folder)]
    result = subprocess.run(command, capture_output=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    lines = result.stdout.decode("utf-8").splitlines()
    assert sorted(line.split(": ")[0] for line in lines) == sorted(
        f"{folder}/{name}" for name in ("caf\\udce9.png", "café.png", "two\\nlines.png")
    ), lines
    assert f"keras_vit: left out 1 image file(s) in {folder} in formats keras-vit does not read (.tif)" in (
        result.stderr.decode(errors="replace")
    )
