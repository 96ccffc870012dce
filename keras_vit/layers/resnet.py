"""The BiT-style ResNet stem of the hybrid ViT (paper section 3.1).

Weight-standardised convolutions with GroupNorm, bottleneck units (post-activation, as in
the reference `models_resnet.py`), a 7x7/2 root with 3x3/2 max pooling, first stage at
stride 1 and every later stage at stride 2: total stride 16 with stages (3, 4, 9).
"""

import keras
from keras import ops

GROUPS = 32
GROUP_NORM_EPSILON = 1e-6  # flax.linen.GroupNorm default, used by the reference
STD_CONV_EPSILON = 1e-5


@keras.saving.register_keras_serializable(package="keras_vit")
class StdConv2D(keras.layers.Conv2D):
    """Conv2D whose kernel is standardised per output filter: (w - mean) / (std + eps)."""

    def __init__(self, *args, epsilon=STD_CONV_EPSILON, **kwargs):
        kwargs.setdefault("use_bias", False)
        kwargs.setdefault("padding", "same")
        super().__init__(*args, **kwargs)
        self.epsilon = float(epsilon)

    def convolution_op(self, inputs, kernel):
        mean = ops.mean(kernel, axis=(0, 1, 2), keepdims=True)
        std = ops.std(kernel, axis=(0, 1, 2), keepdims=True)
        return super().convolution_op(inputs, (kernel - mean) / (std + self.epsilon))

    def get_config(self):
        return {**super().get_config(), "epsilon": self.epsilon}


def _group_norm(name, policy, zero_scale=False):
    return keras.layers.GroupNormalization(
        GROUPS,
        epsilon=GROUP_NORM_EPSILON,
        gamma_initializer="zeros" if zero_scale else "ones",
        dtype=policy,
        name=name,
    )


@keras.saving.register_keras_serializable(package="keras_vit")
class BottleneckUnit(keras.layers.Layer):
    """1x1 -> 3x3 (strided) -> 1x1 (4x width), GroupNorm after each, projection shortcut."""

    def __init__(self, filters, strides=1, **kwargs):
        super().__init__(**kwargs)
        self.filters = int(filters)
        self.strides = int(strides)
        p = self.dtype_policy
        self.conv1 = StdConv2D(self.filters, 1, dtype=p, name="conv1")
        self.gn1 = _group_norm("gn1", p)
        self.conv2 = StdConv2D(self.filters, 3, strides=self.strides, dtype=p, name="conv2")
        self.gn2 = _group_norm("gn2", p)
        self.conv3 = StdConv2D(4 * self.filters, 1, dtype=p, name="conv3")
        self.gn3 = _group_norm("gn3", p, zero_scale=True)
        self.conv_proj = self.gn_proj = None

    def build(self, input_shape):
        if input_shape[-1] != 4 * self.filters or self.strides != 1:
            p = self.dtype_policy
            self.conv_proj = StdConv2D(4 * self.filters, 1, strides=self.strides, dtype=p, name="conv_proj")
            self.gn_proj = _group_norm("gn_proj", p)
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
        return {**super().get_config(), "filters": self.filters, "strides": self.strides}


@keras.saving.register_keras_serializable(package="keras_vit")
class ResNetStem(keras.layers.Layer):
    """Root conv + GroupNorm + ReLU + max pool, then the bottleneck stages."""

    def __init__(self, stage_sizes=(3, 4, 9), width=64, **kwargs):
        super().__init__(**kwargs)
        self.stage_sizes = tuple(int(n) for n in stage_sizes)
        self.width = int(width)
        p = self.dtype_policy
        self.conv_root = StdConv2D(self.width, 7, strides=2, dtype=p, name="conv_root")
        self.gn_root = _group_norm("gn_root", p)
        self.pool = keras.layers.MaxPooling2D(3, strides=2, padding="same", dtype=p)
        self.units = [
            BottleneckUnit(
                self.width * 2**stage,
                strides=2 if (stage > 0 and unit == 0) else 1,
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

    def compute_output_shape(self, input_shape):
        shape = self.pool.compute_output_shape(self.conv_root.compute_output_shape(input_shape))
        for unit in self.units:
            shape = unit.compute_output_shape(shape)
        return shape

    def get_config(self):
        return {**super().get_config(), "stage_sizes": list(self.stage_sizes), "width": self.width}
