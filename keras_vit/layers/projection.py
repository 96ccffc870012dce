"""A block's Dense or convolution applied to its input, with TensorFlow training's bias gradients."""

import keras


def project(layer, x, training):
    """`layer(x)`; in training on TensorFlow through `keras_vit.tf_kernels.project`, which sums
    the bias gradient with float32 accumulation (TensorFlow's CPU `BiasAddGrad` sums bfloat16
    in bfloat16)."""
    if training and keras.backend.backend() == "tensorflow":
        from keras_vit import tf_kernels

        return tf_kernels.project(layer, x)
    return layer(x)
