"""The journey of each family after the paper, as a user takes it with a checkpoint of their own:
`convert` a timm or Transformers checkpoint, fine-tune it on digits (`train --weights`),
`evaluate`, `predict`, `visualize`, `export` a SavedModel and every LiteRT mode with builtin ops
only, and classify with MediaPipe through the metadata. Every step is the installed `keras-vit`
command in a fresh process. The checkpoints are 2-block random-weight models the test writes
(nothing downloaded). About two minutes per family on 2 cores: behind the slow marker."""

import json

import numpy as np
import pytest
from helpers import perturbed_torch
from test_journey import KERAS_VIT, LITERT_MODES, python, run

pytestmark = [pytest.mark.slow, pytest.mark.tensorflow_only]

# family -> (how the reference is written, its image size: a 2x2 patch grid)
FAMILIES = {
    "dinov2_reg4": ("timm:vit_small_patch14_reg4_dinov2", 28),
    "siglip": ("transformers:siglip", 32),
    "eva02": ("timm:eva02_tiny_patch14_224", 28),
    "dinov3": ("transformers:dinov3", 32),
}


def write_reference(kind, size, folder):
    """A 2-block checkpoint of `kind`, perturbed off its initialisation, in its library's own
    format: a timm state dict, or a Transformers folder (config.json, weights, processor)."""
    from keras_vit.benchmark import torchvision_stub

    torchvision_stub.install()
    library, name = kind.split(":")
    folder.mkdir()
    if library == "timm":
        import timm
        from safetensors.torch import save_file

        options = dict(depth=2, embed_dim=64, num_heads=2, num_classes=0, img_size=size)
        model = perturbed_torch(timm.create_model(name, pretrained=False, **options))
        save_file(model.state_dict(), folder / "model.safetensors")
        # timm files do not store the head count (width 64 is no paper variant's)
        statistics = "imagenet" if "dinov2" in name else "clip"
        return folder / "model.safetensors", ["--num-heads", "2", "--normalization", statistics]
    import transformers

    small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, image_size=size)
    if name == "siglip":
        model = transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**small, patch_size=16))
    else:
        model = transformers.DINOv3ViTModel(transformers.DINOv3ViTConfig(**small, patch_size=16))
    perturbed_torch(model).save_pretrained(folder)
    return folder, ["--normalization", "inception" if name == "siglip" else "imagenet"]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_journey_of_each_family(tmp_path, family):
    kind, size = FAMILIES[family]
    source, normalization = write_reference(kind, size, tmp_path / "reference")
    converted = tmp_path / f"{family}.keras"
    run(KERAS_VIT, "convert", source, converted, "--image-size", str(size), *normalization)

    run_dir = tmp_path / "run"
    trained = run(
        KERAS_VIT,
        "train",
        "--dataset",
        "digits",
        "--weights",
        converted,
        "--epochs",
        "8",
        # a random-weight checkpoint needs more than the fine-tune's 0.01 (peak 6.25e-4 at batch 32)
        "--learning-rate",
        "0.8",
        "--run-dir",
        run_dir,
    )
    top1 = json.loads(trained.stdout.strip().splitlines()[-1])["top1"]
    assert top1 >= 0.5, top1  # ten classes: far above chance after 8 epochs from the checkpoint

    evaluated = json.loads(run(KERAS_VIT, "evaluate", run_dir, "--dataset", "digits").stdout.strip().splitlines()[-1])
    assert abs(evaluated["top1"] - top1) < 0.02, (evaluated, top1)
    image = tmp_path / "digit.png"
    python(f"""
        import numpy as np
        from PIL import Image
        from sklearn.datasets import load_digits
        pixels = np.round(load_digits().images[0] * 255.0 / 16.0).astype(np.uint8)
        Image.fromarray(pixels).convert("RGB").save({str(image)!r})
    """)
    predicted = run(KERAS_VIT, "predict", run_dir, image).stdout
    assert "digit.png" in predicted
    run(KERAS_VIT, "visualize", run_dir, image, "--out", tmp_path / "maps.png")
    assert (tmp_path / "maps.png").stat().st_size > 1000

    exported = run(
        KERAS_VIT,
        "export",
        run_dir,
        "--saved-model",
        tmp_path / "serving",
        "--tflite",
        tmp_path / "tflite",
        "--quantize",
        *LITERT_MODES,
    )
    report = json.loads((tmp_path / "tflite" / "export_report.json").read_text())
    rows = {row["artifact"]: row for row in report["artifacts"]}
    rows = {mode: rows[f"vit_{mode}.tflite"] for mode in LITERT_MODES}
    assert rows["float32"]["agreement"] >= 0.99, exported.stdout
    answered = python(f"""
        import numpy as np
        import mediapipe as mp
        from mediapipe.tasks import python as tasks
        from mediapipe.tasks.python import vision
        from PIL import Image
        options = vision.ImageClassifierOptions(
            base_options=tasks.BaseOptions(model_asset_path={str(tmp_path / "tflite" / "vit_float32.tflite")!r}),
            max_results=1,
        )
        classifier = vision.ImageClassifier.create_from_options(options)
        rgb = np.asarray(Image.open({str(image)!r}).convert("RGB").resize(({size}, {size}), Image.BILINEAR))
        print(classifier.classify(mp.Image(image_format=mp.ImageFormat.SRGB, data=np.ascontiguousarray(rgb)))
              .classifications[0].categories[0].category_name)
    """)
    assert answered.stdout.strip() in [str(i) for i in range(10)], answered.stdout
    print(family, {m: round(rows[m]["agreement"], 4) for m in LITERT_MODES}, "top-1", top1)
    assert np.isfinite([rows[m]["agreement"] for m in LITERT_MODES]).all()
