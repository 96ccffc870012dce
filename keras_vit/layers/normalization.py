"""Pixel normalisation inside the model, so callers feed raw [0, 255] pixels."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_vit")
class ImageNormalization(keras.layers.Layer):
    """Computes `(x - mean) / std` per channel; `mean`/`std` are in pixel units."""

    def __init__(self, mean, std, **kwargs):
        super().__init__(**kwargs)
        self.mean = tuple(float(v) for v in mean)
        self.std = tuple(float(v) for v in std)
        if len(self.mean) != len(self.std) or any(s == 0 for s in self.std):
            raise ValueError(f"`mean` and `std` need one non-zero value per channel; got {mean}, {std}.")

    def call(self, images):
        images = ops.cast(images, self.compute_dtype)
        mean = ops.convert_to_tensor(self.mean, self.compute_dtype)
        scale = ops.convert_to_tensor([1.0 / s for s in self.std], self.compute_dtype)
        return (images - mean) * scale

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "mean": list(self.mean), "std": list(self.std)}
