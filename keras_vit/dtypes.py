"""The half-precision float dtypes, one test for the layers that treat them apart."""

import keras

HALF_PRECISION = ("float16", "bfloat16")


def is_half(dtype):
    """Whether `dtype` (a name, or a NumPy or backend dtype) is float16 or bfloat16."""
    return keras.backend.standardize_dtype(dtype) in HALF_PRECISION
