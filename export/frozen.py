"""Frozen inference graphs: a Keras model's forward with its weights folded in as constants."""

import numpy as np
import tensorflow as tf
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from keras_vit.export.source import ExportError, require_tensorflow_backend

# A GraphDef is a protocol buffer, which cannot exceed 2 GiB; leave room for the ops.
MAX_FROZEN_BYTES = 2**31 - 2**27


def freeze(model):
    """The inference forward of a single-input Keras model (TensorFlow backend) as a
    TensorFlow graph that holds the weights as constants: `frozen(images)` returns the model's
    output tensor for a batch (tensor or array) of any size; it can be called inside a
    `tf.function` and saved in a SavedModel.

    What it buys on CPU: the mixed-precision weight casts are folded into half-precision
    constants (`fold_weight_casts`; TensorFlow's graph optimiser folds the remaining weight-only
    arithmetic when it runs the graph), and its oneDNN matmuls ran 3% (float32) to 7% (bfloat16)
    faster on constant weights (why was not traced further). ViT-S/16 and B/16 on 2 cores: +3-5%
    images/s in float32 and +3-11% in mixed_bfloat16 against the model's `tf.function`; outputs
    are the same (docs/benchmarks.md).

    Raises ExportError for models with several inputs or weights over the 2 GiB graph limit
    (ViT-H/14 in float32).
    """
    require_tensorflow_backend()
    if len(model.inputs or []) != 1:
        raise ExportError(f"freezing needs a model with one image input; {model.name} has {len(model.inputs or [])}.")
    if not fits(model):
        raise ExportError(
            f"{model.name} holds {_weight_bytes(model) / 2**30:.1f} GiB of weights; a frozen graph is limited to "
            "2 GiB (export it unfrozen)."
        )
    spec = model.inputs[0]
    forward = tf.function(lambda images: model(images, training=False))
    concrete = forward.get_concrete_function(tf.TensorSpec(spec.shape, spec.dtype, "images"))
    frozen = convert_variables_to_constants_v2(concrete)
    graph_def, folded = fold_weight_casts(frozen.graph.as_graph_def(), [frozen.outputs[0].name])
    if folded:
        graph = tf.compat.v1.wrap_function(lambda: tf.graph_util.import_graph_def(graph_def, name=""), [])
        inputs, outputs = (graph.graph.as_graph_element(t.name) for t in (frozen.inputs[0], frozen.outputs[0]))
        frozen = graph.prune(inputs, [outputs])

    def call(images):
        return frozen(tf.convert_to_tensor(images, spec.dtype))[0]

    return call


def fits(model):
    """Whether `model`'s weights fit a frozen graph (`MAX_FROZEN_BYTES`, as stored in the model)."""
    return _weight_bytes(model) <= MAX_FROZEN_BYTES


def _weight_bytes(model):
    return sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in model.weights)


def fold_weight_casts(graph_def, outputs):
    """`(graph_def, count)`: a copy of a frozen `graph_def` in which every cast of a float32
    constant (through `Identity` nodes: the weights' former reads) to bfloat16 or float16 is that
    constant cast once, so the graph holds those weights in half precision, and nodes that
    `outputs` (tensor names) no longer need are dropped. Mixed-precision models cast their
    float32 weights for every matmul; folded, the stored graph is about half the size and each
    call skips the casts. The values are TensorFlow's own cast, so the outputs stay the same
    bit for bit."""
    nodes = {node.name: node for node in graph_def.node}

    def source(name):
        node = nodes.get(name.split(":")[0].lstrip("^"))
        while node is not None and node.op == "Identity" and len(node.input) == 1:
            node = nodes.get(node.input[0].split(":")[0])
        return node

    half = {tf.bfloat16.as_datatype_enum, tf.float16.as_datatype_enum}
    out, count = tf.compat.v1.GraphDef(), 0
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        constant = source(node.input[0]) if node.op == "Cast" and len(node.input) == 1 else None
        if (
            constant is not None
            and constant.op == "Const"
            and constant.attr["dtype"].type == tf.float32.as_datatype_enum
            and node.attr["DstT"].type in half
        ):
            dtype = tf.dtypes.as_dtype(node.attr["DstT"].type)
            value = tf.cast(tf.make_ndarray(constant.attr["value"].tensor), dtype).numpy()
            node = tf.compat.v1.NodeDef(name=node.name, op="Const", device=node.device)
            node.attr["dtype"].type = dtype.as_datatype_enum
            node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value, dtype))
            count += 1
        out.node.append(node)
    # Function graphs order every former variable read before the outputs with control edges;
    # on constants they order nothing, and they would keep the float32 copies alive.
    for node in out.node:
        inputs = [i for i in node.input if not (i.startswith("^") and _is_constant(source(i)))]
        del node.input[:]
        node.input.extend(inputs)
    kept = {node.name: node for node in out.node}
    needed, todo = set(), [name.split(":")[0] for name in outputs]
    while todo:
        name = todo.pop()
        if name not in needed and name in kept:
            needed.add(name)
            todo += [i.split(":")[0].lstrip("^") for i in kept[name].input]
    pruned = [node for node in out.node if node.name in needed or node.op == "Placeholder"]
    del out.node[:]
    out.node.extend(pruned)
    return out, count


def _is_constant(node):
    return node is not None and node.op == "Const"
