"""The one bridge to tensorflow-model-optimization (tfmot), which works only on tf_keras
(Keras 2) models: the keras_vit model is rebuilt as a tf_keras model from its config, its
weights copied over (outputs match to float rounding), then quantisation-aware training,
pruning or weight clustering is applied, fine-tuned and, for pruning and clustering, the
result copied back into a keras_vit model.

Importing tensorflow_model_optimization sets TF_USE_LEGACY_KERAS=1 for the process (so
`tf.keras` becomes tf_keras): it is imported here only, lazily, and the project never uses
`tf.keras`.
"""

import logging

import numpy as np
import tensorflow as tf

from keras_vit.export.source import ExportError

logger = logging.getLogger("keras_vit")

# A hybrid's ResNet: the keras_vit layer, its weights' path prefix and the rebuild's name prefix.
RESNET = "resnet"


# tf-keras and tensorflow-model-optimization declare requirements that clash with
# tensorflow-cpu (see requirements/no-deps.txt), so the export extra cannot bring them.
INSTALL_HINT = "pip install --no-deps tf-keras==2.21.0 tensorflow-model-optimization==0.8.1"


def check_installed():
    """Raises an `ExportError` naming what to install when tf_keras or tfmot is missing."""
    import importlib.util

    missing = [name for name in ("tf_keras", "tensorflow_model_optimization") if importlib.util.find_spec(name) is None]
    if missing:
        raise ExportError(
            f"QAT, pruning and clustering need {' and '.join(missing)}, which is not installed: {INSTALL_HINT}"
        )


def _tfmot():
    import tensorflow_model_optimization as tfmot

    return tfmot


def _layers():
    """tf_keras layers of the rebuilt ViT (defined on first use: tf_keras loads lazily)."""
    import tf_keras

    class Normalize(tf_keras.layers.Layer):
        def __init__(self, mean, std, **kwargs):
            super().__init__(**kwargs)
            self.mean, self.std = list(mean), list(std)

        def call(self, x):
            return (x - tf.constant(self.mean)) * tf.constant([1.0 / s for s in self.std])

        def get_config(self):
            return {**super().get_config(), "mean": self.mean, "std": self.std}

    class Tokens(tf_keras.layers.Layer):
        """Patch grid -> token sequence with the class token prepended and positions added."""

        def __init__(self, num_prefix_tokens, **kwargs):
            super().__init__(**kwargs)
            self.num_prefix_tokens = num_prefix_tokens

        def build(self, shape):
            rows, cols, width = shape[1:]
            if self.num_prefix_tokens:
                self.token = self.add_weight("token", (1, 1, width), initializer="zeros")
            self.embedding = self.add_weight(
                "embedding", (1, rows * cols + self.num_prefix_tokens, width), initializer="zeros"
            )

        def call(self, x):
            x = tf.reshape(x, (-1, x.shape[1] * x.shape[2], x.shape[3]))
            if self.num_prefix_tokens:
                x = tf.concat([tf.tile(self.token, [tf.shape(x)[0], 1, 1]), x], axis=1)
            return x + self.embedding

        def get_config(self):
            return {**super().get_config(), "num_prefix_tokens": self.num_prefix_tokens}

    class LayerNorm(tf_keras.layers.Layer):
        """Centred layer normalisation, as keras_vit's `LayerNorm` (quantises fully)."""

        def __init__(self, epsilon, **kwargs):
            super().__init__(**kwargs)
            self.epsilon = epsilon

        def build(self, shape):
            self.gamma = self.add_weight("gamma", shape[-1:], initializer="ones")
            self.beta = self.add_weight("beta", shape[-1:], initializer="zeros")

        def call(self, x):
            centred = x - tf.reduce_mean(x, -1, keepdims=True)
            variance = tf.reduce_mean(centred * centred, -1, keepdims=True)
            return centred * tf.math.rsqrt(variance + self.epsilon) * self.gamma + self.beta

        def get_config(self):
            return {**super().get_config(), "epsilon": self.epsilon}

    class GroupNorm(tf_keras.layers.Layer):
        """Centred group normalisation over the last axis, as keras_vit's `GroupNormalization`."""

        def __init__(self, groups, epsilon, **kwargs):
            super().__init__(**kwargs)
            self.groups, self.epsilon = groups, epsilon

        def build(self, shape):
            self.gamma = self.add_weight("gamma", shape[-1:], initializer="ones")
            self.beta = self.add_weight("beta", shape[-1:], initializer="zeros")

        def call(self, x):
            shape = tf.shape(x)
            grouped = tf.reshape(x, (shape[0], -1, self.groups, x.shape[-1] // self.groups))
            centred = grouped - tf.reduce_mean(grouped, (1, 3), keepdims=True)
            variance = tf.reduce_mean(centred * centred, (1, 3), keepdims=True)
            return tf.reshape(centred * tf.math.rsqrt(variance + self.epsilon), shape) * self.gamma + self.beta

        def get_config(self):
            return {**super().get_config(), "groups": self.groups, "epsilon": self.epsilon}

    class AttentionCore(tf_keras.layers.Layer):
        """softmax(q k^T / sqrt(d)) v from the fused `[q | k | v]` projection (no weights)."""

        def __init__(self, num_heads, **kwargs):
            super().__init__(**kwargs)
            self.num_heads = num_heads

        def call(self, qkv):
            tokens, width = qkv.shape[1], qkv.shape[2] // 3
            head_dim = width // self.num_heads
            qkv = tf.transpose(tf.reshape(qkv, (-1, tokens, 3, self.num_heads, head_dim)), (2, 0, 3, 1, 4))
            q, k, v = qkv[0] * (head_dim**-0.5), qkv[1], qkv[2]
            probabilities = tf.nn.softmax(tf.matmul(q, k, transpose_b=True), axis=-1)
            context = tf.transpose(tf.matmul(probabilities, v), (0, 2, 1, 3))
            return tf.reshape(context, (-1, tokens, width))

        def get_config(self):
            return {**super().get_config(), "num_heads": self.num_heads}

    class Scale(tf_keras.layers.Layer):
        """LayerScale: a learned per-channel factor."""

        def build(self, shape):
            self.gamma = self.add_weight("gamma", shape[-1:], initializer="ones")

        def call(self, x):
            return x * self.gamma

    class Gelu(tf_keras.layers.Layer):
        def __init__(self, approximate=False, **kwargs):
            super().__init__(**kwargs)
            self.approximate = approximate

        def call(self, x):
            return tf.nn.gelu(x, approximate=self.approximate)

        def get_config(self):
            return {**super().get_config(), "approximate": self.approximate}

    class Pool(tf_keras.layers.Layer):
        def __init__(self, mode, num_prefix_tokens, **kwargs):
            super().__init__(**kwargs)
            self.mode, self.num_prefix_tokens = mode, num_prefix_tokens

        def call(self, x):
            return x[:, 0] if self.mode == "token" else tf.reduce_mean(x[:, self.num_prefix_tokens :], axis=1)

        def get_config(self):
            return {**super().get_config(), "mode": self.mode, "num_prefix_tokens": self.num_prefix_tokens}

    return dict(
        Normalize=Normalize,
        Tokens=Tokens,
        LayerNorm=LayerNorm,
        GroupNorm=GroupNorm,
        AttentionCore=AttentionCore,
        Scale=Scale,
        Gelu=Gelu,
        Pool=Pool,
    )


def _check_rebuilt(config):
    """Raises an `ExportError` naming the first option of `config` the tf_keras rebuild lacks."""
    missing = [
        (config.num_register_tokens, "register tokens"),
        (config.classifier == "map", "the attention-pool (map) head"),
        (config.fc_norm, "a LayerNorm after the pooling (fc_norm)"),
        (config.no_embed_class, "a class token without a position slot (no_embed_class)"),
        (config.num_class_tokens != (config.classifier == "token"), "a class token beside mean pooling"),
        (config.rope is not None, "rotary position embeddings"),
        (not config.position_embedding, "no learned position embedding"),
        (config.mlp_type != "gelu" or config.mlp_norm, "a SwiGLU MLP or a LayerNorm inside the MLP"),
        (config.qkv_bias and not config.key_bias, "query and value biases without a key bias"),
    ]
    for present, what in missing:
        if present:
            raise ExportError(
                f"QAT, pruning and clustering (tfmot) cover the paper's ViT; this model has {what}, which their "
                "tf_keras rebuild lacks: export it without --qat-epochs, --prune and --cluster."
            )


def build_tf_keras(config):
    """A tf_keras functional ViT of `config` and its weight map: tf_keras layer name ->
    keras_vit weight paths, in the layer's weight order. A hybrid's ResNet convolutions are
    plain Conv2D layers that take the standardised kernels (`to_tf_keras`)."""
    import tf_keras

    _check_rebuilt(config)
    L = _layers()
    c, weights = config, {}

    def add(layer, source, names):
        weights[layer.name] = [f"{source}/{n}" for n in names]
        return layer

    def dense(units, source, **kw):
        return add(tf_keras.layers.Dense(units, name=source.replace("/", "-"), **kw), source, ("kernel", "bias"))

    def norm(source):
        return add(L["LayerNorm"](c.layer_norm_epsilon, name=source.replace("/", "-")), source, ("gamma", "beta"))

    images = tf_keras.Input(c.image_size + (c.channels,), name="images")
    x = L["Normalize"](c.input_mean, c.input_std, name="normalization")(images) if c.normalize_inputs else images
    if c.resnet_layers is not None:
        x = _resnet(c, x, add, L)
    conv = tf_keras.layers.Conv2D(c.hidden_size, c.patch_size, strides=c.patch_size, name="patch_embedding")
    x = add(conv, "patch_embedding/projection", ("kernel", "bias"))(x)
    tokens = add(L["Tokens"](c.num_prefix_tokens, name="tokens"), "", ())
    weights["tokens"] = (["class_token/token"] if c.num_prefix_tokens else []) + ["position_embedding/embedding"]
    x = tokens(x)
    for i in range(c.num_layers):
        b = f"block_{i}"
        y = dense(c.hidden_size * 3, f"{b}/attention/qkv", use_bias=c.qkv_bias)(norm(f"{b}/norm1")(x))
        y = dense(c.hidden_size, f"{b}/attention/out")(L["AttentionCore"](c.num_heads, name=f"{b}-attention")(y))
        if c.layer_scale_init is not None:
            y = add(L["Scale"](name=f"{b}-scale1"), f"{b}/scale1", ("gamma",))(y)
        x = tf_keras.layers.Add(name=f"{b}-add1")([x, y])
        y = dense(c.mlp_dim, f"{b}/mlp/fc1")(norm(f"{b}/norm2")(x))
        y = dense(c.hidden_size, f"{b}/mlp/fc2")(L["Gelu"](c.gelu_approximate, name=f"{b}-gelu")(y))
        if c.layer_scale_init is not None:
            y = add(L["Scale"](name=f"{b}-scale2"), f"{b}/scale2", ("gamma",))(y)
        x = tf_keras.layers.Add(name=f"{b}-add2")([x, y])
    x = L["Pool"](c.classifier, c.num_prefix_tokens, name="pooling")(norm("encoder_norm")(x))
    if c.representation_size:
        x = dense(c.representation_size, "pre_logits", activation="tanh")(x)
    if c.num_classes:
        x = dense(c.num_classes, "head")(x)
    if not c.qkv_bias:
        for i in range(c.num_layers):
            weights[f"block_{i}-attention-qkv"] = weights[f"block_{i}-attention-qkv"][:1]
    return tf_keras.Model(images, x, name="vit_tf_keras"), weights


def _resnet(c, x, add, L):
    """The hybrid's ResNet stem on `x`, as keras_vit's `ResNetStem` computes it."""
    import tf_keras

    from keras_vit.layers.resnet import NUMERICS
    from keras_vit.names import RESNET_GROUPS

    epsilon = NUMERICS[c.resnet_numerics]["group_norm_epsilon"]

    def conv_norm(x, filters, size, source, norm, strides=1):
        name = f"{RESNET}/{source}"
        conv = tf_keras.layers.Conv2D(
            filters, size, strides=strides, padding="same", use_bias=False, name=name.replace("/", "-")
        )
        x = add(conv, name, ("kernel",))(x)
        name = f"{RESNET}/{norm}"
        return add(L["GroupNorm"](RESNET_GROUPS, epsilon, name=name.replace("/", "-")), name, ("gamma", "beta"))(x)

    x = tf_keras.layers.ReLU()(conv_norm(x, c.resnet_width, 7, "conv_root", "gn_root", strides=2))
    x = tf_keras.layers.MaxPooling2D(3, strides=2, padding="same")(x)
    for stage, size in enumerate(c.resnet_layers):
        filters = c.resnet_width * 2**stage
        for unit in range(size):
            u, strides = f"block{stage + 1}_unit{unit + 1}", 2 if (stage > 0 and unit == 0) else 1
            residual = x
            if x.shape[-1] != 4 * filters or strides != 1:
                residual = conv_norm(x, 4 * filters, 1, f"{u}/conv_proj", f"{u}/gn_proj", strides)
            y = tf_keras.layers.ReLU()(conv_norm(x, filters, 1, f"{u}/conv1", f"{u}/gn1"))
            y = tf_keras.layers.ReLU()(conv_norm(y, filters, 3, f"{u}/conv2", f"{u}/gn2", strides))
            y = conv_norm(y, 4 * filters, 1, f"{u}/conv3", f"{u}/gn3")
            x = tf_keras.layers.ReLU()(tf_keras.layers.Add()([residual, y]))
    return x


def to_tf_keras(model):
    """The keras_vit `model` as a tf_keras model with the same weights, checked to give the
    same logits (to 1e-4 relative to their scale) on random pixels."""
    tf_model, mapping = build_tf_keras(model.config)
    values = {w.path: np.asarray(w.numpy() if hasattr(w, "numpy") else w) for w in model.weights}
    if model.config.resnet_layers is not None:
        for conv in model.get_layer(RESNET).convolutions():
            values[conv.kernel.path] = np.asarray(conv.standardise(conv.kernel))
    for name, paths in mapping.items():
        tf_model.get_layer(name).set_weights([values[p] for p in paths])
    shape = (2, *model.config.image_size, model.config.channels)
    probe = np.random.default_rng(0).uniform(0, 255, shape).astype(np.float32)
    expected = np.asarray(model(probe, training=False), np.float32)
    got = tf_model(probe, training=False).numpy()
    if np.abs(expected - got).max() > 1e-4 * max(1.0, np.abs(expected).max()):
        raise ExportError(f"the tf_keras rebuild differs from the model by {np.abs(expected - got).max():.2e}.")
    return tf_model, mapping


def copy_back(tf_model, mapping, model):
    """A new keras_vit model of `model`'s config holding `tf_model`'s (stripped) weights
    (strip_pruning/strip_clustering keep the layer names, so the weight map applies); a
    hybrid's ResNet kernels are `model`'s own (the rebuild's are their standardised values)."""
    from keras_vit import ViT

    new = ViT(model.config, class_names=model.class_names, name=model.name)
    targets, own = {w.path: w for w in new.weights}, {w.path: w for w in model.weights}
    for name, paths in mapping.items():
        layer = tf_model.get_layer(name)
        values = [own[path] for path in paths] if _is_resnet_conv(layer) else layer.get_weights()
        for path, value in zip(paths, values):
            targets[path].assign(value)
    return new


def _fine_tune(tf_model, source, epochs, learning_rate, callbacks=(), label_smoothing=0.0):
    import tf_keras

    if source.train is None:
        raise ExportError(
            "fine-tuning (QAT, pruning, clustering) needs training data: export a run directory or pass --dataset."
        )
    tf_model.compile(
        optimizer=tf_keras.optimizers.Adam(learning_rate),
        loss=tf_keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=label_smoothing),
    )
    tf_model.fit(
        source.train, epochs=epochs, steps_per_epoch=source.steps_per_epoch, callbacks=list(callbacks), verbose=0
    )


def _is_resnet_conv(layer):
    """Whether a layer of the rebuild is one of a hybrid's ResNet convolutions."""
    return layer.name.startswith(f"{RESNET}-") and type(layer).__name__ == "Conv2D"


def pruned_or_clustered(path):
    """Whether pruning and clustering apply to the keras_vit weight at `path`: the kernels but a
    hybrid's ResNet's."""
    return path.endswith("kernel") and not path.startswith(f"{RESNET}/")


def _note_resnet(config, what):
    if config.resnet_layers is not None:
        logger.info(
            "keras_vit: the hybrid's ResNet convolutions are not %s and not fine-tuned: they standardise their "
            "kernels, and a standardised sparse or clustered kernel is neither",
            what,
        )


def _wrap_weighted(tf_model, wrap):
    """A copy of `tf_model` with `wrap` applied to every Dense and Conv2D layer but a hybrid's
    ResNet convolutions, which it freezes instead (their kernels are the standardised values;
    `copy_back` keeps the model's own). The source is a throwaway rebuild, so sharing its
    other layers is harmless."""
    import tf_keras

    def clone(layer):
        if _is_resnet_conv(layer):
            layer.trainable = False
            return layer
        return wrap(layer) if isinstance(layer, (tf_keras.layers.Dense, tf_keras.layers.Conv2D)) else layer

    return tf_keras.models.clone_model(tf_model, clone_function=clone)


def prune(model, source, sparsity, epochs=2, learning_rate=1e-4):
    """Magnitude pruning of every Dense/Conv2D kernel to `sparsity` with a polynomial-decay
    schedule over the fine-tuning steps (masks updated ten times, not tfmot's default every
    100 steps, which a short run would never reach); stripped and copied back."""
    tfmot = _tfmot()
    if not 0.0 < sparsity < 1.0:
        raise ExportError(f"--prune takes a sparsity in (0, 1); got {sparsity}.")
    _note_resnet(model.config, "pruned")
    tf_model, mapping = to_tf_keras(model)
    steps = max(1, epochs * source.steps_per_epoch)
    schedule = tfmot.sparsity.keras.PolynomialDecay(
        0.0, sparsity, begin_step=0, end_step=max(1, steps - 1), frequency=max(1, steps // 10)
    )
    pruned = _wrap_weighted(
        tf_model, lambda layer: tfmot.sparsity.keras.prune_low_magnitude(layer, pruning_schedule=schedule)
    )
    _fine_tune(
        pruned,
        source,
        epochs,
        learning_rate,
        [tfmot.sparsity.keras.UpdatePruningStep()],
        label_smoothing=source.label_smoothing,
    )
    return copy_back(tfmot.sparsity.keras.strip_pruning(pruned), mapping, model)


def cluster(model, source, clusters, epochs=2, learning_rate=1e-4):
    """Weight clustering of every Dense/Conv2D kernel into `clusters` shared values
    (k-means++ initialisation), fine-tuned, stripped and copied back."""
    tfmot = _tfmot()
    if clusters < 2:
        raise ExportError(f"--cluster takes at least 2 clusters; got {clusters}.")
    _note_resnet(model.config, "clustered")
    tf_model, mapping = to_tf_keras(model)
    init = tfmot.clustering.keras.CentroidInitialization.KMEANS_PLUS_PLUS
    clustered = _wrap_weighted(
        tf_model,
        lambda layer: tfmot.clustering.keras.cluster_weights(
            layer, number_of_clusters=clusters, cluster_centroids_init=init
        ),
    )
    _fine_tune(clustered, source, epochs, learning_rate, label_smoothing=source.label_smoothing)
    return copy_back(tfmot.clustering.keras.strip_clustering(clustered), mapping, model)


def quantization_aware(model, source, epochs, learning_rate=1e-5):
    """Quantisation-aware fine-tuning: Dense/Conv2D (a hybrid's ResNet convolutions included)
    through tfmot's default 8-bit scheme, the custom layers (normalisation, tokens, LayerNorm,
    GroupNorm, attention core, GELU, pooling, LayerScale) with an output fake-quantiser.
    Returns the trained tf_keras model, whose TFLite conversion is full-integer int8."""
    tfmot = _tfmot()
    q = tfmot.quantization.keras
    tf_model, _ = to_tf_keras(model)
    L = _layers()
    custom = {type(layer).__name__: type(layer) for layer in tf_model.layers if type(layer).__name__ in L}

    class OutputQuantizeConfig(q.QuantizeConfig):
        """Weights left float (these layers have none, or tiny ones), output quantised."""

        def get_weights_and_quantizers(self, layer):
            return []

        def get_activations_and_quantizers(self, layer):
            return []

        def set_quantize_weights(self, layer, quantize_weights):
            pass

        def set_quantize_activations(self, layer, quantize_activations):
            pass

        def get_output_quantizers(self, layer):
            return [
                q.quantizers.MovingAverageQuantizer(num_bits=8, per_axis=False, symmetric=False, narrow_range=False)
            ]

        def get_config(self):
            return {}

    def annotate(layer):
        if type(layer).__name__ in custom:
            return q.quantize_annotate_layer(layer, quantize_config=OutputQuantizeConfig())
        if layer.__class__.__name__ in ("Dense", "Conv2D", "Add", "ReLU", "MaxPooling2D"):
            return q.quantize_annotate_layer(layer)
        return layer

    import tf_keras

    annotated = tf_keras.models.clone_model(tf_model, clone_function=annotate)
    with q.quantize_scope({**custom, "OutputQuantizeConfig": OutputQuantizeConfig}):
        quantized = q.quantize_apply(annotated)
    _initialise_ranges(quantized, tf_model, source.calibration_images)
    _fine_tune(quantized, source, epochs, learning_rate, label_smoothing=source.label_smoothing)
    return quantized


def _initialise_ranges(quantized, tf_model, images):
    """Sets every activation fake-quant range to the min/max the float model reaches on
    `images`. tfmot starts them at [-6, 6] and moves them by an EMA of decay 0.999, so a
    short fine-tuning run would otherwise keep clipping (the digits model scored 10% before
    fine-tuning and lost 1-2 points after two epochs)."""
    import tf_keras

    names = [layer.layer.name for layer in quantized.layers if hasattr(layer, "layer")]
    probe = tf_keras.Model(tf_model.inputs, [tf_model.get_layer(n).output for n in names])
    low, high = {}, {}
    for start in range(0, len(images), 32):
        for name, value in zip(names, probe(images[start : start + 32], training=False)):
            value = value.numpy()
            low[name] = min(low.get(name, np.inf), float(value.min()))
            high[name] = max(high.get(name, -np.inf), float(value.max()))
    ranges = {**{n: (low[n], high[n]) for n in names}, "quantize_layer": (float(images.min()), float(images.max()))}
    for layer in quantized.layers:
        key = layer.layer.name if hasattr(layer, "layer") else layer.name
        for variable in layer.non_trainable_weights:
            leaf = variable.name.split("/")[-1].split(":")[0]
            if key in ranges and leaf.endswith(("output_min", "post_activation_min", "quantize_layer_min")):
                variable.assign(min(ranges[key][0], 0.0))
            elif key in ranges and leaf.endswith(("output_max", "post_activation_max", "quantize_layer_max")):
                variable.assign(max(ranges[key][1], 0.0))
