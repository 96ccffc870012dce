"""One worker of the two-process multi-worker test (run by tests/test_training.py).

argv: INDEX PORT0,PORT1 RUN_DIR PATCH(1|0)."""

import json
import os
import sys

index, ports, run_dir, patch = int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3], sys.argv[4] == "1"
os.environ["TF_CONFIG"] = json.dumps(
    {"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]}, "task": {"type": "worker", "index": index}}
)

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_vit.training import TrainConfig, fit, multi_worker  # noqa: E402

keras_fit = keras.Model.fit


def fit_and_report(model, *args, **kwargs):
    """`Model.fit`, then a checksum of the trained weights, which the workers must share."""
    history = keras_fit(model, *args, **kwargs)
    print(f"WEIGHTS {sum(float(np.abs(w).astype('float64').sum()) for w in model.get_weights()):.9e}")
    return history


keras.Model.fit = fit_and_report
if not patch:
    multi_worker.needs_patch = lambda: False  # plain Keras: shows whether the workaround is still needed
model = dict(image_size=16, patch_size=4, hidden_size=32, num_layers=1, num_heads=2, mlp_dim=64)
try:
    fit(TrainConfig(run_dir=run_dir, model=model, epochs=1, strategy="multi_worker", seed=5), verbose=0)
    print(f"WORKER-{index}-OK")
except Exception as error:  # reported to the test, which decides
    print(f"WORKER-{index}-FAILED {type(error).__name__}: {str(error)[-600:]}")
