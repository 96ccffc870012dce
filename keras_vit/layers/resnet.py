"""The BiT-style ResNet stem of the hybrid ViT (paper section 3.1).

Weight-standardised convolutions with GroupNorm, bottleneck units (post-activation, as in
the reference `models_resnet.py`), a 7x7/2 root with 3x3/2 max pooling, first stage at
stride 1 and every later stage at stride 2: total stride 16 with stages (3, 4, 9).
"""

import keras
from keras import ops

from keras_vit import initializers
from keras_vit.layers.group_normalization import GroupNormalization
from keras_vit.layers.projection import empty_output, is_empty_on_tensorflow
from keras_vit.names import RESNET_GROUPS

# Normalisation constants: the official Flax code (GroupNorm epsilon 1e-6, kernels divided by
# std + 1e-5) and timm's port of it (GroupNorm 1e-5, kernels divided by sqrt(var + 1e-8)).
# The differences reach 1e-4 in the logits; a model follows the code its weights came from.
NUMERICS = {
    "official": dict(group_norm_epsilon=1e-6, std_epsilon=1e-5, epsilon_in_sqrt=False),
    "timm": dict(group_norm_epsilon=1e-5, std_epsilon=1e-8, epsilon_in_sqrt=True),
}


@keras.saving.register_keras_serializable(package="keras_vit")
class StdConv2D(keras.layers.Conv2D):
    """Conv2D whose kernel is standardised per output filter: (w - mean) / (std + eps), or
    (w - mean) / sqrt(var + eps) with `epsilon_in_sqrt=True`. Under mixed precision the kernel
    is standardised in its own dtype (float32) and the result cast, once, for the convolution."""

    def __init__(self, *args, epsilon=1e-5, epsilon_in_sqrt=False, **kwargs):
        kwargs.setdefault("use_bias", False)
        kwargs.setdefault("padding", "same")
        super().__init__(*args, **kwargs)
        self.epsilon = float(epsilon)
        self.epsilon_in_sqrt = bool(epsilon_in_sqrt)
        self.autocast = False  # the variable is read as stored; `convolution_op` casts

    def standardise(self, kernel):
        """The kernel the convolution applies: `kernel` standardised per output filter."""
        mean = ops.mean(kernel, axis=(0, 1, 2), keepdims=True)
        var = ops.var(kernel, axis=(0, 1, 2), keepdims=True)
        scale = ops.sqrt(var + self.epsilon) if self.epsilon_in_sqrt else ops.sqrt(var) + self.epsilon
        return (kernel - mean) / scale

    def convolution_op(self, inputs, kernel):
        if is_empty_on_tensorflow(inputs):
            return empty_output(self, inputs)
        kernel = ops.cast(self.standardise(kernel), self.compute_dtype)
        return super().convolution_op(ops.cast(inputs, self.compute_dtype), kernel)

    def get_config(self):
        return {**super().get_config(), "epsilon": self.epsilon, "epsilon_in_sqrt": self.epsilon_in_sqrt}


def _std_conv(filters, kernel_size, numerics, name, policy, strides=1):
    n = NUMERICS[numerics]
    return StdConv2D(
        filters,
        kernel_size,
        strides=strides,
        kernel_initializer=initializers.glorot_uniform(),
        epsilon=n["std_epsilon"],
        epsilon_in_sqrt=n["epsilon_in_sqrt"],
        dtype=policy,
        name=name,
    )


def _group_norm(name, policy, numerics, zero_scale=False):
    return GroupNormalization(
        RESNET_GROUPS,
        epsilon=NUMERICS[numerics]["group_norm_epsilon"],
        gamma_initializer="zeros" if zero_scale else "ones",
        dtype=policy,
        name=name,
    )


@keras.saving.register_keras_serializable(package="keras_vit")
class BottleneckUnit(keras.layers.Layer):
    """1x1 -> 3x3 (strided) -> 1x1 (4x width), GroupNorm after each, projection shortcut."""

    def __init__(self, filters, strides=1, numerics="official", **kwargs):
        super().__init__(**kwargs)
        self.filters = int(filters)
        self.strides = int(strides)
        self.numerics = _check_numerics(numerics)
        p, n = self.dtype_policy, self.numerics
        self.conv1 = _std_conv(self.filters, 1, n, "conv1", p)
        self.gn1 = _group_norm("gn1", p, n)
        self.conv2 = _std_conv(self.filters, 3, n, "conv2", p, strides=self.strides)
        self.gn2 = _group_norm("gn2", p, n)
        self.conv3 = _std_conv(4 * self.filters, 1, n, "conv3", p)
        self.gn3 = _group_norm("gn3", p, n, zero_scale=True)
        self.conv_proj = self.gn_proj = None

    def build(self, input_shape):
        if input_shape[-1] != 4 * self.filters or self.strides != 1:
            p, n = self.dtype_policy, self.numerics
            self.conv_proj = _std_conv(4 * self.filters, 1, n, "conv_proj", p, strides=self.strides)
            self.gn_proj = _group_norm("gn_proj", p, n)
        shape = tuple(input_shape)
        for conv, norm in ((self.conv1, self.gn1), (self.conv2, self.gn2), (self.conv3, self.gn3)):
            conv.build(shape)
            shape = conv.compute_output_shape(shape)
            norm.build(shape)
        if self.conv_proj is not None:
            self.conv_proj.build(input_shape)
            self.gn_proj.build(self.conv_proj.compute_output_shape(input_shape))

    def call(self, x):
        residual = x if self.conv_proj is None else self.gn_proj(self.conv_proj(x))
        y = ops.relu(self.gn1(self.conv1(x)))
        y = ops.relu(self.gn2(self.conv2(y)))
        y = self.gn3(self.conv3(y))
        return ops.relu(residual + y)

    def compute_output_shape(self, input_shape):
        return self.conv3.compute_output_shape(self.conv2.compute_output_shape(input_shape))

    def get_config(self):
        return {**super().get_config(), "filters": self.filters, "strides": self.strides, "numerics": self.numerics}


@keras.saving.register_keras_serializable(package="keras_vit")
class ResNetStem(keras.layers.Layer):
    """Root conv + GroupNorm + ReLU + max pool, then the bottleneck stages."""

    def __init__(self, stage_sizes=(3, 4, 9), width=64, numerics="official", **kwargs):
        super().__init__(**kwargs)
        self.stage_sizes = tuple(int(n) for n in stage_sizes)
        self.width = int(width)
        self.numerics = _check_numerics(numerics)
        p = self.dtype_policy
        self.conv_root = _std_conv(self.width, 7, self.numerics, "conv_root", p, strides=2)
        self.gn_root = _group_norm("gn_root", p, self.numerics)
        self.pool = keras.layers.MaxPooling2D(3, strides=2, padding="same", dtype=p)
        self.units = [
            BottleneckUnit(
                self.width * 2**stage,
                strides=2 if (stage > 0 and unit == 0) else 1,
                numerics=self.numerics,
                dtype=p,
                name=f"block{stage + 1}_unit{unit + 1}",
            )
            for stage, size in enumerate(self.stage_sizes)
            for unit in range(size)
        ]

    def build(self, input_shape):
        self.conv_root.build(input_shape)
        shape = self.conv_root.compute_output_shape(input_shape)
        self.gn_root.build(shape)
        shape = self.pool.compute_output_shape(shape)
        for unit in self.units:
            unit.build(shape)
            shape = unit.compute_output_shape(shape)

    def call(self, images):
        x = self.pool(ops.relu(self.gn_root(self.conv_root(images))))
        for unit in self.units:
            x = unit(x)
        return x

    def convolutions(self):
        """Every weight-standardised convolution of the stem, root first."""
        units = [(u.conv1, u.conv2, u.conv3) + ((u.conv_proj,) if u.conv_proj is not None else ()) for u in self.units]
        return [self.conv_root] + [conv for convs in units for conv in convs]

    def compute_output_shape(self, input_shape):
        shape = self.pool.compute_output_shape(self.conv_root.compute_output_shape(input_shape))
        for unit in self.units:
            shape = unit.compute_output_shape(shape)
        return shape

    def get_config(self):
        return {
            **super().get_config(),
            "stage_sizes": list(self.stage_sizes),
            "width": self.width,
            "numerics": self.numerics,
        }


def _check_numerics(numerics):
    if numerics not in NUMERICS:
        raise ValueError(f"ResNet numerics must be one of {tuple(NUMERICS)}; got {numerics!r}.")
    return numerics
