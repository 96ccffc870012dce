"""Whether the layers are being traced for a frozen TensorFlow graph
(`keras_vit.tf_predict.frozen_forward`: the bfloat16 `ViT.predict` on a CPU and the frozen
SavedModel). There a half-precision LayerNorm is written in the form TensorFlow's oneDNN graph
rewrite runs as one kernel (`tf_predict.layer_norm`); everywhere else, the LiteRT conversion
included, the layers keep their plain ops."""

import contextlib
import contextvars

from keras_vit.dtypes import is_half

_TRACING = contextvars.ContextVar("keras_vit_frozen_graph", default=False)


def tracing():
    """True while `traced()` is active in this thread."""
    return _TRACING.get()


def half_inference(x, training):
    """Whether a layer called on `x` traces its frozen form: inside `traced()`, for inference,
    with `x` in float16 or bfloat16."""
    return tracing() and not training and is_half(x.dtype)


@contextlib.contextmanager
def traced():
    """The layers called inside trace their frozen-graph forms."""
    token = _TRACING.set(True)
    try:
        yield
    finally:
        _TRACING.reset(token)
