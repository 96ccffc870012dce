import gc
import warnings

import keras
import numpy as np
import pytest
from helpers import images, perturb, tiny_config

import keras_vit


@pytest.mark.parametrize(
    "overrides, dtype",
    [
        ({}, None),
        ({"classifier": "gap", "representation_size": 32, "layer_scale_init": 1e-4}, None),
        ({"dropout_rate": 0.1, "attention_dropout_rate": 0.1, "drop_path_rate": 0.2, "gelu_approximate": True}, None),
        ({"image_size": (32, 64)}, "mixed_bfloat16"),
        ({"resnet_layers": (1, 1), "resnet_width": 32, "patch_size": 1}, None),
    ],
    ids=["plain", "gap_prelogits_layerscale", "regularised", "mixed_non_square", "hybrid"],
)
def test_keras_file_round_trip_in_safe_mode(tmp_path, overrides, dtype):
    config = tiny_config(**overrides)
    model = perturb(keras_vit.ViT(config, dtype=dtype))
    x = images(size=config.image_size)
    path = tmp_path / "model.keras"
    model.save(path)
    restored = keras.saving.load_model(path, safe_mode=True)
    assert isinstance(restored, keras_vit.ViT)
    assert restored.config == config
    assert restored.dtype_policy.name == restored.get_layer("patch_embedding").dtype_policy.name == (dtype or "float32")
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(restored(x)), keras.ops.convert_to_numpy(model(x)))
    assert [w.path for w in restored.weights] == [w.path for w in model.weights]


def test_class_names_round_trip_and_are_checked(tmp_path):
    config = tiny_config(num_classes=3)
    model = keras_vit.ViT(config, class_names=["cat", "dog", "owl"])
    model.save(tmp_path / "named.keras")
    assert keras.saving.load_model(tmp_path / "named.keras", safe_mode=True).class_names == ("cat", "dog", "owl")
    assert keras_vit.ViT(config).class_names is None
    with pytest.raises(ValueError, match="2 class names for a model of 3 classes"):
        keras_vit.ViT(config, class_names=["cat", "dog"])
    with pytest.raises(ValueError, match="`class_names` must be a list of strings"):
        keras_vit.ViT(config, class_names=[0, 1, 2])
    # set afterwards, checked the same (a wrong count was saved into a file that would not load)
    with pytest.raises(ValueError, match="2 class names for a model of 3 classes"):
        model.class_names = ["cat", "dog"]
    with pytest.raises(ValueError, match="`class_names` must be a list of strings"):
        model.class_names = "abc"
    model.class_names = None
    assert model.class_names is None


def test_frozen_layers_stay_frozen_through_a_keras_file_with_the_optimizer_state(tmp_path):
    # Every layer came back trainable, and the optimizer state was dropped for its variable count
    model = keras_vit.ViT(tiny_config())
    model.get_layer("patch_embedding").trainable = False
    model.get_layer("block_0").trainable = False
    model.get_layer("block_0").mlp.trainable = True  # a sublayer unfrozen under a frozen parent
    model.compile(optimizer="adam", loss="mse")
    model.fit(images(2), np.zeros((2, 7)), verbose=0)
    model.save(tmp_path / "frozen.keras")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Keras warns when it skips the optimizer's variables
        restored = keras.saving.load_model(tmp_path / "frozen.keras", safe_mode=True)
    assert [layer.trainable for layer in restored._flatten_layers()] == [
        layer.trainable for layer in model._flatten_layers()
    ]
    assert [w.path for w in restored.trainable_weights] == [w.path for w in model.trainable_weights]
    for saved, loaded in zip(model.optimizer.variables, restored.optimizer.variables):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(saved), keras.ops.convert_to_numpy(loaded))
    assert "frozen_layers" not in keras_vit.ViT(tiny_config()).get_config()  # files as before when none is


@pytest.fixture
def nothing_frozen():
    """No object frozen out of the garbage collector's passes during the test (conftest.py
    freezes the imports' objects), as in a user's process; frozen again after it."""
    frozen = gc.get_freeze_count()
    gc.unfreeze()
    yield
    if frozen:
        gc.freeze()


def test_a_quantized_model_round_trips_through_a_keras_file_and_resized(tmp_path, nothing_frozen):
    # from_config rebuilt float layers, which refused the saved int8 kernels and scales
    model = perturb(keras_vit.ViT(tiny_config()))
    x = images()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*does not have a `quantize` method")  # one per layer before
        model.quantize("int8")
    assert gc.get_freeze_count() == 0  # the objects frozen out of Keras's collections meanwhile are back
    quantized = [layer.path for layer in model._flatten_layers() if getattr(layer, "quantization_mode", None)]
    assert "block_0/attention/qkv" in quantized and "head" in quantized
    model.save(tmp_path / "int8.keras")
    gc.freeze()  # a caller's frozen objects stay frozen
    try:
        restored = keras.saving.load_model(tmp_path / "int8.keras", safe_mode=True)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    assert [layer.path for layer in restored._flatten_layers() if layer.quantization_mode] == quantized
    assert restored.get_layer("head").kernel.dtype == "int8"
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(restored(x)), keras.ops.convert_to_numpy(model(x)))
    resized = restored.resized(48)
    assert [layer.path for layer in resized._flatten_layers() if layer.quantization_mode] == quantized
    assert resized(images(size=(48, 48))).shape == (2, 7)
    # as a checkpoint (convert, load_weights) its integer kernels and scales have no float place
    with pytest.raises(ValueError, match=r"int8\.keras holds a quantized model \(int8\): load it whole"):
        keras_vit.ViT.from_checkpoint(tmp_path / "int8.keras")


def test_no_lambda_layers():
    model = keras_vit.ViT(tiny_config(resnet_layers=(1,), resnet_width=32, patch_size=1))
    assert not any(isinstance(layer, keras.layers.Lambda) for layer in model._flatten_layers())


LAYERS = [
    (keras_vit.layers.ImageNormalization, dict(mean=[1.0, 2.0, 3.0], std=[4.0, 5.0, 6.0]), (2, 8, 8, 3)),
    (keras_vit.layers.PatchEmbedding, dict(hidden_size=16, patch_size=4), (2, 8, 8, 3)),
    (keras_vit.layers.ClassToken, dict(), (2, 4, 16)),
    (keras_vit.layers.PositionEmbedding, dict(grid_size=(2, 2), num_prefix_tokens=1), (2, 5, 16)),
    (keras_vit.layers.MultiHeadSelfAttention, dict(num_heads=2), (2, 5, 16)),
    (keras_vit.layers.MLP, dict(mlp_dim=32), (2, 5, 16)),
    (keras_vit.layers.DropPath, dict(rate=0.1, seed=1), (2, 5, 16)),
    (keras_vit.layers.LayerScale, dict(init_value=0.5), (2, 5, 16)),
    (keras_vit.layers.EncoderBlock, dict(num_heads=2, mlp_dim=32, layer_scale_init=0.1), (2, 5, 16)),
    (keras_vit.layers.TokenPooling, dict(mode="gap"), (2, 5, 16)),
    (keras_vit.layers.GroupNormalization, dict(groups=4, epsilon=1e-6), (2, 4, 4, 8)),
    (keras_vit.layers.StdConv2D, dict(filters=4, kernel_size=3), (2, 8, 8, 3)),
    (keras_vit.layers.BottleneckUnit, dict(filters=32, strides=2), (2, 8, 8, 64)),
    (keras_vit.layers.ResNetStem, dict(stage_sizes=(1, 1), width=32), (1, 32, 32, 3)),
]


@pytest.mark.parametrize("cls, kwargs, shape", LAYERS, ids=[c.__name__ for c, _, _ in LAYERS])
def test_layer_config_round_trip(cls, kwargs, shape):
    layer = cls(**kwargs)
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    y = keras.ops.convert_to_numpy(layer(x))
    perturb_layer_weights(layer)
    y = keras.ops.convert_to_numpy(layer(x))
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(clone) is cls and clone.get_config() == layer.get_config()
    clone(x)
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(keras.ops.convert_to_numpy(clone(x)), y, atol=1e-6)


def perturb_layer_weights(layer):
    rng = np.random.default_rng(1)
    for w in layer.weights:
        w.assign(keras.ops.convert_to_numpy(w) + 0.1 * rng.standard_normal(w.shape).astype("float32"))
