import collections
import functools
import types

import keras
import numpy as np
import pytest
from helpers import images, perturb, tiny_config
from numpy_reference import vit_forward

import keras_vit


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"classifier": "gap"},
        {"representation_size": 48},
        {"layer_scale_init": 0.1},
        {"image_size": (32, 48), "patch_size": (8, 4)},
        {"channels": 1, "input_mean": [127.5], "input_std": [127.5]},
        {"normalize_inputs": False},
    ],
    ids=["token", "gap", "pre_logits", "layer_scale", "non_square", "grayscale", "no_normalization"],
)
def test_matches_numpy_reference_of_the_paper(overrides):
    config = tiny_config(**overrides)
    model = perturb(keras_vit.ViT(config))
    x = images(size=config.image_size, channels=config.channels)
    expected, expected_attention = vit_forward(model, x)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(x)), expected, atol=2e-5, rtol=1e-5)
    attention = model.attention_probabilities(x)
    assert len(attention) == config.num_layers
    for got, want in zip(attention, expected_attention):
        np.testing.assert_allclose(got, want, atol=2e-6)


def test_attention_probabilities_shape_and_rows_sum_to_one():
    config = tiny_config()
    model = perturb(keras_vit.ViT(config))
    attention = model.attention_probabilities(images(batch=3))
    tokens = config.num_patches + 1
    for probs in attention:
        assert probs.shape == (3, config.num_heads, tokens, tokens) and probs.dtype == np.float32
        np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
        assert (probs >= 0).all()
    # The attention model shares the classifier's weights, not copies of them.
    assert {id(w) for w in model.attention_model().weights} <= {id(w) for w in model.weights}


def test_fused_attention_path_equals_explicit_path():
    layer = keras_vit.layers.MultiHeadSelfAttention(num_heads=4)
    x = np.random.default_rng(1).standard_normal((2, 17, 64)).astype("float32")
    fast = keras.ops.convert_to_numpy(layer(x))
    explicit, probs = layer(x, return_attention_scores=True)
    np.testing.assert_allclose(fast, keras.ops.convert_to_numpy(explicit), atol=1e-5)
    assert tuple(probs.shape) == (2, 4, 17, 17)


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="a JAX GPU training path")
def test_odd_token_attention_padded_with_lengths_equals_the_plain_one(monkeypatch):
    # Half-precision training on a JAX GPU pads an odd token count by one and passes the true
    # lengths; XLA's implementation runs the same padding-mask path here (cuDNN's needs a GPU).
    import jax
    import jax.numpy as jnp

    from keras_vit import jax_attention
    from keras_vit.layers import attention

    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(2, 5, 3, 8)), jnp.bfloat16) for _ in range(3))
    weights = jnp.asarray(rng.normal(size=(2, 5, 3, 8)), jnp.float32)

    def loss(attend):
        return lambda q, k, v: jnp.sum(attend(q, k, v).astype(jnp.float32) * weights)

    plain = keras.ops.dot_product_attention
    padded = functools.partial(jax_attention.padded_attention, implementation="xla")
    assert padded(q, k, v).shape == (2, 5, 3, 8)
    as_float = lambda t: np.asarray(t, dtype="float32")  # noqa: E731
    np.testing.assert_allclose(as_float(padded(q, k, v)), as_float(plain(q, k, v)), atol=1e-2)  # bf16 rounding
    for ours, reference in zip(jax.grad(loss(padded), (0, 1, 2))(q, k, v), jax.grad(loss(plain), (0, 1, 2))(q, k, v)):
        np.testing.assert_allclose(as_float(ours), as_float(reference), atol=3e-2, rtol=2e-2)
    # the layer takes that path on a GPU; without cuDNN (this CPU) it falls back to Keras's attention
    monkeypatch.setattr(attention, "_on_jax_gpu", lambda: True)
    np.testing.assert_allclose(as_float(attention._fused_attention(q, k, v, training=True)), as_float(plain(q, k, v)))


def test_bfloat16_inference_softmax_equals_the_float32_softmax_rounded():
    # bfloat16 inference on TensorFlow runs the softmax on bf16 logits (no casts): the same
    # numbers as the float32 softmax that training (dropout 0 here) uses, rounded to bf16.
    layer = keras_vit.layers.MultiHeadSelfAttention(num_heads=4, dtype="mixed_bfloat16")
    x = np.random.default_rng(3).standard_normal((2, 50, 64)).astype("float32") * 3
    inference, training = layer(x, training=False), layer(x, training=True)
    assert keras.backend.standardize_dtype(inference.dtype) == "bfloat16"
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(keras.ops.cast(inference, "float32")),
        keras.ops.convert_to_numpy(keras.ops.cast(training, "float32")),
    )
    _, probs = layer(x, return_attention_scores=True)  # returned probabilities: float32 softmax
    assert keras.backend.standardize_dtype(probs.dtype) == "float32"
    np.testing.assert_allclose(keras.ops.convert_to_numpy(probs).sum(-1), 1.0, atol=1e-5)


@pytest.mark.tensorflow_only
def test_bf16_softmax_check_runs_eagerly_only(monkeypatch):
    # Inside a trace the check cannot read values: it answers False (the float32 softmax) and
    # does not remember it; the eager answer is remembered.
    import tensorflow as tf

    from keras_vit.layers import attention

    monkeypatch.setattr(attention, "_BF16_SOFTMAX_EXACT", [])
    assert tf.function(lambda: tf.constant(attention._bf16_softmax_is_float32_rounded()))().numpy() == False  # noqa: E712
    assert attention._BF16_SOFTMAX_EXACT == []
    eager = attention._bf16_softmax_is_float32_rounded()
    assert attention._BF16_SOFTMAX_EXACT == [eager]
    layer = keras_vit.layers.MultiHeadSelfAttention(num_heads=4, dtype="mixed_bfloat16")
    layer.build((None, 50, 64))
    assert layer._bf16_softmax_without_casts is eager


def test_headless_model_returns_features():
    model = keras_vit.ViT(tiny_config(num_classes=0, representation_size=40))
    assert tuple(model(images()).shape) == (2, 40)
    model = keras_vit.ViT(tiny_config(num_classes=0))
    assert tuple(model(images()).shape) == (2, 64)


def test_hybrid_forward_and_layout():
    config = keras_vit.get_config("vit_r50_b16", image_size=64, num_layers=1, num_classes=3)
    model = keras_vit.ViT(config)
    assert model.get_layer("resnet") is not None
    assert tuple(model(images(batch=1, size=(64, 64))).shape) == (1, 3)
    assert config.grid_size == (4, 4)
    assert tuple(model.get_layer("position_embedding").embedding.shape) == (1, 17, 768)


def test_std_conv_standardises_each_filter():
    x = np.random.default_rng(2).standard_normal((1, 6, 6, 2)).astype("float32")
    for in_sqrt, standardise in (
        (False, lambda w: (w - w.mean(axis=(0, 1, 2))) / (w.std(axis=(0, 1, 2)) + 1e-3)),  # official
        (True, lambda w: (w - w.mean(axis=(0, 1, 2))) / np.sqrt(w.var(axis=(0, 1, 2)) + 1e-3)),  # timm
    ):
        layer = keras_vit.layers.StdConv2D(4, 3, epsilon=1e-3, epsilon_in_sqrt=in_sqrt)
        y = keras.ops.convert_to_numpy(layer(x))
        w = standardise(keras.ops.convert_to_numpy(layer.kernel).astype(np.float64))
        plain = keras.layers.Conv2D(4, 3, padding="same", use_bias=False)
        plain.build(x.shape)
        plain.kernel.assign(w.astype("float32"))
        np.testing.assert_allclose(y, keras.ops.convert_to_numpy(plain(x)), atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
def test_group_norm_equals_keras_and_a_float64_reference(dtype):
    x = np.random.default_rng(3).normal(2.0, 3.0, (2, 5, 6, 64)).astype("float32")
    ours = keras_vit.layers.GroupNormalization(32, epsilon=1e-6, dtype=dtype)
    theirs = keras.layers.GroupNormalization(32, epsilon=1e-6, dtype=dtype)
    ours.build(x.shape), theirs.build(x.shape)
    rng = np.random.default_rng(4)
    weights = [rng.normal(1.0, 0.5, 64).astype("float32"), rng.normal(0.0, 0.5, 64).astype("float32")]
    ours.set_weights(weights), theirs.set_weights(weights)
    grouped = x.astype(np.float64).reshape(2, 30, 32, 2)
    mean, var = grouped.mean(axis=(1, 3), keepdims=True), grouped.var(axis=(1, 3), keepdims=True)
    expected = ((grouped - mean) / np.sqrt(var + 1e-6)).reshape(x.shape) * weights[0] + weights[1]
    y, keras_y = (keras.ops.convert_to_numpy(keras.ops.cast(layer(x), "float32")) for layer in (ours, theirs))
    tolerance = 1e-5 if dtype == "float32" else 2e-2 * np.abs(expected).max()  # bf16 input and output rounding
    np.testing.assert_allclose(y, expected, atol=tolerance)
    np.testing.assert_allclose(y, keras_y, atol=tolerance)
    assert [w.name for w in ours.weights] == [w.name for w in theirs.weights] == ["gamma", "beta"]
    with pytest.raises(ValueError, match="last axis"):
        keras_vit.layers.GroupNormalization(4, axis=1).build((2, 8, 6, 6))


def test_official_initialisation():
    model = keras_vit.ViT.from_preset("vit_s16", num_classes=10)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model.get_layer("class_token").token), 0.0)
    head = model.get_layer("head")
    assert not np.any(keras.ops.convert_to_numpy(head.kernel)) and not np.any(keras.ops.convert_to_numpy(head.bias))
    pos = keras.ops.convert_to_numpy(model.get_layer("position_embedding").embedding)
    assert abs(pos.std() - 0.02) < 0.002
    block = model.get_layer("block_0")
    width = 384
    qkv = keras.ops.convert_to_numpy(block.attention.qkv.kernel)
    limit = np.sqrt(6.0 / (width + width))  # Xavier-uniform of each (D, D) projection
    assert qkv.max() <= limit and qkv.min() >= -limit and qkv.max() > 0.95 * limit
    fc1 = keras.ops.convert_to_numpy(block.mlp.fc1.kernel)
    limit = np.sqrt(6.0 / (width + 4 * width))
    assert fc1.max() <= limit and fc1.max() > 0.95 * limit
    bias = keras.ops.convert_to_numpy(block.mlp.fc1.bias)
    assert 0 < bias.std() < 3e-6


def test_drop_path_linear_schedule_and_training_behaviour():
    model = keras_vit.ViT(tiny_config(num_layers=5, drop_path_rate=0.4))
    rates = [model.get_layer(f"block_{i}").drop_path.rate for i in range(5)]
    np.testing.assert_allclose(rates, [0.0, 0.1, 0.2, 0.3, 0.4])
    layer = keras_vit.layers.DropPath(0.5, seed=3)
    x = np.ones((4000, 3, 2), "float32")
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer(x, training=False)), x)
    y = keras.ops.convert_to_numpy(layer(x, training=True))
    per_sample = y.reshape(4000, -1)
    assert set(np.unique(per_sample)) <= {0.0, 2.0}
    assert (per_sample.min(1) == per_sample.max(1)).all()  # whole samples dropped, not elements
    assert abs(y.mean() - 1.0) < 0.06


def test_dropout_is_active_only_in_training():
    model = perturb(keras_vit.ViT(tiny_config(dropout_rate=0.3, attention_dropout_rate=0.3)))
    x = images()
    to_numpy = keras.ops.convert_to_numpy
    np.testing.assert_allclose(to_numpy(model(x)), to_numpy(model(x)), atol=0)
    assert not np.allclose(to_numpy(model(x, training=True)), to_numpy(model(x)), atol=1e-4)


def _training_and_inference_gradients(layer, weights_of, dtype):
    """{training: (output, gradients of a weighted sum to the input and to `weights_of(layer)`)}
    as float32 NumPy arrays, for a (2, 5, 16) input of `dtype`."""
    import tensorflow as tf

    x = tf.constant(np.random.default_rng(0).normal(scale=3.0, size=(2, 5, 16)).astype("float32"), dtype)
    weights = tf.constant(np.random.default_rng(1).normal(size=(2, 5, 16)).astype("float32"))
    results = {}
    for training in (True, False):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=training)
            loss = tf.reduce_sum(tf.cast(y, "float32") * weights)
        gradients = tape.gradient(loss, [x, *weights_of(layer)])
        results[training] = [tf.cast(t, "float32").numpy() for t in (y, *gradients)]
    return results


@pytest.mark.tensorflow_only
@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_tensorflow_training_kernels_equal_the_inference_ops_and_their_gradients(policy, monkeypatch):
    # On TensorFlow, training computes the projections with their bias gradients, fc1's bias add
    # + GELU and the LayerNorm as XLA kernels with their own gradients (keras_vit.tf_kernels),
    # and the bf16 attention softmax's gradient; inference uses Keras's ops (the GELU with erfc,
    # fused into fc1). Reference: the float32 layer's inference ops and their gradients; float32
    # training matches them to float rounding, mixed_bfloat16 to bf16 rounding.
    from keras_vit import tf_kernels

    called = []
    for name in ("project", "layer_norm", "softmax"):
        kernel = getattr(tf_kernels, name)
        monkeypatch.setattr(tf_kernels, name, lambda *a, k=kernel, n=name, **kw: called.append(n) or k(*a, **kw))
    rng = np.random.default_rng(2)
    layers = [
        (keras_vit.layers.MLP, (48,), lambda m: [m.fc1.kernel, m.fc1.bias], 0.25),
        (keras_vit.layers.LayerNormalization, (), lambda n: [n.gamma, n.beta], 0.25),
        # Smaller weights: at 0.25 the bf16 attention's own ops (inference) are 3.7% off float32.
        (keras_vit.layers.MultiHeadSelfAttention, (2,), lambda a: [a.qkv.kernel, a.qkv.bias, a.out.bias], 0.1),
    ]
    dtype = "bfloat16" if policy == "mixed_bfloat16" else "float32"
    tolerance = 1e-5 if dtype == "float32" else 2e-2  # of each array's largest magnitude
    for cls, args, weights_of, scale in layers:
        layer, reference = cls(*args, dtype=policy), cls(*args, dtype="float32")
        for each in (layer, reference):
            each.build((None, None, 16))
        if cls is keras_vit.layers.MultiHeadSelfAttention:  # on every CPU, not only where it is exact
            layer._bf16_softmax_without_casts = dtype == "bfloat16"
        weights = [rng.normal(scale=scale, size=w.shape).astype("float32") for w in layer.get_weights()]
        for each in (layer, reference):
            each.set_weights(weights)
        trained = _training_and_inference_gradients(layer, weights_of, dtype)[True]
        expected = _training_and_inference_gradients(reference, weights_of, "float32")[False]
        for got, want in zip(trained, expected):
            np.testing.assert_allclose(got, want, rtol=0, atol=tolerance * np.abs(want).max())
    # The layers' and their twins' training: MLP and attention two projections each; float32
    # attention keeps Keras's softmax.
    softmax = ["softmax"] if dtype == "bfloat16" else []
    projections = ["project"] * 2
    assert called == [*projections * 2, "layer_norm", "layer_norm", "project", *softmax, "project", *projections]


@pytest.mark.tensorflow_only
def test_tensorflow_bf16_training_sums_bias_gradients_in_float32():
    # TensorFlow's CPU BiasAddGrad, which Keras's Dense and Conv2D get, sums bfloat16 in
    # bfloat16: over thousands of rows its sums stall (errors of 70-90% of the largest here).
    # keras_vit's training projections sum them with float32 accumulation.
    import tensorflow as tf

    layers = [  # 8000-8192 rows each
        (keras_vit.layers.MLP, (48,), (40, 200, 16), lambda m: [m.fc1.bias, m.fc2.bias]),
        (keras_vit.layers.MultiHeadSelfAttention, (2,), (40, 200, 16), lambda a: [a.qkv.bias, a.out.bias]),
        (keras_vit.layers.PatchEmbedding, (16, 4), (32, 64, 64, 3), lambda p: [p.projection.bias]),
    ]
    for cls, args, shape, biases_of in layers:
        x = np.random.default_rng(3).normal(size=shape).astype("float32")
        gradients = {}
        for policy, training in (("mixed_bfloat16", True), ("float32", False)):
            layer = cls(*args, dtype=policy)
            layer.build((None, *shape[1:]))
            layer.set_weights([np.random.default_rng(4).normal(scale=0.25, size=w.shape) for w in layer.get_weights()])
            with tf.GradientTape() as tape:
                y = layer(tf.constant(x, layer.compute_dtype), training=training)
                weights = np.random.default_rng(5).uniform(0.5, 1.5, size=y.shape).astype("float32")
                loss = tf.reduce_sum(tf.cast(y, "float32") * weights)
            gradients[policy] = [g.numpy() for g in tape.gradient(loss, biases_of(layer))]
        for got, want in zip(gradients["mixed_bfloat16"], gradients["float32"]):
            np.testing.assert_allclose(got, want, rtol=0, atol=2e-2 * np.abs(want).max(), err_msg=cls.__name__)


@pytest.mark.tensorflow_only
@pytest.mark.parametrize("amx", [True, False])
def test_tensorflow_bf16_training_keeps_the_bias_add_out_of_the_matmul_on_amx_cpus(monkeypatch, amx):
    # TensorFlow gives oneDNN a MatMul + BiasAdd on variable weights as a `gemm:jit` inner
    # product, which does not use the AMX tiles; on an AMX CPU the add is an XLA kernel instead
    import tensorflow as tf

    from keras_vit import cpu, tf_kernels

    monkeypatch.setattr(cpu, "cpu_flags", lambda: {"avx512_bf16", "amx_bf16"} if amx else {"avx512_bf16"})
    dense = keras.layers.Dense(32, dtype="mixed_bfloat16")
    dense.build((None, 16))
    dense.bias.assign(np.linspace(-1, 1, 32))
    x = tf.constant(np.random.default_rng(0).normal(size=(300, 16)), "bfloat16")

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            with keras.src.backend.AutocastScope("bfloat16"):
                y = tf.cast(tf_kernels.project(dense, x), "float32")
            loss = tf.reduce_sum(y * tf.range(32, dtype="float32"))
        return y, tape.gradient(loss, [dense.kernel, dense.bias])

    y, gradients = step(x)
    kinds = {op.type for op in step.get_concrete_function(x).graph.get_operations()}
    assert ("BiasAdd" in kinds) is not amx, sorted(kinds)
    x32, kernel = (np.asarray(tf.cast(t, "float32")) for t in (x, tf.cast(dense.kernel, "bfloat16")))
    want = x32 @ kernel + dense.bias.numpy()
    np.testing.assert_allclose(y.numpy(), want, atol=2e-2 * np.abs(want).max(), rtol=0)
    np.testing.assert_allclose(gradients[1].numpy(), 300 * np.arange(32), rtol=8e-3)  # a bf16 sum


@pytest.mark.parametrize(
    "shape, message",
    [
        ((1, 32, 32, 1), r"expects 3-channel images but got 1 channels.*RGB"),
        ((1, 32, 32, 4), r"expects 3-channel images but got 4 channels"),
        ((1, 48, 48, 3), r"built for 32x32 images but got 48x48.*model.resized\(\(48, 48\)\)"),
        ((32, 32, 3), r"expected a batch of images"),
    ],
)
def test_bad_images_name_the_fix(shape, message):
    model = keras_vit.ViT(tiny_config())
    x = np.zeros(shape, "float32")
    with pytest.raises(ValueError, match=message):
        model(x)
    with pytest.raises(ValueError, match=message):
        model.predict(x, verbose=0)
    with pytest.raises(ValueError, match=message):  # the attention model behind rollout and inspect
        model.attention_probabilities(x)
    # Checked before Keras's loops start
    model.compile(loss="mse")
    classes = model.config.num_classes
    labels = np.zeros((len(x), classes), "float32")
    with pytest.raises(ValueError, match=message):
        model.evaluate(x, labels, verbose=0)
    with pytest.raises(ValueError, match=message):
        model.fit(x, labels, epochs=1, verbose=0)
    good = np.zeros((2, 32, 32, 3), "float32")
    assert model.predict(good, verbose=0).shape == (2, classes)
    assert model.resized(64).predict(np.zeros((1, 64, 64, 3), "float32"), verbose=0).shape == (1, classes)


def test_a_loop_that_fails_leaves_the_model_its_weights():
    """Inputs whose shape is known only when a batch comes (a generator, a PyDataset) fail inside
    Keras's loop, where on JAX the variables' values are cleared while it runs: the model keeps
    its weights, and a `fit` that fails after some steps keeps what those steps learned."""
    model = keras_vit.ViT(tiny_config())
    good = images(batch=2, seed=0)
    reference = model.predict_on_batch(good)

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 2

        def __getitem__(self, index):
            return np.zeros((2, 48, 48, 3), "float32")

    def wrong_size():
        while True:
            yield np.zeros((2, 48, 48, 3), "float32"), np.zeros((2, model.config.num_classes), "float32")

    model.compile(keras.optimizers.SGD(0.1), "mse")
    for call in (
        lambda: model.predict(Batches(), verbose=0),
        lambda: model.predict([np.zeros((2, 48, 48, 3), "float32")], verbose=0),
        lambda: model.attention_probabilities(Batches()),
        lambda: model.evaluate(wrong_size(), steps=1, verbose=0),
        lambda: model.fit(wrong_size(), steps_per_epoch=1, shuffle=False, verbose=0),
    ):
        with pytest.raises(ValueError, match="built for 32x32 images but got 48x48"):
            call()
        np.testing.assert_allclose(model.predict_on_batch(good), reference, atol=1e-6)

    def failing_after_two_steps():
        for _ in range(2):
            yield images(batch=2, seed=1), np.ones((2, model.config.num_classes), "float32")
        raise RuntimeError("the input failed")

    steps = int(model.optimizer.iterations.numpy())
    with pytest.raises(Exception, match="the input failed"):  # TensorFlow wraps it in an UnknownError
        model.fit(failing_after_two_steps(), steps_per_epoch=4, shuffle=False, verbose=0)
    assert int(model.optimizer.iterations.numpy()) >= steps + 2  # (TensorFlow counts one more)
    assert np.abs(model.predict_on_batch(good) - reference).max() > 1e-4  # the two steps' updates are kept
    model.fit(good, np.ones((2, model.config.num_classes), "float32"), verbose=0)


def test_patch_embedding_rejects_indivisible_input():
    layer = keras_vit.layers.PatchEmbedding(8, 16)
    with pytest.raises(ValueError, match="not divisible by patch size"):
        layer(np.zeros((1, 30, 32, 3), "float32"))


@pytest.mark.parametrize("patch_size, channels", [(4, 3), ((8, 4), 1), (1, 16)])
def test_patch_matmul_equals_the_convolution(patch_size, channels):
    # JAX runs the patch projection as a matmul (faster there); every backend can check it
    layer = keras_vit.layers.PatchEmbedding(24, patch_size)
    x = images(batch=2, size=(16, 32), channels=channels)
    layer.build(x.shape)
    layer.projection.bias.assign(np.linspace(-1, 1, 24))
    conv = keras.ops.reshape(layer.projection(x), (2, -1, 24))
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(layer._project_patches(x)), keras.ops.convert_to_numpy(conv), atol=1e-4, rtol=1e-5
    )


@pytest.mark.tensorflow_only
def test_tensorflow_training_runs_the_patch_projection_as_a_matmul():
    # oneDNN's bfloat16 filter gradient of the stride-P convolution with 3 input channels took
    # about 7x the matmul's forward and gradient on an AMX CPU; the values and gradients are the
    # convolution's
    import tensorflow as tf

    layer = keras_vit.layers.PatchEmbedding(24, 4, dtype="mixed_bfloat16")
    x = tf.constant(images(batch=2, size=(16, 32)) / 255)
    layer.build(x.shape)
    layer.projection.bias.assign(np.linspace(-1, 1, 24))
    weights = tf.constant(np.random.default_rng(0).uniform(0.5, 1.5, size=(2, 32, 24)).astype("float32"))

    def forward_and_gradients(project):
        @tf.function
        def step(x):
            with tf.GradientTape() as tape:
                y = project(x)
                loss = tf.reduce_sum(y * weights)
            return y, tape.gradient(loss, [layer.projection.kernel, layer.projection.bias])

        return step, step(x)

    step, (y, gradients) = forward_and_gradients(lambda x: tf.cast(layer(x, training=True), "float32"))
    kinds = {op.type for op in step.get_concrete_function(x).graph.get_operations()}
    assert "MatMul" in kinds and not kinds & {"Conv2D", "Conv2DBackpropFilter"}, sorted(kinds)
    # the convolution in float32 on the same bf16-rounded input and kernel
    rounded = lambda t: tf.cast(tf.cast(t, "bfloat16"), "float32")  # noqa: E731
    _, (y_conv, gradients_conv) = forward_and_gradients(
        lambda x: tf.reshape(
            tf.nn.conv2d(rounded(x), rounded(layer.projection.kernel), 4, "VALID") + layer.projection.bias, (2, -1, 24)
        )
    )
    assert y.dtype == gradients[0].dtype == "float32"
    np.testing.assert_allclose(y.numpy(), y_conv.numpy(), atol=2e-2 * np.abs(y_conv.numpy()).max(), rtol=0)
    for got, want in zip(gradients, gradients_conv):
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=2e-2 * np.abs(want.numpy()).max(), rtol=0)


def test_model_trains_with_fit():
    config = tiny_config(num_classes=2)
    model = keras_vit.ViT(config)
    x = images(batch=8)
    y = np.array([0, 1] * 4)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    before = model.evaluate(x, y, verbose=0)
    model.fit(x, y, epochs=15, batch_size=8, verbose=0)
    assert model.evaluate(x, y, verbose=0) < before


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="the stateless predict_on_batch is JAX's")
@pytest.mark.filterwarnings("ignore:Layer .* does not have a `quantize` method")
@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
def test_jax_predict_on_batch_is_stateless_and_gives_keras_numbers(dtype):
    """On JAX `ViT.predict_on_batch` skips Keras's per-call state round trip: same logits as
    Keras's own `predict_on_batch`, following new weight values and new weight variables
    (`quantize`), and Keras's path where the user switched XLA off."""
    model = perturb(keras_vit.ViT(tiny_config(), dtype=dtype))
    x = images(3)
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == "float32" else dict(rtol=1e-2, atol=1e-2)

    def check(moved_from=None):
        logits = model.predict_on_batch(x)
        assert isinstance(logits, np.ndarray) and logits.dtype == np.float32 and logits.flags.writeable
        np.testing.assert_allclose(logits, keras.Model.predict_on_batch(model, x), **tolerance)
        if moved_from is not None:  # the change reached the logits, far beyond the tolerance
            assert np.abs(logits - moved_from).max() > 0.1
        return logits

    first = check()
    assert model._stateless_predict is not None and model._stateless_predict.key is not None
    perturb(model, seed=1, scale=0.5)
    second = check(moved_from=first)
    model.quantize("int8")
    check(moved_from=second)
    model.compile(jit_compile=False)
    model._stateless_predict = None
    check()
    assert model._stateless_predict is None


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="the frozen bf16 predict is TensorFlow's")
def test_a_frozen_bf16_hybrid_holds_each_resnet_kernel_once():
    """Under mixed precision a ResNet kernel is standardised from its float32 value and the
    result cast once; freezing computes that once, so the frozen bf16 forward of a hybrid (its
    `predict` and bf16 SavedModel) stores each kernel once, standardised, in bf16, and neither the
    raw float32 kernel nor the ops on it (a bf16 R26+S/32 SavedModel: 125 MB with three bf16
    copies of each kernel, 98 MB with the float32 kernel, 71 MB folded)."""
    import tensorflow as tf

    from keras_vit import tf_predict

    config = tiny_config(resnet_layers=(1, 1), resnet_width=32, patch_size=1)
    model = perturb(keras_vit.ViT(config, dtype="mixed_bfloat16"))
    reference = keras_vit.ViT(config)
    reference.set_weights(model.get_weights())
    forward = tf_predict.frozen_forward(model)
    x = images(4)
    expected = keras.ops.convert_to_numpy(reference(x))
    np.testing.assert_allclose(forward(x).numpy(), expected, rtol=0.03, atol=0.03 * np.abs(expected).max())
    convolutions = model.get_layer("resnet").convolutions()
    standardised = {tuple(c.kernel.shape): [] for c in convolutions}  # shape -> standardised kernels
    for c in convolutions:
        standardised[tuple(c.kernel.shape)].append(
            keras.ops.convert_to_numpy(keras.ops.cast(c.standardise(c.kernel), "float32"))
        )
    graph_def = forward.graph.as_graph_def()
    stored = [
        tf.make_ndarray(n.attr["value"].tensor)
        for n in graph_def.node
        if n.op == "Const" and tuple(d.size for d in n.attr["value"].tensor.tensor_shape.dim) in standardised
    ]
    assert sorted(a.shape for a in stored) == sorted(tuple(c.kernel.shape) for c in convolutions)
    assert all(a.dtype == tf.bfloat16.as_numpy_dtype for a in stored)
    for array in stored:  # each equals its layer's standardised kernel, to bf16 rounding
        error = min(np.abs(array.astype("float32") - s).max() for s in standardised[array.shape])
        assert error <= 2**-7 * max(np.abs(s).max() for s in standardised[array.shape]), error
    nodes = {n.name: n for n in graph_def.node}
    of_constants = [n.name for n in graph_def.node if n.op == "Mean" and nodes[n.input[0].split(":")[0]].op == "Const"]
    assert not of_constants  # no standardisation left to run


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="freezing is TensorFlow's")
def test_freezing_a_model_with_a_loop_gives_its_outputs():
    """`export.freeze` takes any single-input Keras model: an LSTM's while loop, lowered into the
    frozen graph, is a cycle of ops (NextIteration -> Merge) that the constant folding walks
    past."""
    from keras_vit import tf_predict

    inputs = keras.Input((5, 3))
    outputs = keras.layers.Dense(2)(keras.layers.LSTM(4)(keras.layers.Dense(3)(inputs)))
    model = perturb(keras.Model(inputs, outputs))
    x = np.random.default_rng(0).standard_normal((2, 5, 3)).astype("float32")
    graph = tf_predict.frozen_forward(model)
    assert any(node.op == "NextIteration" for node in graph.graph.as_graph_def().node)  # the loop is there
    np.testing.assert_allclose(graph(x).numpy(), keras.ops.convert_to_numpy(model(x)), atol=1e-5)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="the frozen bf16 predict is TensorFlow's")
@pytest.mark.filterwarnings("ignore:Skipping variable loading for optimizer")
def test_tensorflow_bf16_predict_runs_on_bf16_weight_constants_that_follow_the_weights(tmp_path):
    """In bfloat16 on a TensorFlow CPU, `predict` and `predict_on_batch` run a graph whose
    matmul and convolution weights are bf16 constants (none cast per call); its logits agree
    with the float32 model's within bf16 tolerance, and every way of changing a weight (assign,
    a compiled update, `fit`, `load_weights`) reaches the next prediction. float32, XLA and
    eager models keep Keras's own step."""
    import tensorflow as tf

    model = perturb(keras_vit.ViT(tiny_config(), dtype="mixed_bfloat16"))
    reference = keras_vit.ViT(tiny_config())
    reference.set_weights(model.get_weights())
    x = images(6)
    tolerance = dict(rtol=0.03, atol=0.03 * np.abs(reference.predict_on_batch(x)).max())

    def check(moved_from=None):
        logits = model.predict_on_batch(x)
        assert logits.dtype == np.float32 and model._frozen_predict.forward is model._traced_forward
        np.testing.assert_allclose(logits, keras.ops.convert_to_numpy(model(x, training=False)), **tolerance)
        np.testing.assert_array_equal(
            model.predict(x, batch_size=4, verbose=0),
            np.concatenate([model.predict_on_batch(x[:4]), model.predict_on_batch(x[4:])]),
        )
        if moved_from is not None:  # the change reached the logits, far beyond the tolerance
            assert np.abs(logits - moved_from).max() > 10 * tolerance["atol"]
        return logits

    first = check()
    np.testing.assert_allclose(first, reference.predict_on_batch(x), **tolerance)
    # the input structures Keras takes (a dict by input name, a list of one) feed the same graph
    np.testing.assert_array_equal(model.predict({"images": x}, verbose=0), model.predict(x, verbose=0))
    np.testing.assert_array_equal(model.predict_on_batch([x]), first)
    with pytest.raises(ValueError, match="a ViT takes one input, its images; got 2 inputs"):
        model.predict_on_batch([x, x])
    for call in (model.predict_on_batch, lambda images: model.predict(images, verbose=0)):
        with pytest.raises(ValueError, match="built for 32x32 images but got 48x48"):
            call(images(2, size=(48, 48)))
    nodes = model._frozen_predict.forward.graph.as_graph_def().node
    constants = {n.name: tf.make_ndarray(n.attr["value"].tensor) for n in nodes if n.op == "Const"}
    assert not any(n.op == "ReadVariableOp" for n in nodes)
    by_name = {n.name: n for n in nodes}

    def source(name):  # a weight's constant, through the re-layouts of the heads-first q/k/v
        node = by_name[name.split(":")[0].lstrip("^")]
        relaid = ("ExpandDims", "Identity", "Reshape", "Transpose", "Unpack", "Mul")
        return source(node.input[0]) if node.op in relaid else node

    weights = [source(n.input[1]) for n in nodes if n.op in ("MatMul", "Conv2D", "BatchMatMulV2")]
    kernels = sorted({w.name for w in weights if w.op == "Const"})  # not the attention's products
    assert len(kernels) == 1 + 4 * model.config.num_layers + 1  # patches, q/k/v, out, fc1, fc2, head
    dtypes = [constants[name].dtype for name in kernels]
    assert dtypes.count(np.float32) == 1  # the head computes in float32
    assert dtypes.count(tf.bfloat16.as_numpy_dtype) == len(kernels) - 1
    # in a half-precision frozen graph q, k, v and the output projection are batch matmuls
    batched = [n for n in nodes if n.op == "BatchMatMulV2" and source(n.input[1]).op == "Const"]
    assert len(batched) == 4 * model.config.num_layers
    assert not any(n.op == "Cast" and n.input[0] in kernels for n in nodes)

    head = model.get_layer("head")
    head.kernel.assign(head.kernel.numpy()[:, ::-1])
    second = check(moved_from=first)
    tf.function(lambda: head.bias.assign_add(tf.fill(head.bias.shape, 1.0)))()
    third = check(moved_from=second)
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=keras.losses.SparseCategoricalCrossentropy(True))
    model.fit(x, np.arange(6) % 2, epochs=2, verbose=0)
    fourth = check(moved_from=third)
    reference.save_weights(tmp_path / "reference.weights.h5")
    model.load_weights(tmp_path / "reference.weights.h5")
    np.testing.assert_allclose(check(moved_from=fourth), first, **tolerance)

    for changed in (reference, model):
        changed.compile(jit_compile=changed is model)
        changed.predict_on_batch(x)
        assert changed._frozen_predict is None and changed._traced_forward is None


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="frozen graphs are TensorFlow's")
def test_frozen_forward_without_tensorflows_private_helpers_gives_the_same_logits(monkeypatch):
    """`frozen_forward` reads the variables as constants through TensorFlow's private helpers;
    a TensorFlow without them takes the public `convert_variables_to_constants_v2`, to the same
    graph and the same logits."""
    import tensorflow as tf
    from tensorflow.python.framework import convert_to_constants

    from keras_vit import tf_predict

    model = perturb(keras_vit.ViT(tiny_config(), dtype="mixed_bfloat16"))
    x = tf.constant(images(3))
    private = tf_predict.frozen_forward(model)
    expected = private(x).numpy()
    converted = []

    def convert(function):
        converted.append(function)
        return convert_to_constants.convert_variables_to_constants_v2(function)

    monkeypatch.setattr(
        tf_predict, "convert_to_constants", types.SimpleNamespace(convert_variables_to_constants_v2=convert)
    )
    public = tf_predict.frozen_forward(model)
    assert len(converted) == 1
    np.testing.assert_array_equal(public(x).numpy(), expected)
    kinds = [sorted(collections.Counter(n.op for n in f.graph.as_graph_def().node).items()) for f in (private, public)]
    assert kinds[0] == kinds[1]
    assert not np.array_equal(expected, np.zeros_like(expected))


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="frozen graphs are TensorFlow's")
@pytest.mark.parametrize("epsilon, zero_beta", [(1e-6, False), (1e-5, False), (1e-6, True)])
def test_frozen_graph_layer_norm_runs_as_one_onednn_kernel_with_the_layers_epsilon(epsilon, zero_beta):
    """In a frozen graph a bf16 LayerNorm is the subgraph TensorFlow's oneDNN rewrite replaces by
    one `_MklLayerNorm` kernel (where oneDNN is on), which gives the LayerNorm of the layer's
    epsilon: checked on rows whose variance (1e-6) is of the epsilon's order, where the
    kernel's own default epsilon (1e-3) would be far off. A `beta` of zeros (a fresh model's)
    fuses too. Without the rewrite the same ops give the same values; a bf16 ViT's frozen
    forward writes every LayerNorm this way, a fresh model's as well."""
    import tensorflow as tf
    from tensorflow.core.protobuf import rewriter_config_pb2
    from tensorflow.python.util import _pywrap_util_port

    from keras_vit import tf_predict

    rng = np.random.default_rng(0)
    x = (0.5 + 1e-3 * rng.standard_normal((2, 7, 64))).astype(tf.bfloat16.as_numpy_dtype)
    gamma = (1 + 0.2 * rng.standard_normal(64)).astype("float32")
    beta = np.zeros(64, "float32") if zero_beta else (0.1 * rng.standard_normal(64)).astype("float32")
    rows = x.astype(np.float64)
    centred = rows - rows.mean(-1, keepdims=True)
    expected = centred / np.sqrt((centred**2).mean(-1, keepdims=True) + epsilon) * gamma + beta
    graph = tf.Graph()
    with graph.as_default():
        feed = tf.compat.v1.placeholder(tf.bfloat16, x.shape, name="x")
        with tf.name_scope("block/norm"):
            out = tf_predict.layer_norm(feed, tf.constant(gamma), tf.constant(beta), epsilon)
    onednn = _pywrap_util_port.IsMklEnabled()

    def run(graph, fetch, feeds, remapping=True):
        """(result, the kernels that ran, each with its count)."""
        config = tf.compat.v1.ConfigProto()
        if not remapping:
            config.graph_options.rewrite_options.remapping = rewriter_config_pb2.RewriterConfig.OFF
        metadata = tf.compat.v1.RunMetadata()
        with tf.compat.v1.Session(graph=graph, config=config) as session:
            options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
            result = session.run(fetch, feeds, options=options, run_metadata=metadata)
        ran = [node.timeline_label for device in metadata.step_stats.dev_stats for node in device.node_stats]
        return result, collections.Counter(label.split(" = ")[-1].split("(")[0] for label in ran)

    for remapping in (True, False):
        result, kernels = run(graph, out, {feed: x}, remapping)
        assert ("_MklLayerNorm" in kernels) == (remapping and onednn)
        np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-4)

    # a fresh model's LayerNorms (beta zero) fuse as well as a trained model's
    model = keras_vit.ViT(tiny_config(), dtype="mixed_bfloat16")
    model = model if zero_beta else perturb(model)
    frozen = tf_predict.frozen_forward(model).graph
    graph_def = frozen.as_graph_def()
    norms = 2 * model.config.num_layers + 1
    assert sum(n.op == "SquaredDifference" for n in graph_def.node) == norms
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    output = graph.get_tensor_by_name(frozen.outputs[0].name)
    _, kernels = run(graph, output, {frozen.inputs[0].name: images()})
    assert kernels["_MklLayerNorm"] == (norms if onednn else 0)


def test_feature_model_gives_maps_and_the_pooled_embedding_for_downstream_heads(tmp_path):
    """`feature_model`: chosen blocks' patch tokens as (batch, rows, cols, D) maps and the pooled
    embedding (what a headless model returns); it round-trips through .keras, trains the
    shared weights under a segmentation-style head, and (TensorFlow) exports as a SavedModel."""
    model = perturb(keras_vit.ViT(tiny_config()))
    features = model.feature_model(blocks=(0, -1), norm=True)
    x = images()
    out = {k: keras.ops.convert_to_numpy(v) for k, v in features(x).items()}
    assert sorted(out) == ["block_0", "block_1", "pooled"]
    assert out["block_0"].shape == out["block_1"].shape == (2, 4, 4, 64) and out["pooled"].shape == (2, 64)
    headless = keras_vit.ViT(tiny_config(num_classes=0))
    for target, source in zip(headless.weights, [w for w in model.weights if not w.path.startswith("head/")]):
        target.assign(source)
    np.testing.assert_allclose(out["pooled"], keras.ops.convert_to_numpy(headless(x)), atol=1e-6)
    assert not np.allclose(out["block_0"], out["block_1"])
    only_first = model.feature_model(blocks=(0,), pooled=False)
    assert list(only_first.output) == ["block_0"] and len(only_first.layers) < len(features.layers)
    path = tmp_path / "features.keras"
    features.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    assert isinstance(reloaded, keras_vit.ViTFeatures)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(reloaded(x)["block_1"]), out["block_1"], atol=1e-6)
    for wrong in (features, reloaded):  # images of another size: the model's own message, as a ViT's
        with pytest.raises(ValueError, match=r"built for 32x32 images but got 48x48.*model.resized"):
            wrong(images(size=(48, 48)))
        with pytest.raises(ValueError, match=r"built for 32x32 images but got 48x48"):
            wrong.predict(images(size=(48, 48)), verbose=0)
    maps = model.feature_model(blocks=(-1,), pooled=False)
    masks = keras.layers.Conv2D(3, 1, name="mask_head")(maps.output["block_1"])
    segmenter = keras.Model(maps.input, masks)
    segmenter.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    before = keras.ops.convert_to_numpy(model.get_layer("block_0").mlp.fc1.kernel).copy()
    segmenter.train_on_batch(x, np.ones((2, 4, 4, 3), "float32"))
    assert not np.allclose(keras.ops.convert_to_numpy(model.get_layer("block_0").mlp.fc1.kernel), before)
    with pytest.raises(ValueError, match=r"blocks must be in \[-2, 2\)"):
        model.feature_model(blocks=(5,))
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        features.export(str(tmp_path / "saved"), verbose=False)
        loaded = tf.saved_model.load(str(tmp_path / "saved"))  # kept: its variables live as long as it
        served = loaded.serve(tf.constant(x))
        now = keras.ops.convert_to_numpy(features(x)["pooled"])  # the weights the head step moved
        np.testing.assert_allclose(served["pooled"].numpy(), now, atol=1e-5)


def test_inspection_apis_take_natural_input_forms_and_refuse_bad_ones_in_one_line(tmp_path):
    from keras_vit import inspect, plot
    from keras_vit.resample import resample_position_embeddings

    model = perturb(keras_vit.ViT(tiny_config()))
    x = images()
    # a list of images is a batch (it failed inside the attention model)
    listed = model.attention_probabilities(list(x))
    for got, want in zip(listed, model.attention_probabilities(x)):
        np.testing.assert_allclose(got, want, atol=1e-6)
    # one block index, as an int (TypeError: 'int' object is not iterable)
    assert list(model.feature_model(blocks=1, pooled=False).output) == ["block_1"]
    with pytest.raises(ValueError, match="blocks must be block indices"):
        model.feature_model(blocks=(0.5,))
    for count in (0, -3, 2.5):
        with pytest.raises(ValueError, match="count must be a positive number of components"):
            inspect.patch_embedding_components(model, count=count)
    components, explained = inspect.patch_embedding_components(model, count=np.int64(3))
    assert components.shape == (3, 8, 8, 3) and explained.shape == (3,)
    # numpy integers are grid sides (np.int64(6) was taken for a sequence)
    posemb = np.random.default_rng(0).standard_normal((1, 17, 8)).astype("float32")
    np.testing.assert_array_equal(
        resample_position_embeddings(posemb, np.int64(6), old_grid=np.int64(4)), resample_position_embeddings(posemb, 6)
    )
    with pytest.raises(ValueError, match="old_grid must be positive"):
        resample_position_embeddings(posemb, 6, old_grid=(4, 0))
    # a map or label missing for an image (zip dropped the image without a word)
    maps = np.zeros((1, 32, 32))
    with pytest.raises(ValueError, match="1 maps for 2 images"):
        plot.heatmap_overlays(x, maps, tmp_path / "f.png", "t")
    with pytest.raises(ValueError, match="2 maps and 3 labels for 2 images"):
        plot.heatmap_overlays(x, np.zeros((2, 32, 32)), tmp_path / "f.png", "t", labels=["a", "b", "c"])
    assert not (tmp_path / "f.png").exists()


def test_an_empty_batch_gives_empty_outputs_on_every_backend():
    # Keras's predict loop failed (UnboundLocalError), and PyTorch could not reshape no patches;
    # TensorFlow's oneDNN convolution (AVX-512 CPUs) returned its input's shape for no images
    model = keras_vit.ViT(tiny_config())
    empty = images(batch=0)
    assert keras.ops.convert_to_numpy(model(empty)).shape == (0, 7)
    hybrid = keras_vit.ViT(tiny_config(resnet_layers=(1, 1), resnet_width=32, patch_size=1))
    assert keras.ops.convert_to_numpy(hybrid(empty)).shape == hybrid.predict(empty, verbose=0).shape == (0, 7)
    assert model.predict(empty, verbose=0).shape == model.predict_on_batch(empty).shape == (0, 7)
    assert [a.shape for a in model.attention_probabilities(empty)] == [(0, 4, 17, 17)] * 2
    features = model.feature_model(blocks=0).predict(empty, verbose=0)
    assert features["block_0"].shape == (0, 4, 4, 64) and features["pooled"].shape == (0, 64)


def test_a_model_of_dynamic_image_size_trains_predicts_and_saves_at_any_multiple_of_the_patch(tmp_path):
    """One model, batches of several sizes: `fit`, `predict`, the feature API and a `.keras`
    round trip; at each size it computes what a fixed copy built for that size computes."""
    config = tiny_config(
        dynamic_image_size=True, posemb_interpolation="bicubic", rope="eva02", num_register_tokens=2, num_classes=3
    )
    model = perturb(keras_vit.ViT(config), scale=0.2)
    patch = config.patch_size[0]
    rng = np.random.default_rng(0)
    square, wide = (rng.uniform(0, 255, (4, h * patch, w * patch, 3)).astype("float32") for h, w in ((3, 3), (2, 5)))
    logits = {}
    for x in (square, wide):  # direct calls: `predict` traces a function per shape, seconds each
        fixed = model.resized(x.shape[1:3], dynamic_image_size=False)
        logits[x.shape] = keras.ops.convert_to_numpy(model(x))
        np.testing.assert_allclose(logits[x.shape], keras.ops.convert_to_numpy(fixed(x)), atol=1e-5)
    np.testing.assert_allclose(model.predict(wide, verbose=0), logits[wide.shape], atol=1e-5)
    maps = model.feature_model(blocks=(0,), pooled=False)(wide)["block_0"]
    assert tuple(maps.shape) == (4, 2, 5, config.hidden_size)

    model.compile(
        optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    model.fit(wide, np.arange(4) % 3, epochs=1, batch_size=4, verbose=0)
    trained = keras.ops.convert_to_numpy(model(wide))
    assert np.abs(trained - logits[wide.shape]).max() > 1e-4  # the step trained it

    model.save(tmp_path / "dynamic.keras")
    loaded = keras.saving.load_model(tmp_path / "dynamic.keras")
    assert loaded.config.dynamic_image_size
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(wide)), trained, atol=1e-6)
    with pytest.raises(ValueError, match=f"multiples of {patch}x{patch} but got {patch * 2 + 1}x"):
        model.predict(np.zeros((1, patch * 2 + 1, patch * 2, 3), "float32"), verbose=0)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TensorFlow's graph optimizer")
@pytest.mark.parametrize("approximate", [False, True])
def test_tensorflow_fuses_each_gelu_into_fc1(approximate):
    """TensorFlow's graph optimizer fuses fc1's MatMul, bias and GELU into one oneDNN kernel only
    when the GELU's op names start with the MatMul's scope (`tf_predict.gelu_after_projection`):
    the tanh GELU (SigLIP) stayed eleven ops otherwise. Checked on the graph TensorFlow runs."""
    import tensorflow as tf

    from keras_vit import tf_predict

    model = keras_vit.ViT(tiny_config(gelu_approximate=approximate), dtype="mixed_bfloat16")
    frozen = tf_predict.frozen_forward(model).graph
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(frozen.as_graph_def(), name="")
    images, logits = (graph.get_tensor_by_name(t.name) for t in (frozen.inputs[0], frozen.outputs[0]))
    run = tf.compat.v1.RunMetadata()
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(
            logits,
            {images: np.zeros((2, 32, 32, 3), images.dtype.as_numpy_dtype)},
            options=tf.compat.v1.RunOptions(output_partition_graphs=True),
            run_metadata=run,
        )
    fused = [
        [op.decode() for op in node.attr["fused_ops"].list.s]
        for partition in run.partition_graphs
        for node in partition.node
        if "fused_ops" in node.attr
    ]
    gelu = "GeluApproximate" if approximate else "GeluExact"
    assert fused.count(["BiasAdd", gelu]) == 2, fused  # fc1 of each of the 2 blocks
    assert not [node.op for p in run.partition_graphs for node in p.node if node.op in ("Tanh", "Erfc", "Erf")]
