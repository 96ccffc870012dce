"""Rewrites of the ONNX graph tf2onnx writes for a ViT into the standard forms ONNX Runtime runs
as one kernel each.

tf2onnx writes each layer normalisation as eight ops (two `GlobalAveragePool`s for the means,
`Sqrt` and `Reciprocal` for the scale) and the exact GELU through `1 - Erf(-x / sqrt 2)`, forms
that ONNX Runtime's optimiser leaves as they are. `fuse` replaces the first with opset 17's
`LayerNormalization` and writes the second as `0.5 x (1 + Erf(x / sqrt 2))`, which ONNX
Runtime fuses into its GELU kernel. Both are standard ONNX; the outputs are the same function.
"""

import collections

import numpy as np


def fuse(proto):
    """`proto` (an `onnx.ModelProto`) with its layer normalisations and exact GELUs rewritten,
    in place; returns `(proto, normalisations, gelus)`, the counts rewritten."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(proto)
    widths = {
        v.name: v.type.tensor_type.shape.dim[-1].dim_value
        for v in list(inferred.graph.value_info) + list(inferred.graph.input)
        if v.type.tensor_type.shape.dim
    }
    graph = _Graph(proto.graph)
    normalisations = sum(graph.layer_norm(node, widths) for node in graph.nodes)
    gelus = sum(graph.gelu(node) for node in graph.nodes)
    graph.commit()
    return proto, normalisations, gelus


class _Graph:
    """Pattern matching over a GraphProto's nodes: each rewrite puts its new nodes where the
    matched ones' last stood (so the order stays topological) and drops the matched ones."""

    def __init__(self, graph):
        import onnx

        self.graph = graph
        self.nodes = [onnx.NodeProto.FromString(n.SerializeToString()) for n in graph.node]  # held, not views
        self.constants = {i.name: i for i in graph.initializer}
        self.producer = {out: n for n in self.nodes for out in n.output}
        self.consumers = collections.defaultdict(list)
        for node in self.nodes:
            for name in dict.fromkeys(node.input):  # a node that reads a tensor twice counts once
                self.consumers[name].append(node)
        self.replaced = {}  # id of the last matched node -> new nodes
        self.dropped = set()  # ids of matched nodes
        self._shared = {}

    def _only(self, name, op_type):
        """The single consumer of `name` when it is an `op_type` node not yet matched."""
        users = self.consumers.get(name, [])
        if len(users) == 1 and users[0].op_type == op_type and id(users[0]) not in self.dropped:
            return users[0]
        return None

    def _scalar(self, name):
        constant = self.constants.get(name)
        if constant is None:
            return None
        from onnx import numpy_helper

        value = numpy_helper.to_array(constant)
        return float(value) if value.size == 1 else None

    def _constant(self, key, value):
        """The name of a shared initializer holding `value`, added once."""
        if key not in self._shared:
            from onnx import numpy_helper

            name = f"keras_vit_fused_{key}"
            self.graph.initializer.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
            self._shared[key] = name
        return self._shared[key]

    def _replace(self, matched, new_nodes):
        self.dropped.update(id(n) for n in matched)
        self.replaced[id(matched[-1])] = new_nodes

    def layer_norm(self, mean, widths):
        """Rewrites `mean(x)`, `d = x - mean`, `mean(d * d)`, `+ eps`, `Sqrt`, `Reciprocal`, then
        `d * that` or `d * (that * gamma)`, and any `+ beta` (means as `GlobalAveragePool` over
        the last axis of a rank-3 tensor) as one `LayerNormalization`; returns whether it did."""
        import onnx

        if mean.op_type != "GlobalAveragePool" or id(mean) in self.dropped:
            return False
        x = mean.input[0]
        width = widths.get(x)
        sub = self._only(mean.output[0], "Sub")
        if not width or sub is None or list(sub.input) != [x, mean.output[0]]:
            return False
        d = sub.output[0]
        users = self.consumers.get(d, [])
        square = next((n for n in users if n.op_type == "Mul" and list(n.input) == [d, d]), None)
        if square is None or len(users) != 2:
            return False
        variance = self._only(square.output[0], "GlobalAveragePool")
        add = variance and self._only(variance.output[0], "Add")
        eps = add and self._scalar(_other(add, variance.output[0]))
        sqrt = add and eps is not None and self._only(add.output[0], "Sqrt")
        reciprocal = sqrt and self._only(sqrt.output[0], "Reciprocal")
        scale = reciprocal and self._only(reciprocal.output[0], "Mul")
        if not scale:
            return False
        matched = [mean, sub, square, variance, add, sqrt, reciprocal]
        gamma = self._vector(_other(scale, reciprocal.output[0]), width)
        if gamma is not None:  # `that * gamma`, then `d * it`
            matched.append(scale)
            scale = self._only(scale.output[0], "Mul")
        if not scale or set(scale.input) != {d, matched[-1].output[0]}:
            return False
        matched.append(scale)
        shift = self._only(scale.output[0], "Add")
        beta = shift and self._vector(_other(shift, scale.output[0]), width)
        if beta is not None:
            matched.append(shift)
        gamma = gamma if gamma is not None else self._constant(f"ones_{width}", np.ones(width))
        beta = beta if beta is not None else self._constant(f"zeros_{width}", np.zeros(width))
        node = onnx.helper.make_node(
            "LayerNormalization",
            [x, gamma, beta],
            [matched[-1].output[0]],
            name=f"{mean.name}/LayerNormalization",
            axis=-1,
            epsilon=eps,
        )
        self._replace(matched, [node])
        return True

    def _vector(self, name, width):
        """`name` when it is a float32 initializer of shape `(width,)`, else None."""
        constant = self.constants.get(name)
        if constant is None or list(constant.dims) != [width] or constant.data_type != 1:  # 1: FLOAT
            return None
        return name

    def gelu(self, erf):
        """Rewrites `0.5 x * (1 - Erf(-x * c))` (c = 1/sqrt 2: tf2onnx's exact GELU through Erfc)
        as `(x * (1 + Erf(x / sqrt 2))) * 0.5`; returns whether it did."""
        import onnx

        if erf.op_type != "Erf" or id(erf) in self.dropped:
            return False
        scale = self.producer.get(erf.input[0])
        if scale is None or scale.op_type != "Mul" or len(self.consumers[scale.output[0]]) != 1:
            return False
        first, second = (self.producer.get(name) for name in scale.input)
        neg, c = (first, self._scalar(scale.input[1])) if first is not None else (second, self._scalar(scale.input[0]))
        if neg is None or neg.op_type != "Neg" or c is None or abs(c - 0.5**0.5) > 1e-6:
            return False
        x = neg.input[0]
        sub = self._only(erf.output[0], "Sub")
        if sub is None or list(sub.input)[1] != erf.output[0] or self._scalar(sub.input[0]) != 1.0:
            return False
        out = self._only(sub.output[0], "Mul")
        half = out and self.producer.get(_other(out, sub.output[0]))
        if not half or half.op_type != "Mul" or x not in half.input or len(self.consumers[half.output[0]]) != 1:
            return False
        if self._scalar(_other(half, x)) != 0.5 or len(self.consumers[neg.output[0]]) != 1:
            return False
        name = erf.name
        nodes = [
            onnx.helper.make_node("Div", [x, self._constant("sqrt2", 2.0**0.5)], [f"{name}/div"], f"{name}/div"),
            onnx.helper.make_node("Erf", [f"{name}/div"], [f"{name}/erf"], f"{name}/erf"),
            onnx.helper.make_node("Add", [f"{name}/erf", self._constant("one", 1.0)], [f"{name}/add"], f"{name}/add"),
            onnx.helper.make_node("Mul", [x, f"{name}/add"], [f"{name}/mul"], f"{name}/mul"),
            onnx.helper.make_node("Mul", [f"{name}/mul", self._constant("half", 0.5)], [out.output[0]], f"{name}/gelu"),
        ]
        self._replace([half, neg, scale, erf, sub, out], nodes)
        return True

    def commit(self):
        """Writes the graph's nodes with the rewrites in place."""
        nodes = []
        for node in self.nodes:
            nodes += self.replaced.get(id(node), [])
            if id(node) not in self.dropped:
                nodes.append(node)
        del self.graph.node[:]
        self.graph.node.extend(nodes)
        read = {name for node in nodes for name in node.input}
        unused = [i for i in self.graph.initializer if i.name not in read]  # the rewritten constants
        for initializer in unused:
            self.graph.initializer.remove(initializer)


def _other(node, name):
    """The input of a two-input `node` that is not `name` ("" if there is none)."""
    return next((i for i in node.input if i != name), "")
