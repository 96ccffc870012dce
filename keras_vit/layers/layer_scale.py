"""LayerScale (CaiT): a learned per-channel scale on each residual branch."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class LayerScale(keras.layers.Layer):
    """Multiplies the last axis by `gamma`, initialised to `init_value`."""

    def __init__(self, init_value=1e-5, **kwargs):
        super().__init__(**kwargs)
        self.init_value = float(init_value)

    def build(self, input_shape):
        self.gamma = self.add_weight(
            name="gamma", shape=(input_shape[-1],), initializer=keras.initializers.Constant(self.init_value)
        )

    def call(self, x):
        return x * ops.cast(self.gamma, x.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "init_value": self.init_value}
