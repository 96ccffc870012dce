import keras
import numpy as np
import pytest
from helpers import images, perturb, tiny_config

import keras_vit


@pytest.mark.parametrize("policy, tolerance", [("mixed_bfloat16", 0.1), ("mixed_float16", 0.02)])
def test_mixed_precision_follows_compute_dtype_and_returns_float32(policy, tolerance):
    config = tiny_config()
    reference = perturb(keras_vit.ViT(config))
    model = keras_vit.ViT(config, dtype=policy)
    model.set_weights(reference.get_weights())
    compute = policy.split("_")[1]
    x = images()
    logits = model(x)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    to_numpy = keras.ops.convert_to_numpy
    np.testing.assert_allclose(to_numpy(logits), to_numpy(reference(x)), atol=tolerance)
    # Class token and position embedding are stored in float32 and used in the compute dtype.
    for name in ("class_token", "position_embedding"):
        layer = model.get_layer(name)
        assert layer.compute_dtype == compute and layer.variable_dtype == "float32"
    probe = keras.Model(model.input, model.get_layer("position_embedding").output)
    assert keras.backend.standardize_dtype(probe(x).dtype) == compute
    # Softmax in float32: probabilities are float32 and rows sum to 1.
    for probs in model.attention_probabilities(x):
        assert probs.dtype == np.float32
        np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_trains(policy):
    model = keras_vit.ViT(tiny_config(num_classes=2), dtype=policy)
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    # compile() reads the model's own policy: float16 gets dynamic loss scaling.
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer) == (policy == "mixed_float16")
    history = model.fit(images(batch=4), np.array([0, 1, 0, 1]), epochs=3, verbose=0)
    losses = history.history["loss"]
    assert np.isfinite(losses).all() and losses[-1] < losses[0]


def test_inference_copy_in_another_dtype_policy():
    from keras_vit.saving import inference_copy

    reference = perturb(keras_vit.ViT(tiny_config()))
    reference.compile(optimizer="adam", loss="mse")
    copy = inference_copy(reference, dtype="mixed_bfloat16")
    assert copy.dtype_policy.name == "mixed_bfloat16" and not copy.compiled
    assert reference.dtype_policy.name == "float32"
    # Same values, still stored in float32 (the mixed policy's variables); bf16 compute.
    for a, b in zip(copy.get_weights(), reference.get_weights()):
        assert a.dtype == np.float32
        np.testing.assert_array_equal(a, b)
    x = images()
    to_numpy = keras.ops.convert_to_numpy
    np.testing.assert_allclose(to_numpy(copy(x)), to_numpy(reference(x)), atol=0.1)
    # Updating the copy in place keeps its policy.
    reference.set_weights([w * 0.5 for w in reference.get_weights()])
    assert inference_copy(reference, into=copy) is copy and copy.dtype_policy.name == "mixed_bfloat16"
    np.testing.assert_array_equal(copy.get_weights()[0], reference.get_weights()[0])
