"""Checkpoint formats, policies and errors, offline, with files written here in the real formats."""

import json
import logging
import struct

import keras
import numpy as np
import pytest
from helpers import hf_vit_config, images, perturb, tiny_config

import keras_vit
from keras_vit.checkpoints import CheckpointError, known
from keras_vit.checkpoints.files import read_safetensors
from keras_vit.checkpoints.official import RECORD_KEY


def _logits(model, x):
    return keras.ops.convert_to_numpy(model(x))


def _save_official_npz(model, path):
    """`model` as a published .npz holds it: `save_npz`'s tensors without keras_vit's record."""
    keras_vit.save_npz(model, path.with_suffix(".with_record.npz"))
    with np.load(path.with_suffix(".with_record.npz"), allow_pickle=False) as f:
        np.savez(path, **{k: f[k] for k in f.files if k != RECORD_KEY})


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"classifier": "gap"},
        {"representation_size": 24, "layer_scale_init": 0.1},
        {"resnet_layers": (1, 2), "resnet_width": 32, "patch_size": 1, "image_size": 64},
        # What no tensor tells (Hugging Face's epsilon, timm's statistics, the transform): the file's record.
        {
            "layer_norm_epsilon": 1e-12,
            "input_mean": (124.0, 116.0, 104.0),
            "crop_fraction": 1.0,
            "gelu_approximate": True,
        },
    ],
    ids=["token", "gap", "prelogits_layerscale", "hybrid", "recorded_fields"],
)
def test_npz_round_trip_is_bit_exact(tmp_path, overrides):
    model = perturb(keras_vit.ViT(tiny_config(**overrides)))
    model.class_names = tuple(f"class {i}" for i in range(model.config.num_classes))
    path = tmp_path / "model.npz"
    keras_vit.save_npz(model, path)
    restored = keras_vit.ViT.from_checkpoint(path)
    assert restored.config == model.config and restored.class_names == model.class_names
    for a, b in zip(model.weights, restored.weights):
        assert a.path == b.path
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))
    x = images(size=model.config.image_size)
    np.testing.assert_array_equal(_logits(restored, x), _logits(model, x))


def test_a_non_square_checkpoint_without_its_grid_loads_at_the_size_it_is_given(tmp_path, caplog):
    # image_size=(32, 40) was refused: "cannot infer the image size ...; pass image_size", given or not
    from keras_vit.checkpoints.official import GRID_KEY

    model = perturb(keras_vit.ViT(tiny_config(image_size=(32, 40))))  # a 4x5 grid, 21 tokens
    _save_official_npz(model, tmp_path / "with_grid.npz")
    with np.load(tmp_path / "with_grid.npz") as f:
        np.savez(tmp_path / "plain.npz", **{k: f[k] for k in f.files if k != GRID_KEY})
    with pytest.raises(CheckpointError, match=r"plain\.npz: cannot infer the image size .* pass image_size"):
        keras_vit.ViT.from_checkpoint(tmp_path / "plain.npz")
    restored = keras_vit.ViT.from_checkpoint(tmp_path / "plain.npz", image_size=(32, 40), layer_norm_epsilon=1e-6)
    x = images(size=(32, 40))
    np.testing.assert_allclose(_logits(restored, x), _logits(model, x), atol=1e-5)
    # a 5x4 grid holds as many tokens: the embedding is taken as the model's grid, which is said
    caplog.clear()
    keras_vit.ViT.from_checkpoint(tmp_path / "plain.npz", image_size=(40, 32), layer_norm_epsilon=1e-6)
    assert "position embedding taken as the model's 5x4 grid (the checkpoint does not record its grid" in caplog.text
    caplog.clear()
    keras_vit.ViT.from_checkpoint(tmp_path / "with_grid.npz", layer_norm_epsilon=1e-6)
    assert "taken as the model's" not in caplog.text  # a recorded grid needs no note


def test_loading_into_a_model_that_computes_otherwise_is_said_in_one_line(tmp_path, caplog):
    # from_preset(weights=...) / load_weights took such a file's weights and class names silently
    saved = tiny_config(input_mean=(120, 110, 100), input_std=(50, 60, 70), layer_norm_epsilon=1e-12)
    keras_vit.save_npz(keras_vit.ViT(saved), tmp_path / "own.npz")
    keras_vit.load_weights(keras_vit.ViT(saved), tmp_path / "own.npz")
    assert not caplog.records
    keras_vit.load_weights(keras_vit.ViT(tiny_config()), tmp_path / "own.npz")
    [record] = caplog.records
    assert record.getMessage().startswith(
        "keras_vit: own.npz was saved from a model with input_mean=(120.0, 110.0, 100.0), input_std=(50.0, 60.0, "
        "70.0), layer_norm_epsilon=1e-12; this model has input_mean=(127.5, 127.5, 127.5)"
    )
    _save_official_npz(keras_vit.ViT(saved), tmp_path / "official.npz")  # records nothing: nothing to compare
    caplog.clear()
    keras_vit.load_weights(keras_vit.ViT(tiny_config()), tmp_path / "official.npz")
    assert not caplog.records


def test_save_npz_writes_only_npz_names(tmp_path):
    # `w.safetensors` had held an .npz that the reader then took for a corrupt safetensors file
    for name in ("nosuffix", "w.safetensors"):
        with pytest.raises(CheckpointError, match=f"save_npz writes an .npz file: name it so \\(got {name}\\)"):
            keras_vit.save_npz(keras_vit.ViT(tiny_config()), tmp_path / name)
    assert not list(tmp_path.iterdir())


def test_from_checkpoint_takes_class_names_for_a_new_head(tmp_path):
    model = perturb(keras_vit.ViT(tiny_config()))
    model.class_names = tuple(f"class {i}" for i in range(model.config.num_classes))
    keras_vit.save_npz(model, tmp_path / "model.npz")
    tuned = keras_vit.ViT.from_checkpoint(tmp_path / "model.npz", num_classes=2, class_names=["cat", "dog"])
    assert tuned.class_names == ("cat", "dog") and tuned.config.num_classes == 2
    others = keras_vit.ViT.from_checkpoint(tmp_path / "model.npz", class_names=[str(i) for i in range(7)])
    assert others.class_names == tuple(str(i) for i in range(7))  # given names win over the file's
    np.testing.assert_allclose(_logits(others, images()), 0.0)  # and name other classes: a new zero head
    two = keras_vit.ViT.from_checkpoint(tmp_path / "model.npz", class_names=["cat", "dog"])
    assert two.config.num_classes == 2 and two.class_names == ("cat", "dog")  # the count of the names
    with pytest.raises(ValueError, match="2 class names for a model of 3 classes"):
        keras_vit.ViT.from_checkpoint(tmp_path / "model.npz", num_classes=3, class_names=["cat", "dog"])


def test_from_preset_takes_class_names_and_its_weights_head_follows_them(tmp_path):
    # `from_preset(..., class_names=...)` was "unknown ViTConfig field(s): class_names".
    model = perturb(keras_vit.ViT.from_preset("vit_ti16", image_size=32, num_classes=3))
    model.class_names = ("red", "green", "blue")
    model.save(tmp_path / "rgb.keras")
    x = images()
    named = keras_vit.ViT.from_preset("vit_ti16", image_size=32, class_names=["a", "b"])
    assert named.config.num_classes == 2 and named.class_names == ("a", "b")
    reordered = keras_vit.ViT.from_preset(
        "vit_ti16", weights=tmp_path / "rgb.keras", image_size=32, class_names=["blue", "green", "red"]
    )
    np.testing.assert_allclose(_logits(reordered, x), _logits(model, x)[:, ::-1], atol=1e-5)
    with pytest.raises(ValueError, match="list of strings"):
        keras_vit.ViT.from_preset("vit_ti16", class_names="red")


def test_a_kept_head_follows_the_class_names_of_the_checkpoint_and_the_model(tmp_path):
    # The head was kept whenever its shape fit: a fine-tune of a red/green/blue model on folders
    # blue/green/red started out calling red images blue.
    model = perturb(keras_vit.ViT(tiny_config(num_classes=3)))
    model.class_names = ("red", "green", "blue")
    model.save(tmp_path / "rgb.keras")
    x = images()
    reordered = keras_vit.ViT(tiny_config(num_classes=3), class_names=("blue", "green", "red"))
    notes = keras_vit.load_weights(reordered, tmp_path / "rgb.keras")
    assert notes == ["the checkpoint's head reordered to the model's class order"]
    np.testing.assert_allclose(_logits(reordered, x), _logits(model, x)[:, ::-1], atol=1e-6)
    others = keras_vit.ViT(tiny_config(num_classes=3), class_names=("cat", "dog", "red"))
    notes = keras_vit.load_weights(others, tmp_path / "rgb.keras")
    assert notes == ["new zero head (64, 3) (the checkpoint's classes are others: green, blue not among the model's)"]
    np.testing.assert_allclose(_logits(others, x), 0.0)
    # Names compare in Unicode's composed form: "é" as "e" and an accent (a macOS folder) is "é".
    decomposed = keras_vit.ViT(tiny_config(num_classes=3), class_names=("blue", "gre\u0301en", "red"))
    model.class_names = ("red", "gr\u00e9en", "blue")
    model.save(tmp_path / "rgb_nfc.keras")
    assert keras_vit.load_weights(decomposed, tmp_path / "rgb_nfc.keras") == [
        "the checkpoint's head reordered to the model's class order"
    ]
    np.testing.assert_allclose(_logits(decomposed, x), _logits(model, x)[:, ::-1], atol=1e-6)
    model.class_names = ("red", "green", "blue")
    for names in (None, ("red", "green", "blue")):  # unnamed on one side, or the same names: kept as it is
        same = keras_vit.ViT(tiny_config(num_classes=3), class_names=names)
        assert keras_vit.load_weights(same, tmp_path / "rgb.keras") == []
        np.testing.assert_allclose(_logits(same, x), _logits(model, x), atol=1e-6)
        assert same.class_names == ("red", "green", "blue")


def test_keras_weights_files_load_into_a_model_with_another_head_or_resolution(tmp_path):
    # `keras_vit.load_weights(model, "x.weights.h5")` was "unsupported checkpoint type .h5"
    model = perturb(keras_vit.ViT(tiny_config()))
    model.save_weights(tmp_path / "model.weights.h5")
    same = keras_vit.ViT(tiny_config())
    assert keras_vit.load_weights(same, tmp_path / "model.weights.h5") == []
    np.testing.assert_array_equal(_logits(same, images()), _logits(model, images()))
    tuned = keras_vit.ViT(tiny_config(num_classes=2, image_size=48))
    notes = keras_vit.load_weights(tuned, str(tmp_path / "model.weights.h5"))
    assert notes == ["new zero head (64, 2) (the checkpoint's head is (64, 7))"]
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(tuned.get_layer("block_1").mlp.fc1.kernel),
        keras.ops.convert_to_numpy(model.get_layer("block_1").mlp.fc1.kernel),
    )
    np.testing.assert_allclose(_logits(tuned.resized(32), images()), 0.0)  # the new head starts at zero
    with pytest.raises(CheckpointError, match="a Keras weights file of another architecture than this model's"):
        keras_vit.load_weights(keras_vit.ViT(tiny_config(num_layers=3)), tmp_path / "model.weights.h5")
    with pytest.raises(CheckpointError, match="holds no architecture. Build the model"):
        keras_vit.ViT.from_checkpoint(tmp_path / "model.weights.h5")


def test_an_npz_file_without_keras_vits_record_loads_with_the_official_defaults(tmp_path):
    model = keras_vit.ViT(tiny_config(layer_norm_epsilon=1e-12, crop_fraction=1.0))
    _save_official_npz(model, tmp_path / "official.npz")
    restored = keras_vit.ViT.from_checkpoint(tmp_path / "official.npz")
    assert restored.config == model.config.replace(
        layer_norm_epsilon=1e-6, crop_fraction=keras_vit.ViTConfig().crop_fraction
    )
    assert restored.class_names is None


@pytest.mark.parametrize(
    "resnet",
    [dict(resnet_layers=(), patch_size=4), dict(resnet_layers=(1, 1, 1, 1), patch_size=1)],
    ids=["root_alone", "four_stages"],
)
def test_a_hybrid_is_read_off_official_npz_keys(tmp_path, resnet):
    """AugReg's R+Ti/16 (the ResNet root alone, stride 4) and R50+L/32 (four stages, stride 32)
    layouts: stages, width and resolution come from the tensors when no record says them."""
    model = perturb(keras_vit.ViT(tiny_config(image_size=64, resnet_width=32, **resnet)))
    _save_official_npz(model, tmp_path / "official.npz")
    restored = keras_vit.ViT.from_checkpoint(tmp_path / "official.npz")
    assert restored.config == model.config
    x = images(size=model.config.image_size)
    np.testing.assert_array_equal(_logits(restored, x), _logits(model, x))


def test_official_key_layout(tmp_path):
    model = keras_vit.ViT(tiny_config(representation_size=16))
    keras_vit.save_npz(model, tmp_path / "m.npz")
    with np.load(tmp_path / "m.npz", allow_pickle=False) as f:
        shapes = {k: f[k].shape for k in f.files}
    block = "Transformer/encoderblock_1/"
    assert shapes["embedding/kernel"] == (8, 8, 3, 64) and shapes["cls"] == (1, 1, 64)
    assert shapes["Transformer/posembed_input/pos_embedding"] == (1, 17, 64)
    assert shapes[block + "MultiHeadDotProductAttention_1/query/kernel"] == (64, 4, 16)
    assert shapes[block + "MultiHeadDotProductAttention_1/value/bias"] == (4, 16)
    assert shapes[block + "MultiHeadDotProductAttention_1/out/kernel"] == (4, 16, 64)
    assert shapes[block + "MlpBlock_3/Dense_0/kernel"] == (64, 128)
    assert shapes[block + "LayerNorm_2/scale"] == (64,)
    assert shapes["Transformer/encoder_norm/bias"] == (64,)
    assert shapes["pre_logits/kernel"] == (64, 16) and shapes["head/kernel"] == (16, 7)


def _official(model, tmp_path):
    path = tmp_path / "official.npz"
    keras_vit.save_npz(model, path)
    with np.load(path, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def test_linen_names_and_big_vision_layouts_load(tmp_path):
    """Newer Flax `_0/_0/_1/_0` names; big_vision's `params/` prefix, class-slot-free position
    embedding and scanned (stacked) blocks: all give the original model's logits."""
    model = perturb(keras_vit.ViT(tiny_config(classifier="gap")))
    x = images()
    tensors = _official(model, tmp_path)
    rename = {
        "MultiHeadDotProductAttention_1": "MultiHeadDotProductAttention_0",
        "LayerNorm_2": "LayerNorm_1",
        "MlpBlock_3": "MlpBlock_0",
    }

    def linen(key):
        for old, new in rename.items():
            key = key.replace(f"/{old}/", f"/{new}/")
        return key

    linen_tensors = {linen(k): v for k, v in tensors.items()}
    np.savez(tmp_path / "linen.npz", **linen_tensors)
    big_vision = {f"params/{k}": v for k, v in linen_tensors.items() if "posembed" not in k}
    big_vision["params/pos_embedding"] = tensors["Transformer/posembed_input/pos_embedding"]
    np.savez(tmp_path / "big_vision.npz", **big_vision)
    scanned = {k: v for k, v in big_vision.items() if "encoderblock_" not in k}
    for key in [k for k in big_vision if "encoderblock_0/" in k]:
        stacked = [big_vision[key.replace("encoderblock_0/", f"encoderblock_{i}/")] for i in range(2)]
        scanned[key.replace("encoderblock_0/", "encoderblock/")] = np.stack(stacked)
    np.savez(tmp_path / "scanned.npz", **scanned)
    for name in ("linen", "big_vision", "scanned"):
        loaded = keras_vit.ViT.from_checkpoint(tmp_path / f"{name}.npz")
        assert loaded.config == model.config, name
        np.testing.assert_array_equal(_logits(loaded, x), _logits(model, x))


def test_class_slot_free_position_embedding_loads_as_its_source_computes(tmp_path, caplog):
    """big_vision token models (and timm's `no_embed_class`) add no position embedding to the
    class token: loaded here, the slot is zero, so the logits are the source's."""
    model = perturb(keras_vit.ViT(tiny_config()))
    slot = model.get_layer("position_embedding").embedding
    without = keras.ops.convert_to_numpy(slot).copy()
    without[:, :1] = 0.0
    slot.assign(without)  # the model big_vision's file describes
    tensors = _official(model, tmp_path)
    pos = tensors.pop("Transformer/posembed_input/pos_embedding")
    tensors.pop("Transformer/posembed_input/grid_size")
    tensors = {f"params/{k}": v for k, v in tensors.items()}
    tensors["params/pos_embedding"] = pos[:, 1:]  # big_vision stores no class-token slot
    np.savez(tmp_path / "bv.npz", **tensors)
    target = perturb(keras_vit.ViT(tiny_config()), seed=1)
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        keras_vit.load_weights(target, tmp_path / "bv.npz")
    assert "zero class-token slot" in caplog.text
    np.testing.assert_array_equal(_logits(target, images()), _logits(model, images()))
    built = keras_vit.ViT.from_checkpoint(tmp_path / "bv.npz")
    assert built.config == model.config
    np.testing.assert_array_equal(_logits(built, images()), _logits(model, images()))


def test_non_square_grid_round_trips_and_resamples_from_the_right_grid(tmp_path, caplog):
    """A 7x8 grid (56x64 pixels, 57 tokens with the class slot): `save_npz` stores the grid, so
    `from_checkpoint` rebuilds the model bit-exactly and a 64x64 model resamples from 7x8, as
    do `.keras` weights files; a model of the same grid never resamples."""
    from keras_vit.resample import resample_position_embeddings

    model = perturb(keras_vit.ViT(tiny_config(image_size=(56, 64))))
    keras_vit.save_npz(model, tmp_path / "grid.npz")
    rebuilt = keras_vit.ViT.from_checkpoint(tmp_path / "grid.npz")
    assert rebuilt.config.image_size == (56, 64) and rebuilt.config == model.config
    for a, b in zip(rebuilt.weights, model.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))
    source = keras.ops.convert_to_numpy(model.get_layer("position_embedding").embedding)
    expected = resample_position_embeddings(source, (8, 8), (7, 8), 1)
    square = keras_vit.ViT(tiny_config(image_size=64))
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        keras_vit.load_weights(square, tmp_path / "grid.npz")
    assert "position embedding resampled from a 7x8 to a 8x8 grid" in caplog.text
    got = keras.ops.convert_to_numpy(square.get_layer("position_embedding").embedding)
    np.testing.assert_allclose(got, expected, atol=1e-6)
    model.save_weights(tmp_path / "grid.weights.h5")
    square_h5 = keras_vit.ViT(tiny_config(image_size=64))
    square_h5.load_weights(tmp_path / "grid.weights.h5")
    got = keras.ops.convert_to_numpy(square_h5.get_layer("position_embedding").embedding)
    np.testing.assert_allclose(got, expected, atol=1e-6)
    same = keras_vit.ViT(tiny_config(image_size=(56, 64)))
    tensors = _official(model, tmp_path)
    del tensors["Transformer/posembed_input/grid_size"]  # a file of another writer: no grid stored
    np.savez(tmp_path / "nogrid.npz", **tensors)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        keras_vit.load_weights(same, tmp_path / "nogrid.npz")
    assert "resampled" not in caplog.text  # 57 tokens fit the model's own 7x8 grid
    np.testing.assert_array_equal(_logits(same, images(size=(56, 64))), _logits(model, images(size=(56, 64))))


def test_head_policy_and_one_log_line(tmp_path, caplog):
    source = perturb(keras_vit.ViT(tiny_config(representation_size=16)))
    path = tmp_path / "src.npz"
    keras_vit.save_npz(source, path)
    same = keras_vit.ViT(tiny_config(representation_size=16))
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        assert keras_vit.load_weights(same, path) == []
    assert not caplog.records
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(same.get_layer("head").kernel),
        keras.ops.convert_to_numpy(source.get_layer("head").kernel),
    )
    other = keras_vit.ViT(tiny_config(num_classes=3))
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        notes = keras_vit.load_weights(other, path)
    assert len(caplog.records) == 1 and "new zero head" in caplog.text and "pre-logits" in caplog.text
    assert len(notes) == 2
    assert not np.any(keras.ops.convert_to_numpy(other.get_layer("head").kernel))
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(other.get_layer("block_1").mlp.fc2.kernel),
        keras.ops.convert_to_numpy(source.get_layer("block_1").mlp.fc2.kernel),
    )
    headless = keras_vit.ViT(tiny_config(num_classes=0, representation_size=16))
    assert "dropped the checkpoint's 7-class head" in keras_vit.load_weights(headless, path)[0]


def test_higher_resolution_resamples_position_embeddings(tmp_path):
    source = perturb(keras_vit.ViT(tiny_config()))
    keras_vit.save_npz(source, tmp_path / "m.npz")
    big = keras_vit.ViT.from_preset("vit_ti16", weights=None, **tiny_config().to_dict() | {"image_size": 64})
    keras_vit.load_weights(big, tmp_path / "m.npz")
    expected = keras_vit.resample_position_embeddings(
        keras.ops.convert_to_numpy(source.get_layer("position_embedding").embedding), (8, 8)
    )
    np.testing.assert_allclose(keras.ops.convert_to_numpy(big.get_layer("position_embedding").embedding), expected)
    np.testing.assert_allclose(
        _logits(big, images(size=(64, 64))), _logits(source.resized(64), images(size=(64, 64))), atol=1e-6
    )


def test_grayscale_model_sums_rgb_filters(tmp_path):
    rgb = perturb(keras_vit.ViT(tiny_config()))
    keras_vit.save_npz(rgb, tmp_path / "rgb.npz")
    gray = keras_vit.ViT(tiny_config(channels=1, input_mean=[127.5], input_std=[127.5]))
    keras_vit.load_weights(gray, tmp_path / "rgb.npz")
    x = images(channels=1)
    np.testing.assert_allclose(_logits(gray, x), _logits(rgb, np.repeat(x, 3, axis=-1)), atol=1e-4)


def _save(tmp_path, model, drop=None, add=None, reshape=None):
    tensors = _official(model, tmp_path)
    if drop:
        tensors.pop(drop)
    if add:
        tensors.update(add)
    if reshape:
        tensors[reshape] = tensors[reshape][..., :-1]
    path = tmp_path / "edited.npz"
    np.savez(path, **tensors)
    return path


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            dict(drop="Transformer/encoderblock_1/MlpBlock_3/Dense_1/bias"),
            r"missing tensor\(s\) for 'block_1/mlp/fc2/bias'",
        ),
        (
            dict(add={"Transformer/encoderblock_1/Extra_9/kernel": np.zeros(3)}),
            r"no place for: 'Transformer/encoderblock_1/Extra_9/kernel'",
        ),
        (
            dict(reshape="Transformer/encoder_norm/scale"),
            r"'encoder_norm/gamma' has shape \(63,\), the model expects \(64,\)",
        ),
        (dict(drop="Transformer/encoderblock_1/LayerNorm_0/scale"), r"missing tensor\(s\) for 'block_1/norm1/gamma'"),
    ],
    ids=["missing", "extra", "wrong_shape", "missing_norm"],
)
def test_mismatches_are_errors_and_write_nothing(tmp_path, edit, message):
    source = perturb(keras_vit.ViT(tiny_config()))
    path = _save(tmp_path, source, **edit)
    target = keras_vit.ViT(tiny_config())
    before = [keras.ops.convert_to_numpy(w).copy() for w in target.weights]
    with pytest.raises(CheckpointError, match=message):
        keras_vit.load_weights(target, path)
    for b, w in zip(before, target.weights):
        np.testing.assert_array_equal(b, keras.ops.convert_to_numpy(w))


def test_deeper_checkpoint_is_an_error(tmp_path):
    keras_vit.save_npz(keras_vit.ViT(tiny_config(num_layers=3)), tmp_path / "deep.npz")
    with pytest.raises(CheckpointError, match=r"no place for: 'block_2/"):
        keras_vit.load_weights(keras_vit.ViT(tiny_config()), tmp_path / "deep.npz")


def test_truncated_corrupt_and_unknown_files(tmp_path):
    model = keras_vit.ViT(tiny_config())
    keras_vit.save_npz(model, tmp_path / "good.npz")
    data = (tmp_path / "good.npz").read_bytes()
    (tmp_path / "truncated.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"truncated.npz: corrupt or truncated \.npz"):
        keras_vit.load_weights(model, tmp_path / "truncated.npz")
    (tmp_path / "noise.npz").write_bytes(b"\x00" * 100)
    with pytest.raises(CheckpointError, match=r"noise.npz: corrupt or truncated .npz file \(not a zip archive"):
        keras_vit.load_weights(model, tmp_path / "noise.npz")
    np.savez(tmp_path / "pickled.npz", weights=np.array([{"a": 1}], dtype=object))
    with pytest.raises(CheckpointError, match=r"pickled.npz: corrupt or truncated .npz file \(Object arrays"):
        keras_vit.load_weights(model, tmp_path / "pickled.npz")
    np.savez(tmp_path / "other.npz", foo=np.zeros(3))
    with pytest.raises(CheckpointError, match=r"not a ViT checkpoint keras_vit knows.*foo"):
        keras_vit.load_weights(model, tmp_path / "other.npz")
    with pytest.raises(CheckpointError, match=r"checkpoint not found: .*absent.npz"):
        keras_vit.load_weights(model, tmp_path / "absent.npz")
    (tmp_path / "weights.h5").write_bytes(b"x")
    with pytest.raises(CheckpointError, match=r"unsupported checkpoint type \.h5"):
        keras_vit.load_weights(model, tmp_path / "weights.h5")


def test_keras_files_and_training_runs_are_checkpoints_too(tmp_path):
    """A `.keras` model or a keras-vit run directory (its best.keras) loads bit-exactly, gives
    its config, and fine-tunes like any checkpoint: a new head, another grid (non-square kept)."""
    model = perturb(keras_vit.ViT(tiny_config(image_size=(56, 64))))
    run = tmp_path / "run"
    run.mkdir()
    keras_vit.saving.save_model(model, run / "best.keras")
    for source in (run, run / "best.keras"):
        same = keras_vit.ViT(model.config)
        assert keras_vit.load_weights(same, source) == []
        for a, b in zip(same.weights, model.weights):
            np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))
        assert keras_vit.checkpoints.config_fields(source) == model.config.to_dict()
    tuned = keras_vit.ViT.from_checkpoint(run, num_classes=3, image_size=64)
    assert not np.any(keras.ops.convert_to_numpy(tuned.get_layer("head").kernel))
    expected = keras_vit.resample_position_embeddings(
        keras.ops.convert_to_numpy(model.get_layer("position_embedding").embedding), (8, 8), (7, 8), 1
    )
    got = keras.ops.convert_to_numpy(tuned.get_layer("position_embedding").embedding)
    np.testing.assert_allclose(got, expected, atol=1e-6)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"empty is a folder without .*best.keras/last.keras"):
        keras_vit.load_weights(same, tmp_path / "empty")
    (tmp_path / "bad.keras").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match=r"bad.keras is not a whole .keras file .*: truncated or corrupt"):
        keras_vit.load_weights(same, tmp_path / "bad.keras")


def _write_safetensors(path, tensors, dtype="F32"):
    header, chunks, offset = {}, [], 0
    for name, value in tensors.items():
        raw = (
            value.astype(np.float32).tobytes()
            if dtype == "F32"
            else (value.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
        )
        header[name] = {"dtype": dtype, "shape": list(value.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + b"".join(chunks))


def test_safetensors_reader_float32_bfloat16_and_truncation(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"a": rng.standard_normal((3, 4)).astype("float32"), "b": rng.standard_normal(5).astype("float32")}
    _write_safetensors(tmp_path / "f32.safetensors", tensors)
    got = read_safetensors(tmp_path / "f32.safetensors")
    for k in tensors:
        np.testing.assert_array_equal(got[k], tensors[k])
    _write_safetensors(tmp_path / "bf16.safetensors", tensors, dtype="BF16")
    got = read_safetensors(tmp_path / "bf16.safetensors")
    np.testing.assert_allclose(got["a"], tensors["a"], rtol=1e-2)  # bfloat16 keeps 8 bits of mantissa
    data = (tmp_path / "f32.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:-8])
    with pytest.raises(CheckpointError, match=r"truncated .safetensors file \(tensor 'b' is cut off\)"):
        read_safetensors(tmp_path / "cut.safetensors")
    (tmp_path / "head.safetensors").write_bytes(data[:20])
    with pytest.raises(CheckpointError, match=r"header runs past the end"):
        read_safetensors(tmp_path / "head.safetensors")


def test_known_names_offline_say_which_url_and_how_to_pass_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    name = "vit_ti16.augreg_in21k_ft_in1k"
    assert name in keras_vit.list_checkpoints()
    preset, overrides, url = known.KNOWN_CHECKPOINTS[name]
    assert preset == "vit_ti16" and url.startswith("https://storage.googleapis.com/vit_models/augreg/Ti_16-i21k")
    # Port 9 on loopback refuses at once: the same error path as an offline machine.
    monkeypatch.setitem(known.KNOWN_CHECKPOINTS, name, (preset, overrides, "http://127.0.0.1:9/Ti_16.npz"))
    with pytest.raises(
        CheckpointError,
        match=r"cannot download 'vit_ti16.augreg_in21k_ft_in1k' from "
        r"http://127.0.0.1:9/Ti_16.npz .*--weights /path/to/Ti_16.npz\)",
    ):
        keras_vit.ViT.from_preset("vit_ti16", weights=name)


def test_known_name_cache_and_checksum(tmp_path, monkeypatch):
    """A file:// URL stands in for the download: fetched once, then checked against its digest."""
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "home"))
    model = perturb(keras_vit.ViT(tiny_config()))
    keras_vit.save_npz(model, tmp_path / "published.npz")
    name = "vit_ti16.augreg_in21k_ft_in1k"
    monkeypatch.setitem(known.KNOWN_CHECKPOINTS, name, ("vit_ti16", {}, (tmp_path / "published.npz").as_uri()))
    first = known.fetch(name)
    assert first.parent == tmp_path / "home" / "keras_vit" and first.with_name(first.name + ".sha256").exists()
    target = keras_vit.ViT(tiny_config())
    keras_vit.load_weights(target, name)
    np.testing.assert_array_equal(_logits(target, images()), _logits(model, images()))
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0xFF
    first.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="does not match the checksum of its first download"):
        known.fetch(name)


def test_augreg_hybrids_have_known_names_that_build_them(tmp_path, monkeypatch):
    """R+Ti/16, R26+S/32 and R50+L/32: the three AugReg files each, from the release's bucket;
    one (written offline in its layout, without keras_vit's record) loads into the hybrid it names."""
    stems = {"vit_r_ti16": "R_Ti_16-i21k", "vit_r26_s32": "R26_S_32-i21k", "vit_r50_l32": "R50_L_32-i21k"}
    for preset, stem in stems.items():
        for suffix, overrides in (
            ("_ft_in1k", {}),
            ("_ft_in1k_384", {"image_size": 384}),
            ("", {"num_classes": 21843}),
        ):
            owner, fields, url = known.KNOWN_CHECKPOINTS[f"{preset}.augreg_in21k{suffix}"]
            assert (owner, fields) == (preset, overrides)
            assert url.startswith(f"https://storage.googleapis.com/vit_models/augreg/{stem}-300ep-") and url.endswith(
                {"_ft_in1k": "res_224.npz", "_ft_in1k_384": "res_384.npz", "": "sd_0.0.npz"}[suffix]
            )
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "home"))
    published = perturb(keras_vit.ViT.from_preset("vit_r_ti16", image_size=384))
    _save_official_npz(published, tmp_path / "published.npz")
    name = "vit_r_ti16.augreg_in21k_ft_in1k_384"
    monkeypatch.setitem(
        known.KNOWN_CHECKPOINTS, name, ("vit_r_ti16", {"image_size": 384}, (tmp_path / "published.npz").as_uri())
    )
    model = keras_vit.ViT.from_preset("vit_r_ti16", weights=name)
    assert model.config == published.config
    x = images(batch=1, size=(384, 384))
    np.testing.assert_array_equal(_logits(model, x), _logits(published, x))


def _timm_state_dict(model):
    """A keras_vit model's weights under timm's names and PyTorch layouts."""
    from keras_vit.checkpoints.assign import export

    w, t = export(model), {}
    t["cls_token"], t["pos_embed"] = w["class_token/token"], w["position_embedding/embedding"]
    t["patch_embed.proj.weight"] = w["patch_embedding/projection/kernel"].transpose(3, 2, 0, 1)
    t["patch_embed.proj.bias"] = w["patch_embedding/projection/bias"]
    for i in range(model.config.num_layers):
        keras_name, timm_name = f"block_{i}/", f"blocks.{i}."
        pairs = {
            "norm1/gamma": "norm1.weight",
            "norm1/beta": "norm1.bias",
            "norm2/gamma": "norm2.weight",
            "norm2/beta": "norm2.bias",
            "attention/qkv/bias": "attn.qkv.bias",
            "attention/out/bias": "attn.proj.bias",
            "mlp/fc1/bias": "mlp.fc1.bias",
            "mlp/fc2/bias": "mlp.fc2.bias",
        }
        for ours, theirs in pairs.items():
            if keras_name + ours in w:  # (no q/k/v biases when qkv_bias=False)
                t[timm_name + theirs] = w[keras_name + ours]
        for ours, theirs in {
            "attention/qkv": "attn.qkv",
            "attention/out": "attn.proj",
            "mlp/fc1": "mlp.fc1",
            "mlp/fc2": "mlp.fc2",
        }.items():
            t[f"{timm_name}{theirs}.weight"] = w[f"{keras_name}{ours}/kernel"].T
    t["norm.weight"], t["norm.bias"] = w["encoder_norm/gamma"], w["encoder_norm/beta"]
    t["head.weight"], t["head.bias"] = w["head/kernel"].T, w["head/bias"]
    return {k: np.ascontiguousarray(v) for k, v in t.items()}


def test_timm_file_of_any_width_loads_into_a_built_model(tmp_path):
    """timm files do not store the head count; loading into an existing model must not need it."""
    source = perturb(keras_vit.ViT(tiny_config()))  # width 64: no paper variant
    _write_safetensors(tmp_path / "w64.safetensors", _timm_state_dict(source))
    target = keras_vit.ViT(tiny_config())
    keras_vit.load_weights(target, tmp_path / "w64.safetensors")
    np.testing.assert_allclose(_logits(target, images()), _logits(source, images()), atol=1e-6)
    with pytest.raises(CheckpointError, match="does not store the head count .* its width 64 is no paper variant's"):
        keras_vit.ViT.from_checkpoint(tmp_path / "w64.safetensors")  # inferring the model does need it
    built = keras_vit.ViT.from_checkpoint(tmp_path / "w64.safetensors", num_heads=4)  # as the message says
    np.testing.assert_allclose(_logits(built, images()), _logits(source, images()), atol=1e-6)


def test_timm_variants_load_or_are_named(tmp_path):
    """A timm ViT without q/k/v biases loads as one (`qkv_bias=False`); parts keras_vit's ViT does
    not have (query/key normalisation, post-norm blocks, a second final norm) are named instead of
    a missing tensor."""
    source = perturb(keras_vit.ViT(tiny_config(hidden_size=192, num_heads=3, qkv_bias=False)))
    state = _timm_state_dict(source)
    _write_safetensors(tmp_path / "no_bias.safetensors", state)
    model = keras_vit.ViT.from_checkpoint(tmp_path / "no_bias.safetensors")
    assert model.config.qkv_bias is False and model.config.num_heads == 3
    np.testing.assert_allclose(_logits(model, images()), _logits(source, images()), atol=1e-5)
    for extra, message in (
        ({"blocks.0.attn.q_norm.weight": np.ones(64, "float32")}, "query/key normalisation"),
        ({"blocks.0.norm1_post.weight": np.ones(192, "float32")}, "post-norm blocks"),
        ({"fc_norm.weight": np.ones(192, "float32"), "fc_norm.bias": np.zeros(192, "float32")}, "both norm and"),
    ):
        _write_safetensors(tmp_path / "variant.safetensors", {**state, **extra})
        with pytest.raises(CheckpointError, match=f"a timm ViT with {message}.* is not supported"):
            keras_vit.ViT.from_checkpoint(tmp_path / "variant.safetensors")


def test_known_name_builds_the_model_its_checkpoint_was_trained_as(tmp_path, monkeypatch, caplog):
    """A 384-pixel known checkpoint (here a file written in its layout and cached, offline)
    builds a 384 model; asking for 224 resamples, in one log line naming both grids."""
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "home"))
    name = "vit_ti16.augreg_in21k_ft_in1k_384"
    assert known.KNOWN_CHECKPOINTS[name][1] == {"image_size": 384}
    published = keras_vit.ViT.from_preset("vit_ti16", image_size=384)
    keras_vit.save_npz(published, tmp_path / "published.npz")
    preset, overrides, _ = known.KNOWN_CHECKPOINTS[name]
    monkeypatch.setitem(known.KNOWN_CHECKPOINTS, name, (preset, overrides, (tmp_path / "published.npz").as_uri()))
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        model = keras_vit.ViT.from_preset("vit_ti16", weights=name)
    assert model.config.image_size == (384, 384) and "resampled" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        smaller = keras_vit.ViT.from_preset("vit_ti16", weights=name, image_size=224)
    assert smaller.config.image_size == (224, 224)
    assert "position embedding resampled from a 24x24 to a 14x14 grid" in caplog.text
    with pytest.raises(ValueError, match="is a checkpoint of preset 'vit_ti16', not 'vit_s16'"):
        keras_vit.ViT.from_preset("vit_s16", weights=name)


def test_a_huggingface_image_processor_gives_the_models_crop_and_interpolation(tmp_path):
    # Its resize and centre crop were not read: DeiT's 256 -> 224 crop and ViT's plain resize both
    # became keras_vit's default crop of 0.875.
    pytest.importorskip("torch")
    from keras_vit.benchmark import torchvision_stub
    from keras_vit.checkpoints.huggingface import input_transform

    torchvision_stub.install()  # before transformers, as tests/test_reference_parity.py
    transformers = pytest.importorskip("transformers")

    config = hf_vit_config(num_labels=3)
    transformers.ViTForImageClassification(config).save_pretrained(tmp_path / "hf")
    processors = {
        "deit": (transformers.DeiTImageProcessor(), 224 / 256, "bilinear"),  # bicubic: keras_vit's bilinear kept
        "vit": (transformers.ViTImageProcessor(), 1.0, "bilinear"),
        "nearest": (transformers.ViTImageProcessor(resample=0), 1.0, "nearest"),
    }
    for name, (processor, crop, interpolation) in processors.items():
        processor.save_pretrained(tmp_path / "hf")
        model = keras_vit.ViT.from_checkpoint(tmp_path / "hf")
        assert (model.config.crop_fraction, model.config.interpolation) == (crop, interpolation), name
    assert input_transform({"do_resize": False, "size": 224}) == {}
    assert input_transform({"size": {"shortest_edge": 256}, "do_center_crop": True, "crop_size": 224}) == {
        "crop_fraction": 0.875
    }
    assert input_transform(None) == {} and input_transform({"size": "x"}) == {}
