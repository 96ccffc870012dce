"""The training application under whichever backend this run uses (TensorFlow and JAX)."""

import json

import keras

from keras_vit.training import TrainConfig, fit
from keras_vit.training.strategy import make_placement


def test_fit_runs_on_this_backend(tmp_path):
    model = dict(image_size=16, patch_size=4, hidden_size=32, num_layers=1, num_heads=2, mlp_dim=64)
    result = fit(TrainConfig(run_dir=str(tmp_path / "run"), model=model, epochs=2), verbose=0)
    assert result["num_examples"] == 359 and result["top1"] > 0.15  # above chance after two epochs
    assert json.loads((tmp_path / "run" / "eval.json").read_text())["top1"] == result["top1"]
    placement = make_placement(TrainConfig(strategy="auto"))
    assert placement.replicas == 1  # this machine: one CPU device
    if keras.backend.backend() == "jax":
        assert placement.strategy is None  # Keras distribution API (DataParallel with more devices)
