"""`keras-vit checkpoints`: the names `--weights` takes and what is published of each."""

import pytest
from helpers import tiny_config
from test_hub import publish

import keras_vit
from keras_vit.checkpoints import catalog, known
from keras_vit.names import CHECKPOINT_FAMILIES
from keras_vit.presets import PRESETS
from keras_vit_cli import main


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        dict(classifier="map", num_classes=0),
        dict(num_register_tokens=4, no_embed_class=True, layer_scale_init=1e-5, representation_size=48),
        dict(mlp_type="swiglu", mlp_norm=True, key_bias=False),
        dict(qkv_bias=False, classifier="gap", image_size=(32, 48)),
    ],
)
def test_parameter_counts_off_the_config_are_the_built_models(overrides):
    model = keras_vit.ViT(tiny_config(**overrides))
    assert catalog.parameter_count(model.config) == model.count_params()


def test_every_listed_name_is_a_known_name_or_a_preset_s_hub_repository():
    published = {f"{preset}.{tag}" for tag, (_, top1) in catalog.TOP1.items() for preset in top1}
    assert published <= set(known.KNOWN_CHECKPOINTS) and set(catalog.HUB_NAMES) <= set(PRESETS)
    assert sum(entry.top1 is not None for entry in catalog.entries()) == len(published)
    assert set(catalog.FAMILIES.values()) == set(CHECKPOINT_FAMILIES)
    names = [entry.name for entry in catalog.entries()]
    assert names[: len(known.KNOWN_CHECKPOINTS)] == list(known.KNOWN_CHECKPOINTS)
    b16 = next(e for e in catalog.entries() if e.name == "vit_b16.augreg_in21k_ft_in1k")
    assert (b16.family, b16.resolution, b16.parameters, b16.top1) == ("vit", 224, 86_567_656, 84.532)
    head21k = next(e for e in catalog.entries() if e.name == "vit_b16.augreg_in21k")
    assert head21k.top1 is None and head21k.data == "ImageNet-21k"


def test_the_timm_facts_are_those_of_the_same_files():
    """timm's top-1 is of its checkpoint with the very URL of the known name; the hub names exist
    in timm's registry under that licence."""
    from keras_vit.benchmark import torchvision_stub

    torchvision_stub.install()
    timm = pytest.importorskip("timm")
    stems = dict(
        vit_ti16="vit_tiny_patch16",
        vit_s16="vit_small_patch16",
        vit_s32="vit_small_patch32",
        vit_b16="vit_base_patch16",
        vit_b32="vit_base_patch32",
        vit_b8="vit_base_patch8",
        vit_l16="vit_large_patch16",
        vit_r_ti16="vit_tiny_r_s16_p8",
        vit_r26_s32="vit_small_r26_s32",
        vit_r50_l32="vit_large_r50_s32",
    )
    for tag, (_, top1) in catalog.TOP1.items():
        for preset in top1 if tag.startswith("augreg_") else ():
            _, overrides, url = known.KNOWN_CHECKPOINTS[f"{preset}.{tag}"]
            timm_name = f"{stems[preset]}_{overrides.get('image_size', 224)}.{tag.removesuffix('_384')}"
            assert timm.models.get_pretrained_cfg(timm_name).url == url, timm_name
    for hub_name in catalog.HUB_NAMES.values():
        cfg = timm.models.get_pretrained_cfg(hub_name.removeprefix("hf://timm/"))
        assert cfg.hf_hub_id == hub_name.removeprefix("hf://") and cfg.license == catalog.LICENCE.lower()


def test_cached_names_are_marked(tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    url = known.KNOWN_CHECKPOINTS["vit_ti16.augreg_in21k"][2]
    (tmp_path / "keras" / "keras_vit").mkdir(parents=True)
    (tmp_path / "keras" / "keras_vit" / url.rsplit("/", 1)[-1]).write_bytes(b"")
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    (snapshot / "model.safetensors").write_bytes(b"")
    publish(tmp_path / "hub", "timm/vit_small_patch14_dinov2.lvd142m", snapshot)
    cached = {entry.name for entry in catalog.entries() if entry.cached}
    assert cached == {"vit_ti16.augreg_in21k", "hf://timm/vit_small_patch14_dinov2.lvd142m"}


def test_the_command_filters_and_refuses_in_one_line(capsys):
    assert main(["checkpoints", "--family", "dinov2", "--search", "REG4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["name", "family", "res"] and len(lines) == 4  # header and the 3 reg4 backbones
    assert all("reg4_dinov2" in line and "Apache-2.0" in line for line in lines[1:])
    assert main(["checkpoints", "--search", "s16.augreg_in21k_ft_in1k_384"]) == 0
    out = capsys.readouterr().out
    assert "83.802 (timm)" in out and "timm: timm results/results-imagenet.csv" in out
    assert main(["checkpoints", "--search", "nothing-like-it"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no checkpoint matches --search 'nothing-like-it'" in err
    with pytest.raises(SystemExit) as stop:
        main(["checkpoints", "--family", "resnet"])
    assert stop.value.code == 2 and "invalid choice: 'resnet'" in capsys.readouterr().err


def test_the_listing_builds_no_model(monkeypatch):
    monkeypatch.setattr(keras_vit.ViT, "__init__", None)  # a model built would fail
    assert len(catalog.entries()) == len(known.KNOWN_CHECKPOINTS) + len(catalog.HUB_NAMES)
