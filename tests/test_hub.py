"""Hugging Face Hub names (`hf://ORG/NAME[@REVISION]`) read from a hub cache laid out here
(offline), and the image transform that travels with a checkpoint: a timm folder's
`pretrained_cfg`, a warning for a bare file, `normalization` to name it."""

import json
import logging
import shutil

import keras
import numpy as np
import pytest
from helpers import images, perturb, tiny_config
from test_checkpoints import _timm_state_dict, _write_safetensors

import keras_vit
from keras_vit.checkpoints import CheckpointError, hub
from keras_vit.config import IMAGENET_MEAN, IMAGENET_STD, OFFICIAL_MEAN, normalization_fields

SHA = "0123456789abcdef0123456789abcdef01234567"
# A timm `config.json` as `timm.models._hub.save_for_hf` writes it (DeiT's statistics).
TIMM_CONFIG = {
    "architecture": "vit_tiny_patch16_224",
    "num_classes": 7,
    "pretrained_cfg": {
        "input_size": [3, 32, 32],
        "interpolation": "bilinear",
        "crop_pct": 0.95,
        "crop_mode": "center",
        "mean": [0.485, 0.456, 0.406],
        "std": [0.229, 0.224, 0.225],
        "num_classes": 7,
        "license": "apache-2.0",
    },
}


def publish(cache, repository, folder, sha=SHA, ref="main"):
    """Lays `folder`'s files out in the hub cache `cache` as huggingface_hub does: the snapshot
    `models--ORG--NAME/snapshots/SHA/` and the ref `refs/REF` naming it."""
    root = cache / f"models--{repository.replace('/', '--')}"
    shutil.copytree(folder, root / "snapshots" / sha)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / ref).write_text(sha)


@pytest.fixture
def timm_source(tmp_path):
    """A perturbed width-192 model and a timm folder of it (`model.safetensors`, `config.json`)."""
    model = perturb(keras_vit.ViT(tiny_config(hidden_size=192, num_heads=3, mlp_dim=256)))
    folder = tmp_path / "timm_folder"
    folder.mkdir()
    _write_safetensors(folder / "model.safetensors", _timm_state_dict(model))
    (folder / "config.json").write_text(json.dumps(TIMM_CONFIG))
    return model, folder


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub")
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def _weights(model):
    return [keras.ops.convert_to_numpy(w) for w in model.weights]


def test_a_timm_repository_loads_from_the_cache_with_its_own_transform(timm_source, offline_cache, caplog):
    source, folder = timm_source
    publish(offline_cache, "org/tiny", folder)
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        for name in ("hf://org/tiny", f"hf://org/tiny@{SHA}"):
            model = keras_vit.ViT.from_checkpoint(name)
            c = model.config
            assert (c.input_mean, c.input_std) == (IMAGENET_MEAN, IMAGENET_STD), name
            assert (c.image_size, c.crop_fraction, c.interpolation) == ((32, 32), 0.95, "bilinear")
            for ours, theirs in zip(_weights(model), _weights(source)):
                np.testing.assert_array_equal(ours, theirs)
    assert "normalisation" not in caplog.text  # the repository says which
    # from_preset and the command line's --weights take the transform too, and the cache is seen as such.
    shape = dict(image_size=32, patch_size=8, num_layers=2, mlp_dim=256, num_classes=7)
    preset = keras_vit.ViT.from_preset("vit_ti16", weights="hf://org/tiny", **shape)
    assert preset.config.input_mean == IMAGENET_MEAN and preset.config.crop_fraction == 0.95
    assert hub.cached("hf://org/tiny") and not hub.cached("hf://org/other")


def test_hf_home_is_the_cache_without_hf_hub_cache(timm_source, offline_cache, monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    publish(tmp_path / "home" / "hub", "org/tiny", timm_source[1])
    assert keras_vit.ViT.from_checkpoint("hf://org/tiny").config.input_mean == IMAGENET_MEAN


def test_offline_without_the_repository_is_one_line_saying_how_to_fetch_it(offline_cache):
    with pytest.raises(CheckpointError) as error:
        keras_vit.ViT.from_checkpoint("hf://org/missing@v2")
    message = str(error.value)
    assert "\n" not in message and "hf://org/missing@v2" in message
    assert str(offline_cache / "models--org--missing") in message
    assert "`hf download org/missing --revision v2`" in message and "local copy" in message
    for bad in ("hf://org", "hf://org/name/extra", "hf://org/name@"):
        with pytest.raises(CheckpointError, match="hf://ORG/NAME or hf://ORG/NAME@REVISION"):
            keras_vit.ViT.from_checkpoint(bad)


def test_a_bare_timm_file_warns_once_of_its_assumed_normalization(timm_source, tmp_path, caplog):
    bare = tmp_path / "bare.safetensors"
    shutil.copy(timm_source[1] / "model.safetensors", bare)  # no config.json beside it
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        model = keras_vit.ViT.from_checkpoint(bare)
    [record] = [r for r in caplog.records if "normalisation" in r.getMessage()]
    assert "assumed 'inception'" in record.getMessage() and "--normalization" in record.getMessage()
    assert model.config.input_mean == OFFICIAL_MEAN
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        named = keras_vit.ViT.from_checkpoint(bare, normalization="imagenet")
        given = keras_vit.ViT.from_checkpoint(bare, normalization="100,50")
    assert "normalisation" not in caplog.text
    assert named.config.input_mean == IMAGENET_MEAN and given.config.input_std == (50.0,) * 3
    x = images(size=(32, 32))  # the same weights, fed otherwise: other logits
    assert np.abs(keras.ops.convert_to_numpy(model(x) - named(x))).max() > 1e-2


def test_normalization_names_and_values():
    assert normalization_fields("clip")["input_mean"][0] == pytest.approx(0.48145466 * 255, abs=1e-4)
    assert normalization_fields("123.675,116.28,103.53,58.395,57.12,57.375")["input_std"] == IMAGENET_STD
    for bad, says in (
        ("vgg", "must be one of imagenet, inception, clip or MEAN,STD"),
        ("0.5,0.5", "looks like \\[0, 1\\] units: in pixels that is 127.5,127.5"),
        ("127.5,0", "the stds positive"),
        ("1,2,3", "the stds positive"),
    ):
        with pytest.raises(ValueError, match=says):
            normalization_fields(bad)


def test_a_transformers_repository_in_the_cache_gives_its_processors_statistics(offline_cache, tmp_path):
    pytest.importorskip("torch")
    from keras_vit.benchmark import torchvision_stub

    torchvision_stub.install()  # before transformers
    transformers = pytest.importorskip("transformers")
    from helpers import hf_vit_config

    transformers.ViTModel(hf_vit_config()).save_pretrained(tmp_path / "hf")
    transformers.ViTImageProcessor(image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225]).save_pretrained(
        tmp_path / "hf"
    )
    publish(offline_cache, "google/tiny-vit", tmp_path / "hf")
    config = keras_vit.ViT.from_checkpoint("hf://google/tiny-vit").config
    np.testing.assert_allclose(config.input_mean, IMAGENET_MEAN, atol=1e-4)
    assert config.crop_fraction == 1.0


def test_convert_writes_the_repository_s_transform_and_takes_normalization(
    timm_source, offline_cache, tmp_path, capsys
):
    from keras_vit_cli import main

    publish(offline_cache, "org/tiny", timm_source[1])
    assert main(["convert", "hf://org/tiny", str(tmp_path / "hub.keras")]) == 0
    assert "32x32 input (imagenet, crop 0.95, bilinear)" in capsys.readouterr().out
    bare = tmp_path / "bare.safetensors"
    shutil.copy(timm_source[1] / "model.safetensors", bare)
    assert main(["convert", str(bare), str(tmp_path / "bare.keras"), "--normalization", "clip"]) == 0
    assert "(clip, crop 0.875, bilinear)" in capsys.readouterr().out
    assert main(["convert", str(bare), str(tmp_path / "x.keras"), "--normalization", "0.5,0.5"]) == 2
    assert "--normalization must be one of" in capsys.readouterr().err


def test_a_keras_vit_model_published_on_the_hub_loads_by_name(offline_cache, tmp_path, caplog):
    """A `.keras` file in a repository, or a run directory's `best.keras` and labels, as
    `hf upload` publishes them: the model, its classes and its transform come back."""
    config = tiny_config(num_classes=3, input_mean=IMAGENET_MEAN, input_std=IMAGENET_STD, crop_fraction=0.9)
    source = perturb(keras_vit.ViT(config, class_names=["cat", "dog", "owl"]))
    for repository, file in (("me/model", "vit.keras"), ("me/run", "best.keras")):
        folder = tmp_path / repository
        folder.mkdir(parents=True)
        keras_vit.saving.save_model(source, folder / file)
        (folder / "labels.txt").write_text("cat\ndog\nowl\n")
        publish(offline_cache, repository, folder)
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        for name in ("hf://me/model", "hf://me/run"):
            model = keras_vit.ViT.from_checkpoint(name)
            assert model.config == source.config and model.class_names == ("cat", "dog", "owl"), name
            for ours, theirs in zip(_weights(model), _weights(source)):
                np.testing.assert_array_equal(ours, theirs)
    assert "normalisation" not in caplog.text
