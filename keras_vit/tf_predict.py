"""Inference on a TensorFlow CPU with the weights as graph constants: the forward that
`keras-vit export --freeze` serves, and `ViT.predict` / `predict_on_batch` for models that
compute in bfloat16 (`FrozenPredict`).

TensorFlow hands a projection on variable weights (MatMul + BiasAdd, fused) to oneDNN as an
inner product on the weights' plain layout, which oneDNN runs with its `gemm:jit` kernel: on an
AMX CPU (Intel Xeon, 2 cores) that kernel took 779 ms of a 1,191 ms ViT-S/16 bf16 batch of 32
and never touches the AMX tiles. On constant weights TensorFlow lets oneDNN lay them out once
for its `brgemm` AMX kernels (126 ms for fc1 and fc2, whole batch 464 ms); the mixed-precision
weight casts are folded into bf16 constants as well, and the half-precision LayerNorms are
traced as the subgraph that oneDNN runs as one kernel (`layer_norm`; docs/performance.md).
Imported only on the TensorFlow backend.
"""

import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.framework import convert_to_constants

from keras_vit.layers import frozen_graph

# A GraphDef is a protocol buffer, which cannot exceed 2 GiB; leave room for the ops.
MAX_FROZEN_BYTES = 2**31 - 2**27
# The epsilon of the `_MklLayerNorm` kernel TensorFlow's graph rewrite makes of `layer_norm`.
_MKL_LAYER_NORM_EPSILON = 1e-3


def frozen_forward(model):
    """The inference forward of a single-input Keras model (TensorFlow backend) as a graph that
    holds the weights as constants, arithmetic on weights alone computed once
    (`fold_weight_arithmetic`: a hybrid's standardised kernels) and half-precision casts of
    float32 weights folded into half-precision constants (`fold_weight_casts`):
    `forward(images)` returns the model's output tensor for a batch (tensor or array, any size
    and real dtype); it can be called inside a `tf.function` and saved in a SavedModel, and
    `forward.graph` is its graph. keras_vit's layers are traced in their frozen-graph forms
    (`keras_vit.layers.frozen_graph`). The caller checks `fits(model)` first.

    TensorFlow keeps several copies of a graph's constants once the function has run (its
    function library, the instantiated graph, the kernels'); the forward keeps none of its own:
    the frozen GraphDef is imported straight into the function's graph and then dropped (ViT-B/16
    in mixed_bfloat16: 2.0 GiB above the model after the first call, against 2.3 GiB through an
    imported and then pruned function)."""
    spec = model.inputs[0]
    forward = tf.function(lambda images: model(images, training=False))
    with frozen_graph.traced():
        concrete = forward.get_concrete_function(tf.TensorSpec(spec.shape, spec.dtype, "images"))
    graph_def = _constant_graph_def(concrete)
    feed, fetch = concrete.inputs[0].name, concrete.outputs[0].name
    # `wrap_function` keeps the Python function: the GraphDef goes once it has been imported
    pending = [fold_weight_casts(fold_weight_arithmetic(graph_def), [fetch])]
    del graph_def

    def imported(batch):
        (output,) = tf.graph_util.import_graph_def(
            pending.pop(), input_map={feed: batch}, return_elements=[fetch], name=""
        )
        return output

    frozen = tf.compat.v1.wrap_function(imported, [tf.TensorSpec(spec.shape, spec.dtype)])

    def call(images):
        return frozen(tf.cast(images, spec.dtype))

    call.graph = frozen.graph
    return call


def _constant_graph_def(concrete):
    """The GraphDef of `concrete` with its variables read as constants. TensorFlow 2.21's private
    helpers give it without the function `convert_variables_to_constants_v2` would build from the
    graph before the casts are folded (3.4 of 8 s for ViT-S/16); a TensorFlow without them takes
    the public function's path."""
    replace = getattr(convert_to_constants, "_replace_variables_by_constants", None)
    data = getattr(convert_to_constants, "_FunctionConverterDataInEager", None)
    if replace is None or data is None:
        return convert_to_constants.convert_variables_to_constants_v2(concrete).graph.as_graph_def()
    graph_def, _ = replace(converter_data=data(func=concrete, lower_control_flow=True, aggressive_inlining=False))
    return graph_def


def fits(model):
    """Whether `model`'s weights fit a frozen graph (`MAX_FROZEN_BYTES`, as stored in the model)."""
    return weight_bytes(model) <= MAX_FROZEN_BYTES


def weight_bytes(model):
    return sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in model.weights)


def fold_weight_casts(graph_def, outputs):
    """A copy of a frozen `graph_def` in which every cast of a float32
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
    out = tf.compat.v1.GraphDef()
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
            node = _constant(node, tf.cast(tf.make_ndarray(constant.attr["value"].tensor), dtype).numpy())
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
    return out


def gelu_after_projection(x, approximate):
    """The GELU of a projection's output `x`, its ops named under the projection's name scope
    when traced in a graph. TensorFlow's graph optimizer fuses MatMul + BiasAdd + GELU into one
    oneDNN kernel only when the GELU's op names start with the MatMul's scope: Keras names them
    `.../mlp/fc1/MatMul` and `.../mlp/Gelu/...`, which it fused for the exact GELU but not for
    the tanh one (SigLIP's: eleven ops over fc1's output, a third of SigLIP-B/16's
    mixed_bfloat16 forward on 2 AMX Xeon cores; docs/performance.md)."""
    op = getattr(x, "op", None)  # None for eager tensors and Keras's symbolic ones
    if op is None:
        return keras.activations.gelu(x, approximate=approximate)
    with tf.name_scope(op.name.rsplit("/", 1)[0] + "/"):  # "/": that scope itself, not a new one
        return keras.activations.gelu(x, approximate=approximate)


def layer_norm(x, gamma, beta, epsilon):
    """LayerNorm of half-precision `x` (rank 2 or 3) over its last axis, computed in float32, as
    the subgraph TensorFlow's oneDNN graph rewrite replaces by one `_MklLayerNorm` kernel on
    constant `gamma` and `beta` (its "common norm" pattern): `x * s + (beta - s * mean)` with
    `s = rsqrt(var + epsilon) * gamma`. On ViT-S/16 (batch 32, 2 AMX Xeon cores) that kernel
    took 0.7 ms a LayerNorm where the ten element-wise ops took 6.

    TensorFlow 2.21's rewrite gives the kernel its default epsilon, 1e-3, whatever the pattern
    adds: `x` is scaled by `sqrt(1e-3 / epsilon)` first and 1e-3 added, which is the same
    LayerNorm (the mean and deviation scale with `x`). The pattern is matched on inputs in a
    fixed order, and TensorFlow's optimizer first sorts the inputs of commutative ops by name:
    the names below (within the layer's scope) keep each in the matched place; the reduction
    axis must be positive. A `beta` of zeros (every freshly built model's) would be folded away
    by the optimizer (`0 - y` becomes `Neg`), which breaks the pattern and ran ViT-S/16's 25
    LayerNorms as separate ops, about 190 ms a batch: so the smallest normal float32 is added to
    `beta`, which leaves every nonzero value as it is and changes an output by at most that.
    Where nothing fuses (no oneDNN), the same ops run one by one."""
    axis = len(x.shape) - 1
    x = tf.multiply(tf.cast(x, tf.float32, name=".0cast"), (_MKL_LAYER_NORM_EPSILON / epsilon) ** 0.5, name=".1input")
    gamma = tf.cast(gamma, tf.float32)
    beta = tf.cast(beta, tf.float32) + np.finfo(np.float32).tiny
    mean = tf.reduce_mean(x, axis=axis, keepdims=True, name=".4mean")
    var = tf.reduce_mean(tf.math.squared_difference(x, mean), axis=axis, keepdims=True, name=".2var")
    rstd = tf.math.rsqrt(tf.add(var, _MKL_LAYER_NORM_EPSILON, name=".5add"), name=".2rsqrt")
    scale = tf.multiply(rstd, gamma, name=".3scale")
    shift = tf.subtract(beta, tf.multiply(scale, mean), name=".7sub")
    return tf.add(tf.multiply(x, scale, name=".6mul"), shift, name=".8out")


# Element-wise and reduction ops that the layers apply to weights alone (a StdConv2D's
# standardisation, a LayerNorm's shifted beta): on constants their result is a constant.
_ARITHMETIC = frozenset(
    ("Mean", "Sub", "SquaredDifference", "Square", "AddV2", "Add", "Mul", "RealDiv", "Rsqrt", "Sqrt", "Neg")
)
# Ops that pass a constant on unchanged in value (their result is constant too).
_PASSING = frozenset(("Identity", "Cast", "Reshape", "ExpandDims", "Squeeze"))


def fold_weight_arithmetic(graph_def):
    """A copy of a frozen `graph_def` in which arithmetic on constants alone (`_ARITHMETIC`,
    e.g. a ResNet kernel's standardisation and the cast of its result) is replaced by its
    result, computed once here by TensorFlow's own kernels. The stored graph then holds each
    standardised kernel once, in the dtype the convolution reads (bf16 under mixed precision,
    half the float32 kernel), instead of the raw float32 kernel and the ops that TensorFlow's
    optimizer would fold on the first call anyway. Casts and reads of plain weights are left to
    `fold_weight_casts`, which casts them one by one (run through a Session here, every weight of
    a model would be held twice); a graph without such arithmetic comes back unchanged."""
    nodes = {node.name: node for node in graph_def.node}
    constant, computed = {}, {}  # node name -> whether its value is constant / has arithmetic in it

    def data_inputs(node):
        return [i.split(":")[0] for i in node.input if not i.startswith("^")]

    def visit(name):
        # Iterative post-order: graphs are deep (hundreds of ops on the data path), and a lowered
        # while loop is a cycle (NextIteration -> Merge), whose ops are never constant.
        todo, visiting = [name], set()
        while todo:
            node = nodes[todo[-1]]
            visiting.add(node.name)
            pending = [i for i in data_inputs(node) if i not in constant and i not in visiting]
            if pending:
                todo += pending
                continue
            todo.pop()
            visiting.discard(node.name)
            inputs = data_inputs(node)
            if node.op == "Const":
                constant[node.name], computed[node.name] = True, False
            elif (
                inputs
                and (node.op in _ARITHMETIC or node.op in _PASSING)
                and all(constant.get(i, False) for i in inputs)
            ):
                constant[node.name] = True
                computed[node.name] = node.op in _ARITHMETIC or any(computed[i] for i in inputs)
            else:
                constant[node.name], computed[node.name] = False, False

    for name in nodes:
        visit(name)
    # The computed constants a non-constant op reads: each becomes one Const node.
    frontier = sorted(
        {i for node in graph_def.node if not constant[node.name] for i in data_inputs(node) if computed[i]}
    )
    if not frontier:
        return graph_def
    needed, todo = set(), list(frontier)
    while todo:
        name = todo.pop()
        if name not in needed:
            needed.add(name)
            todo += data_inputs(nodes[name])
    subgraph = tf.compat.v1.GraphDef()
    subgraph.versions.CopyFrom(graph_def.versions)
    for node in graph_def.node:
        if node.name in needed:
            copy = subgraph.node.add()
            copy.CopyFrom(node)
            del copy.input[:]
            copy.input.extend(i for i in node.input if not i.startswith("^"))
    with tf.Graph().as_default() as graph:
        tf.graph_util.import_graph_def(subgraph, name="")
        with tf.compat.v1.Session(graph=graph) as session:
            values = session.run([f"{name}:0" for name in frontier])
    folded = dict(zip(frontier, values))
    out = tf.compat.v1.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        out.node.append(_constant(node, folded[node.name]) if node.name in folded else node)
    return out


def _constant(node, value):
    """A Const node holding the array `value` in the place (name, device) of `node`."""
    dtype = tf.dtypes.as_dtype(value.dtype)
    constant = tf.compat.v1.NodeDef(name=node.name, op="Const", device=node.device)
    constant.attr["dtype"].type = dtype.as_datatype_enum
    constant.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value, dtype))
    return constant


def _is_constant(node):
    return node is not None and node.op == "Const"


def applies(model):
    """Whether `ViT.predict` and `predict_on_batch` run `FrozenPredict`: a model that computes
    in bfloat16, on a TensorFlow CPU (no GPU visible), in graph mode (not `run_eagerly`, no
    `jit_compile=True`), outside a tf.distribute strategy. float32 keeps the variables: there
    constants bought 3-5% (docs/performance.md)."""
    return (
        model.dtype_policy.compute_dtype == "bfloat16"
        and not model.run_eagerly
        and not model.jit_compile
        and getattr(model, "_distribute_strategy", None) is None
        and not tf.distribute.has_strategy()
        and not tf.config.list_logical_devices("GPU")
    )


class FrozenPredict:
    """`model`'s `frozen_forward`, rebuilt when a weight changed since it was frozen; `forward`
    is None while the weights do not fit a frozen graph (`fits`).

    `refresh()` checks, before each `predict` or `predict_on_batch`, whether any of the model's
    variables holds a value other than the one frozen. TensorFlow never changes a buffer that a
    tensor still reads: an assignment or optimizer update of a variable whose buffer is held
    elsewhere writes a new buffer. This object holds the tensors read when freezing, so a
    variable whose buffer address differs from theirs has been assigned since (whether by
    `assign`, `set_weights`, `load_weights`, `fit` or a compiled training step). The check
    reads every variable once: 1-3 ms for ViT-S/16's 152 on 2 cores of an AMX Xeon.
    """

    def __init__(self, model):
        self.model = model
        self.forward = None
        self._variables = None  # their ids
        self._fits = False
        self._read = None
        self._held = None  # the tensors read when freezing, and their buffer addresses

    def refresh(self):
        """Rebuilds `forward` on first use, when a weight was assigned, and when weights were
        added or replaced (e.g. by `quantize`)."""
        variables = [w.value for w in self.model.weights]
        if self._variables != [id(v) for v in variables]:
            self._variables, self._held, self.forward = [id(v) for v in variables], None, None
            self._fits = fits(self.model)
            self._read = tf.function(lambda: [v.read_value() for v in variables], autograph=False)
        if not self._fits:
            return
        tensors = self._read()
        addresses = _addresses(tensors)
        if self._held is not None and addresses == self._held[1]:
            return
        self.forward = None  # the old constants go before the new ones are made
        self._held = (tensors, addresses)
        self.forward = frozen_forward(self.model)


def _addresses(tensors):
    return [np.asarray(t).ctypes.data for t in tensors]
