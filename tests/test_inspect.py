import keras
import numpy as np
import pytest
from helpers import images, perturb, sample_photos, tiny_config
from PIL import Image

import keras_vit
from keras_vit import inspect, plot

# One worker for the module: the trained `digits_model` is set up once (two workers each trained it).
pytestmark = pytest.mark.xdist_group("inspect")


def _uniform(batch, heads, tokens):
    return np.full((batch, heads, tokens, tokens), 1.0 / tokens)


def test_uniform_attention_gives_uniform_class_token_rollout():
    rollout = inspect.attention_rollout([_uniform(2, 3, 17)] * 4)
    np.testing.assert_allclose(rollout.sum(-1), 1.0)
    grid = inspect.class_token_map(rollout[:, 0], (4, 4))
    assert grid.shape == (2, 4, 4)
    np.testing.assert_allclose(grid, grid[0, 0, 0])


def test_rollout_rows_sum_to_one_and_identity_is_a_fixed_point():
    rng = np.random.default_rng(0)
    probs = [rng.dirichlet(np.ones(10), size=(2, 4, 10)) for _ in range(3)]
    np.testing.assert_allclose(inspect.attention_rollout(probs).sum(-1), 1.0, atol=1e-12)
    identity = [np.broadcast_to(np.eye(10), (2, 4, 10, 10))] * 3
    np.testing.assert_allclose(inspect.attention_rollout(identity), np.broadcast_to(np.eye(10), (2, 10, 10)))


def test_mean_attention_distance_analytic_cases():
    # 2x2 grid of 16-pixel patches: from any patch, the others lie at 16, 16 and 16*sqrt(2).
    uniform = inspect.mean_attention_distance([_uniform(1, 2, 5)], (2, 2), (16, 16))
    np.testing.assert_allclose(uniform, (16 + 16 + 16 * np.sqrt(2)) / 4)
    identity = np.broadcast_to(np.eye(5), (1, 2, 5, 5))
    np.testing.assert_allclose(inspect.mean_attention_distance([identity], (2, 2), (16, 16)), 0.0)
    # attention only to the class token carries no distance information: rows renormalise
    # over patches, so put all patch mass on the horizontal neighbour instead
    neighbour = np.zeros((1, 1, 5, 5))
    for q, k in {1: 2, 2: 1, 3: 4, 4: 3}.items():
        neighbour[0, 0, q, k] = 1.0
    neighbour[0, 0, 0, 0] = 1.0
    np.testing.assert_allclose(inspect.mean_attention_distance([neighbour], (2, 2), (16, 8)), 8.0)


def test_position_similarity_and_patch_components():
    model = perturb(keras_vit.ViT(tiny_config()))
    similarity = inspect.position_embedding_similarity(model)
    assert similarity.shape == (4, 4, 4, 4)
    np.testing.assert_allclose([similarity[i, j, i, j] for i in range(4) for j in range(4)], 1.0, atol=1e-9)
    components, explained = inspect.patch_embedding_components(model, count=28)
    assert components.shape == (28, 8, 8, 3)
    flat = components.reshape(28, -1)
    np.testing.assert_allclose(flat @ flat.T, np.eye(28), atol=1e-8)  # orthonormal directions
    assert np.all(np.diff(explained) <= 1e-12) and 0 < explained.sum() <= 1
    hybrid = keras_vit.ViT(tiny_config(resnet_layers=(1, 1), resnet_width=32, patch_size=1))
    with pytest.raises(ValueError, match="a hybrid ViT embeds ResNet features, not image patches"):
        inspect.patch_embedding_components(hybrid)


@pytest.fixture(scope="module")
def digits_model(tmp_path_factory):
    """A small ViT trained on scikit-learn's bundled handwritten digits (real data), 32x32."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = np.repeat(np.repeat(digits.images, 4, axis=1), 4, axis=2)[..., None] * (255.0 / 16.0)
    x = np.repeat(x, 3, axis=-1).astype("float32")
    y = digits.target
    keras.utils.set_random_seed(0)
    model = keras_vit.ViT(
        keras_vit.ViTConfig(
            image_size=32, patch_size=8, hidden_size=64, num_layers=3, num_heads=4, mlp_dim=128, num_classes=10
        )
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    model.fit(x[:1500], y[:1500], epochs=8, batch_size=32, verbose=0)
    accuracy = model.evaluate(x[1500:], y[1500:], verbose=0)[1]
    # 0.71-0.74 on the three backends (Zen 4): it learned (chance is 0.1), so the maps below are
    # of a real model; the bar leaves room for another CPU's rounding.
    assert accuracy > 0.5, accuracy
    path = tmp_path_factory.mktemp("digits") / "digits.keras"
    model.save(path)
    return model, path, x[1500:1503]


def test_figures_of_a_trained_model(digits_model, tmp_path):
    model, _, images = digits_model
    rollout = inspect.rollout_maps(model, images)
    assert rollout.shape == images.shape[:3] and rollout.std(axis=(1, 2)).min() > 0
    attention = inspect.class_token_attention(model, images)
    assert attention.shape == (3, 3, 4, 4, 4)
    distances = inspect.model_attention_distance(model, images)
    assert distances.shape == (3, 4) and (distances > 0).all()
    written = [
        plot.heatmap_overlays(images, rollout, tmp_path / "rollout.png", "attention rollout"),
        plot.class_token_attention(attention, tmp_path / "attention.svg"),
        plot.attention_distance(distances, tmp_path / "distance.pdf"),
        plot.position_similarity(inspect.position_embedding_similarity(model), tmp_path / "pos"),
        plot.patch_components(*inspect.patch_embedding_components(model), tmp_path / "pca.png"),
    ]
    assert [p.suffix for p in written] == [".png", ".svg", ".pdf", ".png", ".png"]
    for path in written:
        assert path.stat().st_size > 1000
    assert Image.open(written[0]).size[0] > 300


def test_attention_figure_names_its_query_and_image(monkeypatch, tmp_path):
    # A mean-pooled model has no class token, yet its figure said "class token"; one figure per
    # image did not say which image it was.
    from keras_vit import plot

    monkeypatch.setattr(plot, "_save", lambda fig, path: fig)
    maps = np.random.default_rng(0).uniform(size=(2, 3, 2, 4, 4))
    token = plot.class_token_attention(maps, tmp_path / "a.png", image_index=1, image_name="cat.jpg")
    assert token.get_suptitle() == "Attention of the class token to each patch, per layer and head: cat.jpg"
    pooled = plot.class_token_attention(maps, tmp_path / "b.png", mean_pooled=True)
    assert pooled.get_suptitle() == "Attention of the mean of the tokens to each patch, per layer and head"
    assert pooled.axes[-1].get_ylabel() == "attention of the mean of the tokens"  # the colour bar


@pytest.mark.tensorflow_only
@pytest.mark.parametrize("method", ["saliency", "smoothgrad", "gradcam++", "scorecam"])
def test_tf_keras_vis_methods(digits_model, method):
    from keras_vit.saliency import saliency_maps

    model, _, images = digits_model
    maps = saliency_maps(model, images, method)
    assert maps.shape == images.shape[:3] and np.isfinite(maps).all()
    if method == "gradcam++":
        # A ViT's token features are signed, so the ReLU'd CAM of an image can be all zero:
        # check the maps against the method's formula instead of asking each to vary.
        np.testing.assert_allclose(maps, _gradcam_plus_plus(model, images), atol=1e-4)
    assert maps.std(axis=(1, 2)).max() > 0 and maps.min() >= 0 and maps.max() <= 1


@pytest.mark.tensorflow_only
@pytest.mark.parametrize("method", ["gradcam++", "scorecam"])
def test_tf_keras_vis_methods_explain_a_mixed_bfloat16_model_through_float32(digits_model, method):
    """A model trained in mixed_bfloat16 failed in tf-keras-vis's float32 CAM arithmetic; it is
    explained through a float32 copy of the same weights, so its maps are the float32 model's."""
    from keras_vit.saliency import saliency_maps
    from keras_vit.saving import inference_copy

    model, _, images = digits_model
    half = inference_copy(model, dtype="mixed_bfloat16")
    class_index = int(np.argmax(model.predict(images[:1], verbose=0)))
    np.testing.assert_allclose(
        saliency_maps(half, images, method, class_index), saliency_maps(model, images, method, class_index), atol=1e-5
    )
    assert half.dtype_policy.name == "mixed_bfloat16"  # the caller's model is left as it was


def _gradcam_plus_plus(model, images):
    """GradCAM++ (Chattopadhay et al. 2018, exp-score closed form) on `patch_grid` for the
    predicted class, bilinearly upsampled and scaled to [0, 1]: written out independently."""
    import tensorflow as tf
    from scipy.ndimage import zoom

    probe = keras.Model(model.inputs, [model.get_layer("patch_grid").output, model.outputs[0]])
    with tf.GradientTape() as tape:
        grid, logits = probe(images)
        score = tf.reduce_max(logits, axis=-1)
    g, a = tape.gradient(score, grid).numpy(), grid.numpy()
    d1 = np.exp(score.numpy())[:, None, None, None] * g
    d2, d3 = d1 * g, d1 * g * g
    denominator = 2 * d2 + d3 * a.sum(axis=(1, 2), keepdims=True)
    alphas = d2 / np.where(d2 == 0, 1.0, denominator)
    norm = alphas.sum(axis=(1, 2), keepdims=True)
    alphas /= np.where(norm == 0, 1.0, norm)
    weights = (np.maximum(d1, 0) * alphas).sum(axis=(1, 2), keepdims=True)
    cam = np.maximum((weights * a).sum(axis=-1), 0)
    factor = (1, images.shape[1] / cam.shape[1], images.shape[2] / cam.shape[2])
    cam = zoom(cam, factor, order=1)
    low, high = cam.min(axis=(1, 2), keepdims=True), cam.max(axis=(1, 2), keepdims=True)
    return (cam - low) / (high - low + keras.config.epsilon())


@pytest.mark.tensorflow_only
def test_saliency_takes_a_class_per_image_and_refuses_bad_input_in_one_line(digits_model):
    # a list of indices was a TypeError, 1.7 a TensorFlow indexing error, a wrong image size
    # Keras's input-spec error
    from keras_vit.saliency import saliency_maps

    model, _, images = digits_model
    each = saliency_maps(model, images[:2], "saliency", class_index=[3, 5])
    np.testing.assert_allclose(each[1], saliency_maps(model, images[1:2], "saliency", class_index=5)[0], atol=1e-6)
    for bad, message in [
        (1.7, r"class_index must be a class index or one per image \(2\); got 1\.7"),
        ([0, 1, 2], r"one per image \(2\); got \[0, 1, 2\]"),
        ([0, 10], r"class index \[0, 10\] is out of range: the model has 10 classes"),
    ]:
        with pytest.raises(ValueError, match=message):
            saliency_maps(model, images[:2], "saliency", class_index=bad)
    with pytest.raises(ValueError, match="the model was built for"):
        saliency_maps(model, np.zeros((1, 48, 48, 3)), "gradcam++", class_index=1)


@pytest.mark.tensorflow_only
def test_cam_methods_target_the_patch_grid_layer(monkeypatch):
    """tf-keras-vis, left alone, seeks a Conv layer; the helper must make it use `patch_grid`."""
    from tf_keras_vis.utils import model_modifiers

    from keras_vit.saliency import saliency_maps

    used = []
    original = model_modifiers.ExtractIntermediateLayerForGradcam.__call__

    def spy(self, model):
        result = original(self, model)
        used.append(result.outputs[-1]._keras_history.operation.name)
        return result

    monkeypatch.setattr(model_modifiers.ExtractIntermediateLayerForGradcam, "__call__", spy)
    model = perturb(keras_vit.ViT(tiny_config(image_size=64)), scale=0.2)
    photos = sample_photos(64)
    saliency_maps(model, photos, "gradcam++")
    saliency_maps(model, photos, "scorecam", scorecam_channels=8)
    assert used == ["patch_grid", "patch_grid"]


@pytest.mark.tensorflow_only
def test_scorecam_on_a_model_narrower_than_its_channel_count():
    # tf-keras-vis refused max_N=64 on a width-16 model ("max_N must be ... 16 or less")
    from keras_vit.saliency import saliency_maps

    model = perturb(keras_vit.ViT(tiny_config(hidden_size=16, num_heads=2)), scale=0.2)
    maps = saliency_maps(model, sample_photos(32), "scorecam")
    assert maps.shape == (2, 32, 32) and np.isfinite(maps).all() and maps.min() >= 0 and maps.max() <= 1


def test_patch_grid_layer_is_the_identity_on_the_main_path():
    model = perturb(keras_vit.ViT(tiny_config()))
    grid = model.get_layer("patch_grid")
    assert tuple(grid.output.shape) == (None, 4, 4, 64)
    names = [layer.name for layer in model.layers]
    assert names.index("patch_grid") < names.index("merge_patch_grid") < names.index("block_1")


@pytest.mark.tensorflow_only  # the CLI runs the TensorFlow backend by default
@pytest.mark.parametrize("method", ["rollout", "attention", "gradcam++"])
def test_visualize_command(digits_model, tmp_path, capsys, method):
    from keras_vit_cli import main

    _, model_path, images = digits_model
    files = []
    for i, image in enumerate(images[:2]):
        files.append(str(tmp_path / f"digit{i}.png"))
        Image.fromarray(image.astype("uint8")).save(files[-1])
    out = tmp_path / "figure.png"
    assert main(["visualize", str(model_path), *files, "--method", method, "--out", str(out)]) == 0
    written = [line.split(" ", 1)[1] for line in capsys.readouterr().out.splitlines() if line.startswith("wrote ")]
    assert len(written) == (2 if method == "attention" else 1)
    for path in written:
        assert Image.open(path).size[0] > 300


def test_a_heat_maps_title_names_the_class_it_explains():
    from keras_vit_cli.visualize_command import map_labels

    assert map_labels(["a.png", "b.png"], [8, 3]) == ["a.png (class 8)", "b.png (class 3)"]
    named = [f"digit {i}" for i in range(10)]
    assert map_labels(["a.png"], [8], named, class_index=0) == ["a.png (class 0: digit 0; predicted class 8: digit 8)"]


@pytest.mark.tensorflow_only
def test_inspect_command_writes_every_figure(digits_model, tmp_path):
    from keras_vit_cli import main

    _, model_path, _ = digits_model
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "best.keras").write_bytes(model_path.read_bytes())  # a run directory works too
    assert main(["inspect", str(run_dir), "--out", str(tmp_path / "figs"), "--format", "svg"]) == 0
    names = sorted(p.name for p in (tmp_path / "figs").iterdir())
    assert names == [
        "attention_distance.svg",
        "class_token_attention.svg",
        "patch_embedding_components.svg",
        "position_similarity.svg",
        "rollout.svg",
    ]


@pytest.mark.tensorflow_only
@pytest.mark.parametrize(
    "argv, message",
    [
        (["visualize", "missing.keras", "x.png", "--out", "o.png"], "model file not found: missing.keras"),
        (["inspect", ".", "--out", "figs"], "has no best.keras or last.keras"),
        (["inspect", ".", "--out", "afile"], "--out afile is a file; inspect writes its figures into a folder."),
        (
            ["visualize", "m.keras", "x.png", "--class-index", "3", "--out", "o.png"],
            "--class-index applies to the saliency methods; rollout shows the attention itself",
        ),
    ],
)
def test_visualize_and_inspect_bad_input(argv, message, tmp_path, monkeypatch, capsys):
    from keras_vit_cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("")  # [Errno 17] File exists, before
    (tmp_path / "x.png").write_bytes(b"")  # the image files are checked first; these cases are about the rest
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_unknown_method_is_rejected_with_the_choices(capsys):
    from keras_vit_cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["visualize", "m.keras", "x.png", "--method", "lime", "--out", "o.png"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'lime'" in capsys.readouterr().err


def test_saliency_rejects_unknown_method():
    from keras_vit.saliency import saliency_maps

    with pytest.raises(ValueError, match="unknown saliency method 'lime'; choose from saliency, smoothgrad"):
        saliency_maps(None, np.zeros((1, 32, 32, 3)), "lime")


@pytest.mark.tensorflow_only
@pytest.mark.parametrize("class_index", [7, -1])
def test_saliency_rejects_a_class_the_model_has_not(class_index):
    from keras_vit.saliency import saliency_maps

    model = keras_vit.ViT(tiny_config())
    with pytest.raises(ValueError, match=r"class index -?\d+ is out of range: the model has 7 classes \(0 to 6\)"):
        saliency_maps(model, np.zeros((1, 32, 32, 3)), "saliency", class_index=class_index)


def test_mean_pooled_models_read_out_the_mean_of_the_token_rows():
    """A `classifier="gap"` model has no class token: its maps are those of the pooled output,
    the mean over all token rows of the rollout and of each attention."""
    model = perturb(keras_vit.ViT(tiny_config(classifier="gap")))
    x = images(2)
    probs = model.attention_probabilities(x)
    expected = inspect.attention_rollout(probs).mean(axis=1).reshape(2, 4, 4)
    maps = inspect.rollout_maps(model, x)
    np.testing.assert_allclose(maps, inspect._unit(inspect.upsample(expected, (32, 32))), atol=1e-6)
    attention = inspect.class_token_attention(model, x)
    assert attention.shape == (2, 2, 4, 4, 4)
    np.testing.assert_allclose(attention, np.stack(probs).mean(axis=3).reshape(2, 2, 4, 4, 4), atol=1e-6)
