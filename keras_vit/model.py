"""`ViT`: the Vision Transformer as a functional `keras.Model`."""

import contextlib
import gc
import types
import warnings

import keras
import numpy as np

from keras_vit import distribution, initializers, jax_predict, presets
from keras_vit import layers as vit_layers
from keras_vit.config import ViTConfig, normalization_fields
from keras_vit.loops import WeightsKeptOnError
from keras_vit.transform import ImageTransform


class _ImagesChecked(WeightsKeptOnError):
    """`__call__`, `fit`, `evaluate` and `predict` that check the images against the model's
    `_image_spec()` (its `image_size` and `channels`) first, with messages that name the fix.

    `__call__` runs before Keras's own input-spec check (ViT's `call` checks too: stateless JAX
    execution reaches it without `__call__`). Images whose shape is known before the loop starts
    are checked there; others (a generator's, a PyDataset's) when traced, and the weights survive
    the error (`WeightsKeptOnError`)."""

    def __call__(self, images, *args, **kwargs):
        check_images(getattr(images, "shape", None), self._image_spec())
        return super().__call__(images, *args, **kwargs)

    def fit(self, x=None, *args, **kwargs):
        check_images(_input_shape(x), self._image_spec())
        return super().fit(x, *args, **kwargs)

    def evaluate(self, x=None, *args, **kwargs):
        check_images(_input_shape(x), self._image_spec())
        return super().evaluate(x, *args, **kwargs)

    def predict(self, x, *args, **kwargs):
        shape = _input_shape(x)
        check_images(shape, self._image_spec())
        if shape is not None and shape[0] == 0:  # Keras's loop fails on no batch at all
            return keras.tree.map_structure(keras.ops.convert_to_numpy, self.predict_on_batch(x))
        return super().predict(x, *args, **kwargs)


@keras.saving.register_keras_serializable(package="keras_vit")
class ViT(_ImagesChecked, keras.Model):
    """Vision Transformer (Dosovitskiy et al., ICLR 2021), built from a `ViTConfig`.

    A functional model from images `(batch, H, W, C)` with pixel values in [0, 255] to
    float32 logits `(batch, num_classes)` (or pooled features when `num_classes=0`).
    Layers, in order: `normalization`, `resnet` (hybrid only), `patch_embedding`,
    `class_token`, `position_embedding`, `register_tokens` (optional), `embedding_dropout`,
    `block_0`..`block_{L-2}`, `patch_grid` and `merge_patch_grid` (the input of the last block
    as a spatial map `(batch, rows, cols, D)`, the layer CAM methods target; numerically the
    identity), `block_{L-1}`, `encoder_norm`, `pooling` (`attention_pool` for the "map"
    classifier), `pre_logits` (optional), `head`.

    Args:
        config: a `ViTConfig` (or its dict form); defaults to ViT-B/16.
        dtype: dtype policy of the layers, e.g. "mixed_bfloat16"; logits stay float32.
        class_names: the name of each class, in logit order (None: unnamed). Saved with the
            model, so a `.keras` file keeps the labels it was trained or converted with.
    """

    def __init__(self, config=None, dtype=None, class_names=None, **kwargs):
        if config is None:
            config = ViTConfig()
        elif isinstance(config, dict):
            config = ViTConfig.from_dict(config)
        elif not isinstance(config, ViTConfig):
            raise TypeError(f"`config` must be a ViTConfig or a dict; got {type(config).__name__}.")
        kwargs.setdefault("name", "vit")
        parts = _Parts(config, dtype)
        images = keras.Input(shape=input_shape(config), name="images")
        outputs = parts.head(parts.encode(images)[0])
        super().__init__(inputs=images, outputs=outputs, **kwargs)
        # A Functional model does not take `dtype`; the model's own policy matters to
        # `compile` (loss scaling for mixed_float16) and to serialisation.
        self.dtype_policy = parts.patch_embedding.dtype_policy
        self.config = config
        self.class_names = class_names
        self._parts = parts
        self._attention_model = None
        self._stateless_predict = None
        self._frozen_predict = None
        self._traced_forward = None  # the frozen forward Keras's predict function was traced with

    @property
    def class_names(self):
        """The class names (a tuple of strings, one per class) or None; checked when set."""
        return self._class_names

    @class_names.setter
    def class_names(self, names):
        self._class_names = _check_class_names(names, self.config.num_classes)

    def _image_spec(self):
        return self.config

    def call(self, inputs, training=None, mask=None):
        check_images(getattr(inputs, "shape", None), self.config)
        return super().call(inputs, training=training, mask=mask)

    def fit(self, *args, **kwargs):
        self._frozen_predict = None  # training changes the weights: no frozen copy kept meanwhile
        return super().fit(*args, **kwargs)

    def predict(self, x, *args, **kwargs):
        """Keras's `predict`. A model that computes in bfloat16 on a TensorFlow CPU predicts
        through a graph that holds its weights as bf16 constants, refrozen when a weight has
        changed (`keras_vit.tf_predict`): oneDNN lays them out once for its AMX kernels."""
        self._prepare_frozen_predict()
        return super().predict(x, *args, **kwargs)

    def predict_on_batch(self, x):
        """Logits of one batch as NumPy. On the JAX backend this runs a jitted stateless call
        with the weights as arguments (`keras_vit.jax_predict`): the same numbers as Keras's
        `predict_on_batch` without its per-call variable reads and write-backs. In bfloat16 on a
        TensorFlow CPU, the frozen graph of `predict`."""
        check_images(_input_shape(x), self.config)
        if not jax_predict.applies(self, x):
            self._prepare_frozen_predict()
            return super().predict_on_batch(x)
        if self._stateless_predict is None:
            self._stateless_predict = jax_predict.StatelessPredict(self)
        return self._stateless_predict(x)

    def predict_step(self, *args):  # (data) on TensorFlow and PyTorch, (state, data) on JAX
        self._traced_forward = self._frozen_predict.forward if self._frozen_predict is not None else None
        if self._traced_forward is None:
            return super().predict_step(*args)
        inputs = keras.tree.flatten(keras.utils.unpack_x_y_sample_weight(args[-1])[0])  # `{"images": x}`, `[x]`
        if len(inputs) != 1:
            raise ValueError(f"a ViT takes one input, its images; got {len(inputs)} inputs.")
        images = inputs[0]
        check_images(getattr(images, "shape", None), self.config)  # what `__call__` checks
        return self._traced_forward(images)

    def _prepare_frozen_predict(self):
        """Sets up, refreshes or drops the frozen forward `predict_step` calls; Keras's traced
        predict function is dropped when it holds another."""
        if keras.backend.backend() != "tensorflow":
            return
        from keras_vit import tf_predict

        if not tf_predict.applies(self):
            self._frozen_predict = None
        elif self._frozen_predict is None:
            self._frozen_predict = tf_predict.FrozenPredict(self)
        if self._frozen_predict is not None:
            self._frozen_predict.refresh()
        forward = self._frozen_predict.forward if self._frozen_predict is not None else None
        if forward is not self._traced_forward:
            self.predict_function = None

    @classmethod
    def from_preset(cls, name, weights=None, dtype=None, class_names=None, normalization=None, **overrides):
        """Builds preset `name` (see `keras_vit.list_presets()`), any config field overridden,
        e.g. `ViT.from_preset("vit_b16", num_classes=10, image_size=384)`.

        `weights`: a checkpoint file, Hugging Face or keras-hub folder, `hf://ORG/NAME` or known
        name (`keras_vit.list_checkpoints()`), loaded with `keras_vit.load_weights`. A known name
        builds the model its checkpoint was trained as (resolution, classes, pre-logits)
        unless `overrides` say otherwise; a resampling of the position embeddings is logged.
        The model takes the image transform the checkpoint ships with (input statistics, crop,
        interpolation); `normalization` as in `from_checkpoint`.
        `class_names`: the model's classes in logit order (`num_classes` defaults to their
        count); the checkpoint's head follows them as in `from_checkpoint`."""
        overrides = _classes_named(class_names, _normalized(normalization, overrides))
        checkpoint = None
        if weights is not None:
            from keras_vit import checkpoints
            from keras_vit.checkpoints import known

            settings = known.settings(weights, name)  # a known name of another preset fails before its download
            checkpoint = checkpoints.open_weights(weights)
            shipped = (checkpoint.transform or {}) if checkpoint is not None else {}
            overrides = {**settings, **shipped, **overrides}
        model = cls(presets.get_config(name, **overrides), dtype=dtype, class_names=class_names)
        if checkpoint is not None:
            checkpoints.warn_assumed_normalization(checkpoint, weights, model.config, overrides)
            checkpoints.place(model, checkpoint, weights)
        elif weights is not None:  # a Keras weights file: it holds no checkpoint to open
            checkpoints.load_weights(model, weights)
        return model

    @classmethod
    def from_checkpoint(cls, source, dtype=None, class_names=None, normalization=None, **overrides):
        """Builds the model a checkpoint describes (sizes read off its tensors, the image
        transform it ships with), any config field overridden (e.g. `num_classes`,
        `image_size`), and loads it. `class_names`: the
        model's (default: the checkpoint's, where it keeps their head; `num_classes` defaults to
        their count). The head follows the names: the checkpoint's classes in another order are
        reordered, other classes get a new zero head (to rename the checkpoint's classes, set
        `model.class_names` after loading). `normalization`: the input statistics, a name of
        `keras_vit.names.NORMALIZATIONS` or "MEAN,STD" in pixel units (0-255), for a checkpoint
        that records none (a bare timm file: without it, one warning names the assumption)."""
        from keras_vit import checkpoints

        overrides = _classes_named(class_names, _normalized(normalization, overrides))
        read = checkpoints.open_checkpoint(source)
        config = ViTConfig(**checkpoints.architecture(read.fields, overrides, source))
        checkpoints.warn_assumed_normalization(read, source, config, overrides)
        model = cls(config, dtype=dtype, class_names=class_names)
        checkpoints.assign(model, read.weights, f"{source} ({read.kind})", read.class_names)
        checkpoints.adopt_class_names(model, read)
        return model

    @classmethod
    def get_layout_map(cls, device_mesh, model_parallel_dim_name="model", data_parallel_dim_name="batch"):
        """A `keras.distribution.LayoutMap` that splits the encoder blocks' kernels over the
        `model_parallel_dim_name` axis of `device_mesh` (Megatron style; see
        `keras_vit.distribution`), for `keras.distribution.ModelParallel`."""
        return distribution.get_layout_map(device_mesh, model_parallel_dim_name, data_parallel_dim_name)

    @property
    def image_transform(self):
        """The `ImageTransform` that turns an image of any size into this model's input (its
        config's size, crop fraction and interpolation)."""
        return ImageTransform.of(self.config)

    def feature_model(self, blocks=(-1,), norm=False, pooled=True):
        """A model sharing this one's weights: images -> a dict of features for downstream
        heads (detection, segmentation, retrieval), as timm's `forward_intermediates`.

        `blocks`: index or indices of the encoder blocks (negative from the end) whose patch
        tokens come out as `(batch, rows, cols, D)` maps under `"block_{i}"`; `norm`: apply the
        final LayerNorm to those maps; `pooled`: also `"pooled"`, the `(batch, D)` embedding the
        head reads (pre-logits included), without the head. Save it as a `.keras` file or
        export it as any Keras model; fine-tuning it trains this model's weights."""
        parts, count = self._parts, len(self._parts.blocks)
        blocks = (blocks,) if isinstance(blocks, (int, np.integer)) else tuple(blocks or ())
        if any(isinstance(i, bool) or not isinstance(i, (int, np.integer)) for i in blocks):
            raise ValueError(f"blocks must be block indices (ints); got {blocks}.")
        if any(not -count <= i < count for i in blocks):
            raise ValueError(f"blocks must be in [-{count}, {count}); got {blocks}.")
        chosen = sorted({int(i) % count for i in blocks})
        if not chosen and not pooled:
            raise ValueError("ask for at least one block's map or the pooled embedding.")
        images = keras.Input(shape=input_shape(self.config), name="images")
        x, grid = parts.embed(images)
        outputs = {}
        last = count - 1 if pooled else chosen[-1]
        for i, block in enumerate(parts.blocks[: last + 1]):
            x = block(x, grid=grid)
            if i in chosen:
                tokens = parts.encoder_norm(x) if norm else x
                to_map = vit_layers.TokenGrid(
                    parts.static_grid, self.config.num_prefix_tokens, dtype=self.dtype_policy, name=f"map_{i}"
                )
                outputs[f"block_{i}"] = to_map(tokens, grid=grid)
        if pooled:
            outputs["pooled"] = parts.pooled(parts.final_tokens(x))
        return ViTFeatures(images, outputs, name=f"{self.name}_features")

    def attention_model(self):
        """A model sharing this one's weights: images -> list of L attention probabilities,
        each `(batch, heads, tokens, tokens)` in float32 (rows sum to 1)."""
        if self._attention_model is None:
            self._attention_model = _AttentionProbabilities(self._parts, name=f"{self.name}_attention")
        return self._attention_model

    def attention_probabilities(self, images, batch_size=None):
        """Every block's attention probabilities for `images` (a batch, or a list of images),
        as a list of numpy arrays."""
        if isinstance(images, (list, tuple)):
            images = np.asarray(images, dtype="float32")
        outputs = self.attention_model().predict(images, batch_size=batch_size, verbose=0)
        return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]

    def resized(self, image_size=None, dynamic_image_size=None):
        """A copy built for another input resolution with all weights and `trainable` flags
        carried over (quantized layers stay quantized); the position embeddings are resampled
        to the new patch grid (paper section 3.2). `image_size` None keeps the model's;
        `dynamic_image_size` True or False makes the copy take any size or only `image_size`
        (None keeps the model's): a fixed copy of a dynamic model computes what the dynamic
        one computes at that size."""
        config = self.config.replace(image_size=image_size or self.config.image_size)
        if dynamic_image_size is not None:
            config = config.replace(dynamic_image_size=bool(dynamic_image_size))
        if config.rope == "eva02" and config.rope_reference_grid is None:  # rotary coordinates of the trained grid
            config = config.replace(rope_reference_grid=self.config.grid_size)
        new = ViT(config, dtype=self.dtype_policy, class_names=self.class_names, name=self.name)
        _quantize_layers(new, _quantized_layers(self))
        for source, target in zip(self.layers, new.layers):
            if isinstance(target, vit_layers.PositionEmbedding):
                target.assign_resampled(keras.ops.convert_to_numpy(source.embedding), source.grid_size)
            else:
                target.set_weights(source.get_weights())
        # Frozen parts stay frozen (a fine-tune at the new size trains what this model trained);
        # a parent's flag first, then its sublayers' own.
        for source, target in zip(
            [self, *self._flatten_layers(include_self=False)], [new, *new._flatten_layers(include_self=False)]
        ):
            target.trainable = source.trainable
        return new

    def get_config(self):
        config = {
            "config": self.config.to_dict(),
            "dtype": keras.saving.serialize_keras_object(self.dtype_policy),
            "name": self.name,
            "trainable": self.trainable,
        }
        if self.class_names is not None:  # absent otherwise: such files load in keras_vit 0.1 too
            config["class_names"] = list(self.class_names)
        frozen = [i for i, layer in enumerate(self._flatten_layers(include_self=False)) if not layer.trainable]
        if frozen and self.trainable:  # positions in the layer order the config rebuilds
            config["frozen_layers"] = frozen
        quantized = _quantized_layers(self)
        if quantized:  # the saved variables are the quantized ones; from_config quantizes these layers
            config["quantized_layers"] = quantized
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.saving.deserialize_keras_object(config["dtype"])
        frozen = set(config.pop("frozen_layers", ()))
        quantized = config.pop("quantized_layers", {})
        model = cls(**config)
        if frozen:  # in order: a parent's flag first, then its sublayers' own
            for i, layer in enumerate(model._flatten_layers(include_self=False)):
                layer.trainable = i not in frozen
        _quantize_layers(model, quantized)
        return model

    def quantize(self, mode=None, **kwargs):
        """`keras.Model.quantize` (its Dense layers), without a warning for each layer that has
        nothing to quantize. The quantized model saves to and loads from `.keras` files."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Layer .* does not have a `quantize` method")
            with _one_garbage_collection():
                super().quantize(mode, **kwargs)


def _quantized_layers(model):
    """{mode: [positions in `_flatten_layers` order]} of the model's quantized layers."""
    modes = {}
    for i, layer in enumerate(model._flatten_layers(include_self=False)):
        mode = getattr(layer, "quantization_mode", None)
        if mode:
            modes.setdefault(mode, []).append(i)
    return modes


def _quantize_layers(model, modes):
    """Quantizes the layers at the positions `_quantized_layers` wrote, so that the saved
    quantized variables load into them."""
    layers = list(model._flatten_layers(include_self=False))
    for positions in modes.values():
        for i in positions:
            if i >= len(layers) or not hasattr(layers[i], "quantize"):
                raise ValueError(f"quantized_layers: no quantizable layer at position {i} of this model")
    with _one_garbage_collection():
        for mode, positions in modes.items():
            for i in positions:
                layers[i].quantize(mode)


@contextlib.contextmanager
def _one_garbage_collection():
    """One full garbage collection at the end instead of one per replaced variable. A Keras
    layer's `quantize` collects after deleting each float kernel, and each of those passes visits
    every object in the process: with TensorFlow loaded, most of the time a ViT takes to quantize
    or to load quantized. The objects that exist before are frozen out of those passes
    (`gc.freeze`), unless the caller has frozen objects itself."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.collect()


class _Parts:
    """The layers of one ViT and the two ways of wiring them (plain, or with attention)."""

    def __init__(self, config, dtype):
        c, d = config, dtype
        if isinstance(d, str):
            try:
                keras.dtype_policies.get(d)
            except ValueError:
                raise ValueError(
                    f"unknown dtype policy {d!r}; use float32, mixed_bfloat16, mixed_float16, bfloat16 or float16."
                ) from None
        self.config = c
        self.normalization = (
            vit_layers.ImageNormalization(c.input_mean, c.input_std, dtype=d, name="normalization")
            if c.normalize_inputs
            else None
        )
        self.resnet = (
            vit_layers.ResNetStem(c.resnet_layers, c.resnet_width, c.resnet_numerics, dtype=d, name="resnet")
            if c.resnet_layers is not None
            else None
        )
        self.patch_embedding = vit_layers.PatchEmbedding(
            c.hidden_size, c.patch_size, return_grid=c.dynamic_image_size, dtype=d, name="patch_embedding"
        )
        # The patch grid that grid-shaped layers are built for; None: each call's.
        self.static_grid = None if c.dynamic_image_size else c.grid_size
        self.class_token = vit_layers.ClassToken(dtype=d, name="class_token") if c.num_class_tokens else None
        self.position_embedding = (
            vit_layers.PositionEmbedding(
                c.grid_size, c.num_position_prefix_tokens, c.posemb_interpolation, dtype=d, name="position_embedding"
            )
            if c.position_embedding
            else None
        )
        self.register_tokens = (
            vit_layers.RegisterTokens(c.num_register_tokens, c.num_class_tokens, dtype=d, name="register_tokens")
            if c.num_register_tokens
            else None
        )
        self.embedding_dropout = keras.layers.Dropout(c.dropout_rate, dtype=d, name="embedding_dropout")
        # The class token reads the patch tokens in the last block's attention, so the input
        # of the last block is the spatial map that class scores have gradients for.
        self.patch_grid = vit_layers.TokenGrid(self.static_grid, c.num_prefix_tokens, dtype=d, name="patch_grid")
        self.merge_patch_grid = vit_layers.MergeTokenGrid(c.num_prefix_tokens, dtype=d, name="merge_patch_grid")
        rope = None
        if c.rope_settings is not None:
            style, theta, reference = c.rope_settings
            rope = dict(
                style=style,
                grid_size=list(c.grid_size),
                num_prefix_tokens=c.num_prefix_tokens,
                theta=theta,
                reference_grid=list(reference),
            )
        self.blocks = [
            vit_layers.EncoderBlock(
                c.num_heads,
                c.mlp_dim,
                dropout_rate=c.dropout_rate,
                attention_dropout_rate=c.attention_dropout_rate,
                drop_path_rate=c.drop_path_rate * i / max(c.num_layers - 1, 1),  # linear schedule
                layer_scale_init=c.layer_scale_init,
                layer_norm_epsilon=c.layer_norm_epsilon,
                gelu_approximate=c.gelu_approximate,
                qkv_bias=c.qkv_bias,
                key_bias=c.key_bias,
                mlp_type=c.mlp_type,
                mlp_norm=c.mlp_norm,
                rope=rope,
                dtype=d,
                name=f"block_{i}",
            )
            for i in range(c.num_layers)
        ]
        self.encoder_norm = vit_layers.LayerNormalization(epsilon=c.layer_norm_epsilon, dtype=d, name="encoder_norm")
        if c.classifier == "map":
            self.pooling = vit_layers.AttentionPool(
                c.num_heads,
                c.mlp_dim,
                c.num_prefix_tokens,
                c.layer_norm_epsilon,
                c.gelu_approximate,
                dtype=d,
                name="attention_pool",
            )
        else:
            self.pooling = vit_layers.TokenPooling(c.classifier, c.num_prefix_tokens, dtype=d, name="pooling")
        self.pre_logits = (
            keras.layers.Dense(
                c.representation_size,
                activation="tanh",
                kernel_initializer=initializers.lecun_normal(),
                dtype=d,
                name="pre_logits",
            )
            if c.representation_size
            else None
        )
        # Zero head as in the reference; float32 so logits are float32 under mixed precision.
        self.classifier = (
            keras.layers.Dense(c.num_classes, kernel_initializer="zeros", dtype="float32", name="head")
            if c.num_classes
            else None
        )

    def encoder_layers(self):
        tokens = [self.class_token, self.position_embedding]  # the embedding's class slot after the token
        if self.config.no_embed_class:  # the embedding of the patches alone, before the class token
            tokens.reverse()
        layers = [self.normalization, self.resnet, self.patch_embedding, *(t for t in tokens if t is not None)]
        layers += [self.register_tokens, self.embedding_dropout, *self.blocks]
        return [layer for layer in layers if layer is not None]

    def embed(self, images):
        """images -> (tokens the first block reads, grid): `grid` is None, or for a model of
        `dynamic_image_size` the tensor whose shape gives the patch grid (see `PatchEmbedding`),
        which the layers after the patch embedding take as `grid`."""
        x, grid = images, None
        for layer in self.encoder_layers()[: -len(self.blocks)]:
            if layer is self.patch_embedding and self.static_grid is None:
                x, grid = layer(x)
            elif layer is self.position_embedding:
                x = layer(x, grid=grid)
            else:
                x = layer(x)
        return x, grid

    def encode(self, images, return_attention_scores=False):
        """images -> (final tokens, list of attention probabilities or None); the tokens are
        normalised unless the model normalises the pooled vector (`fc_norm`)."""
        x, grid = self.embed(images)
        probabilities = [] if return_attention_scores else None
        for block in self.blocks:
            if block is self.blocks[-1]:
                x = self.merge_patch_grid([x, self.patch_grid(x, grid=grid)])
            if return_attention_scores:
                x, p = block(x, return_attention_scores=True, grid=grid)
                probabilities.append(p)
            else:
                x = block(x, grid=grid)
        return self.final_tokens(x), probabilities

    def final_tokens(self, x):
        """The last block's tokens as the pooling reads them: normalised, unless `fc_norm`."""
        return x if self.config.fc_norm else self.encoder_norm(x)

    def pooled(self, tokens):
        """The embedding the head reads, from `final_tokens`: pooled, normalised if `fc_norm`,
        through the pre-logits layer if any."""
        x = self.pooling(tokens)
        if self.config.fc_norm:
            x = self.encoder_norm(x)
        return self.pre_logits(x) if self.pre_logits is not None else x

    def head(self, tokens):
        x = self.pooled(tokens)
        return self.classifier(x) if self.classifier is not None else x


def _normalized(normalization, overrides):
    """Config `overrides` with the input statistics of `normalization` (None: none) under them."""
    return overrides if normalization is None else {**normalization_fields(normalization), **overrides}


def _classes_named(class_names, overrides):
    """Config `overrides` with `num_classes` set to the count of `class_names` when they are given
    and it is not."""
    if class_names is None or "num_classes" in overrides:
        return overrides
    if isinstance(class_names, (str, bytes)):
        raise ValueError(f"`class_names` must be a list of strings; got {class_names!r:.80}.")
    return {**overrides, "num_classes": len(class_names)}


def _check_class_names(class_names, num_classes):
    """`class_names` as a tuple of strings, one per class (None stays None); a ValueError otherwise."""
    if class_names is None:
        return None
    if isinstance(class_names, (str, bytes)) or not all(isinstance(n, str) for n in class_names):
        raise ValueError(f"`class_names` must be a list of strings; got {class_names!r:.80}.")
    names = tuple(class_names)
    if len(names) != num_classes:
        raise ValueError(f"{len(names)} class names for a model of {num_classes} classes.")
    return names


def _input_shape(x):
    """The image batch shape of a `fit`/`evaluate`/`predict` input: an array's (also alone in a
    list or under the input's name, "images"), or a tf.data dataset's element spec (the images
    of an `(images, labels)` pair); None when unknown."""
    spec = getattr(x, "element_spec", None)
    if spec is not None:
        x = spec[0] if isinstance(spec, (tuple, list)) else spec
    if isinstance(x, (list, tuple)) and len(x) == 1:
        x = x[0]
    if isinstance(x, dict) and list(x) == ["images"]:
        x = x["images"]
    shape = getattr(x, "shape", None)
    if shape is None or getattr(shape, "rank", 0) is None:  # TensorFlow's shape of unknown rank
        return None
    return tuple(shape)


def input_shape(config):
    """The `(height, width, channels)` of a model's input: height and width None with
    `dynamic_image_size`."""
    size = (None, None) if config.dynamic_image_size else config.image_size
    return (*size, config.channels)


def check_images(shape, config):
    """Clear errors for images that do not fit the model (static dimensions only)."""
    if shape is None:
        return
    shape = tuple(shape)
    if len(shape) != 4:
        raise ValueError(f"expected a batch of images (batch, height, width, channels); got shape {shape}.")
    if shape[3] is not None and shape[3] != config.channels:
        fix = "convert the images to RGB" if config.channels == 3 else f"give {config.channels}-channel images"
        raise ValueError(
            f"the model expects {config.channels}-channel images but got {shape[3]} channels; "
            f"{fix}, or build the model with channels={shape[3]}."
        )
    size = shape[1:3]
    if getattr(config, "dynamic_image_size", False):
        multiple = config.image_multiple
        if any(s is not None and s % m for s, m in zip(size, multiple)):
            raise ValueError(
                f"the model takes images whose height and width are multiples of {multiple[0]}x{multiple[1]} "
                f"but got {size[0]}x{size[1]}; resize or crop the images to such a size."
            )
        return
    if None not in size and tuple(size) != config.image_size:
        raise ValueError(
            f"the model was built for {config.image_size[0]}x{config.image_size[1]} images but got "
            f"{size[0]}x{size[1]}; resize the images, or use model.resized({tuple(size)}) to get a "
            f"model for that size with resampled position embeddings."
        )


@keras.saving.register_keras_serializable(package="keras_vit")
class ViTFeatures(_ImagesChecked, keras.Model):
    """The functional model `ViT.feature_model` returns: images -> a dict of features, checked
    as a ViT checks its images."""

    def _image_spec(self):
        shape = self.inputs[0].shape
        size = tuple(shape[1:3])  # None: a model of `dynamic_image_size` (its patch embedding checks)
        return types.SimpleNamespace(
            image_size=size, channels=shape[3], dynamic_image_size=None in size, image_multiple=(1, 1)
        )


class _AttentionProbabilities(_ImagesChecked, keras.Model):
    """Runs the encoder of a ViT's layers with attention outputs. (A functional graph cannot
    reuse layers whose first call returned a different structure, hence a subclass.)"""

    def __init__(self, parts, **kwargs):
        super().__init__(**kwargs)
        self._parts = parts
        self.shared_layers = parts.encoder_layers()  # tracked, so weights are visible

    def _image_spec(self):
        return self._parts.config

    def call(self, images):
        check_images(images.shape, self._parts.config)
        return self._parts.encode(images, return_attention_scores=True)[1]


def count_params(model):
    """Total number of weights of a model (trainable and not)."""
    return int(sum(np.prod(w.shape) for w in model.weights))
