"""Where an ONNX node keeps its quantization parameters, and their checks.

:data:`PARAMS` says, for each operator with scales or zero points (QuantizeLinear,
DequantizeLinear, QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger and
ONNX Runtime's ``com.microsoft`` QLinear operators), which inputs are a
quantized tensor, its scale and its zero point, and along which axis a
per-channel scale runs. :func:`check_quantization` refuses malformed
parameters before anything is imported (see :mod:`umahub.frontends.onnx_quantized`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from umahub.qparams import SCALE_FIX, refuse, scale_problem, zero_point_problem

__all__ = ["PARAMS", "check_quantization"]

MS = "com.microsoft"


@dataclass(frozen=True)
class _Param:
    """One quantized tensor of a node and its parameters (input indices; -1: output 0).

    ``axis``: None when the scale must be a single value; else the channel axis
    (an int, or a function of the node's attributes and the tensor's rank);
    ``...`` where the shapes are not checked (MatMulInteger's row and column
    zero points of N-D shapes).
    """

    tensor: int
    scale: int | None
    zero_point: int | None
    names: tuple[str, str, str]  # the spec's names of tensor, scale, zero point
    axis: Any = None


def _p(tensor: int, scale: int | None, zp: int | None, name: str, axis: Any = None) -> _Param:
    return _Param(tensor, scale, zp, (name, f"{name}_scale", f"{name}_zero_point"), axis)


def _unary(x: str = "X", y: str = "Y") -> tuple[_Param, ...]:
    return (_p(0, 1, 2, x), _p(-1, 3, 4, y))


def _concat_params(node: Any) -> tuple[_Param, ...]:
    out = [_p(-1, 0, 1, "Y")]
    for i in range(2, len(node.input) - 2, 3):
        out.append(_p(i, i + 1, i + 2, f"X{(i - 2) // 3}"))
    return tuple(out)


def _qdq_axis(attrs: dict, rank: int | None) -> int:
    return int(attrs.get("axis", 1))


def _last(attrs: dict, rank: int | None) -> int:
    return -1 if rank is None else rank - 1


def _gemm_b_axis(attrs: dict, rank: int | None) -> int:
    return 0 if attrs.get("transB", 0) else 1


#: (domain, op) -> the quantized tensors of the node, or a function of the node giving them.
PARAMS: dict[tuple[str, str], Any] = {
    ("", "QuantizeLinear"): (_Param(-1, 1, 2, ("y", "y_scale", "y_zero_point"), _qdq_axis),),
    ("", "DequantizeLinear"): (_Param(0, 1, 2, ("x", "x_scale", "x_zero_point"), _qdq_axis),),
    ("", "QLinearConv"): (_p(0, 1, 2, "x"), _p(3, 4, 5, "w", 0), _p(-1, 6, 7, "y")),
    ("", "QLinearMatMul"): (_p(0, 1, 2, "a"), _p(3, 4, 5, "b", _last), _p(-1, 6, 7, "y")),
    ("", "ConvInteger"): (_p(0, None, 2, "x"), _p(1, None, 3, "w", 0)),
    ("", "MatMulInteger"): (_p(0, None, 2, "A", ...), _p(1, None, 3, "B", ...)),
    (MS, "QuantizeLinear"): (_Param(-1, 1, 2, ("y", "y_scale", "y_zero_point"), _qdq_axis),),
    (MS, "DequantizeLinear"): (_Param(0, 1, 2, ("x", "x_scale", "x_zero_point"), _qdq_axis),),
    (MS, "QLinearAdd"): (_p(0, 1, 2, "A"), _p(3, 4, 5, "B"), _p(-1, 6, 7, "C")),
    (MS, "QLinearMul"): (_p(0, 1, 2, "A"), _p(3, 4, 5, "B"), _p(-1, 6, 7, "C")),
    (MS, "QGemm"): (_p(0, 1, 2, "A"), _p(3, 4, 5, "B", _gemm_b_axis), _p(-1, 7, 8, "Y")),
    (MS, "QLinearGlobalAveragePool"): _unary(),
    (MS, "QLinearAveragePool"): _unary(),
    (MS, "QLinearSigmoid"): _unary(),
    (MS, "QLinearLeakyRelu"): _unary(),
    (MS, "QLinearSoftmax"): _unary(),
    (MS, "QLinearConcat"): _concat_params,
    (MS, "QLinearWhere"): (_p(1, 2, 3, "X"), _p(4, 5, 6, "Y"), _p(-1, 7, 8, "Z")),
}

#: Operators whose output has the type of their first input (for the type checks).
_SAME_TYPE = {
    "Identity", "MaxPool", "Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Relu",
    "Slice", "Gather", "Concat", "Pad", "Resize", "Split", "Expand", "Tile", "DepthToSpace",
    "SpaceToDepth", "GatherElements", "GatherND", "ReduceMax", "ReduceMin", "Clip", "Neg",
}  # fmt: skip

_ONNX_TYPES = {2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
               1: "float32", 10: "float16", 11: "float64", 16: "bfloat16", 21: "uint4",
               22: "int4"}  # fmt: skip


def _domain(node: Any) -> str:
    return "" if node.domain in ("", "ai.onnx") else node.domain


def _node_name(node: Any) -> str:
    """The name umahub gives a node's operators: its name, else its first output's."""
    return node.name or (node.output[0] if node.output else node.op_type)


def _attrs(node: Any) -> dict:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _input(node: Any, i: int | None) -> str:
    """The name of input ``i`` ("" when absent, or when ``i`` is None)."""
    return node.input[i] if i is not None and 0 <= i < len(node.input) else ""


# ---------------------------------------------------------------------------- the graph


class _Graph:
    """What is known of a graph's tensors: constant values, element types, shapes."""

    def __init__(self, graph: Any, outer: _Graph | None = None, inferred: Any = None):
        from onnx import numpy_helper

        self.graph = graph
        self.values: dict[str, Any] = dict(outer.values) if outer else {}
        self.kinds: dict[str, str] = dict(outer.kinds) if outer else {}
        self.types: dict[str, int] = dict(outer.types) if outer else {}
        self.shapes: dict[str, tuple] = dict(outer.shapes) if outer else {}
        self.used: set[str] = set(outer.used) if outer else set()
        for info in [*(inferred or ()), *graph.value_info, *graph.input, *graph.output]:
            self._value_info(info)
        for vi in graph.input:
            self.kinds.setdefault(vi.name, "model input")
        for init in graph.initializer:
            self._constant(init.name, numpy_helper.to_array(init), init.data_type, "initializer")
        for node in graph.node:
            self.used.update([node.name, *node.output])
            if node.op_type == "Constant" and _domain(node) == "" and node.output:
                self._constant_node(node)
            self._propagate(node)
        self.used.update(self.values)
        self.used.update(vi.name for vi in graph.input)

    def _value_info(self, info: Any) -> None:
        t = info.type.tensor_type
        if info.type.WhichOneof("value") != "tensor_type" or not t.elem_type:
            return
        self.types[info.name] = t.elem_type
        if t.HasField("shape"):
            self.shapes[info.name] = tuple(
                d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim
            )

    def _constant(self, name: str, value: Any, elem_type: int, kind: str) -> None:
        self.values[name], self.types[name], self.kinds[name] = value, elem_type, kind
        self.shapes[name] = tuple(value.shape)

    def _constant_node(self, node: Any) -> None:
        from onnx import numpy_helper

        for a in node.attribute:
            if a.name == "value":
                self._constant(
                    node.output[0], numpy_helper.to_array(a.t), a.t.data_type, "constant"
                )

    def _propagate(self, node: Any) -> None:
        """The element type of a node's output, where the inference did not give it."""
        import onnx

        out = node.output[0] if node.output else ""
        if not out or out in self.types:
            return
        op, domain = node.op_type, _domain(node)
        params = PARAMS.get((domain, op))
        if callable(params):
            params = params(node)
        if params and params[-1].tensor == -1:  # its output's type is its zero point's
            zp = _input(node, params[-1].zero_point)
            attrs = _attrs(node)
            if attrs.get("output_dtype"):
                self.types[out] = int(attrs["output_dtype"])
            elif zp in self.types:
                self.types[out] = self.types[zp]
            elif not zp:
                first = _input(node, params[0].tensor) if params[0].tensor >= 0 else ""
                default = self.types.get(first, onnx.TensorProto.UINT8)
                self.types[out] = default if op != "QuantizeLinear" else onnx.TensorProto.UINT8
        elif domain == "" and op in _SAME_TYPE and node.input and node.input[0] in self.types:
            self.types[out] = self.types[node.input[0]]
        elif domain == "" and op == "Cast":
            self.types[out] = int(_attrs(node).get("to", 0))

    def fresh(self, base: str) -> str:
        """A tensor or node name not used yet in the graph, ``base`` if it is free."""
        name, i = base, 1
        while name in self.used:
            name, i = f"{base}_{i}", i + 1
        self.used.add(name)
        return name

    def where(self, name: str) -> str:
        """``'name'`` with where it comes from: ``initializer 'w_scale'``."""
        kind = self.kinds.get(name)
        return f"{kind} '{name}'" if kind else f"'{name}'"

    def type_name(self, name: str) -> str | None:
        return _ONNX_TYPES.get(self.types.get(name, 0))

    def rank(self, name: str) -> int | None:
        shape = self.shapes.get(name)
        return None if shape is None else len(shape)


# ---------------------------------------------------------------------------- checks


def _params_of(node: Any) -> tuple[_Param, ...]:
    params = PARAMS.get((_domain(node), node.op_type), ())
    return params(node) if callable(params) else params


def _check_param(g: _Graph, node: Any, p: _Param) -> None:
    import numpy as np

    name, op = _node_name(node), node.op_type
    tensor = node.output[0] if p.tensor == -1 else _input(node, p.tensor)
    scale_in, zp_in = _input(node, p.scale), _input(node, p.zero_point)
    role_t, role_s, role_z = p.names
    if p.tensor == -1:
        role_t = "the output"
        if op == "QuantizeLinear":  # the input has the output's shape, and is better known
            tensor, role_t = _input(node, 0), "x"
    scale = g.values.get(scale_in) if scale_in else None
    zp = g.values.get(zp_in) if zp_in else None

    if scale is not None:
        problem = scale_problem(scale)
        if problem:
            raise refuse(name, op, f"{role_s} ({g.where(scale_in)}) {problem}; {SCALE_FIX}")
    attrs = _attrs(node)
    axis = p.axis(attrs, g.rank(tensor)) if callable(p.axis) else p.axis
    for kind, role, value, src in (
        ("scale", role_s, scale, scale_in),
        ("zero point", role_z, zp, zp_in),
    ):
        if value is None or np.size(value) == 1 or axis is ...:
            continue
        if axis is None:
            raise refuse(
                name, op,
                f"{role} ({g.where(src)}) has {np.size(value)} values, but {role_t} is quantized "
                f"per tensor: give a single {kind}",
            )  # fmt: skip
        shape = g.shapes.get(tensor)
        if np.ndim(value) != 1:
            raise refuse(
                name, op,
                f"{role} ({g.where(src)}) has shape {list(np.shape(value))}; a per-channel {kind} "
                "is 1-D, one value per channel: reshape it",
            )  # fmt: skip
        if shape is not None and -len(shape) <= axis < len(shape) and shape[axis] is not None:
            if shape[axis] != np.size(value):
                raise refuse(
                    name, op,
                    f"{role} ({g.where(src)}) has {np.size(value)} values, but axis {axis} of "
                    f"{role_t} ({g.where(tensor)}) has {shape[axis]} channels: give one {kind} "
                    "per channel, or a single one",
                )  # fmt: skip
    if scale is not None and zp is not None and np.size(zp) != np.size(scale):
        raise refuse(
            name, op,
            f"{role_z} ({g.where(zp_in)}) has {np.size(zp)} values and {role_s} "
            f"({g.where(scale_in)}) {np.size(scale)}: give as many zero points as scales",
        )  # fmt: skip
    if not zp_in:
        return
    zp_type = g.type_name(zp_in)
    if p.tensor == -1:
        wanted = _ONNX_TYPES.get(int(attrs.get("output_dtype", 0)))
        if wanted and zp_type and wanted != zp_type:
            raise refuse(
                name, op,
                f"{role_z} ({g.where(zp_in)}) is {zp_type} but output_dtype says {wanted}; "
                f"ONNX requires the same type: store the zero point as {wanted}",
            )  # fmt: skip
    else:
        t_type = g.type_name(tensor)
        if zp_type and t_type and zp_type != t_type:
            raise refuse(
                name, op,
                f"{role_z} ({g.where(zp_in)}) is {zp_type} but {role_t} ({g.where(tensor)}) is "
                f"{t_type}; ONNX requires the same type: store the zero point as {t_type}",
            )  # fmt: skip
    if zp is not None and zp_type:
        problem = zero_point_problem(zp, zp_type)
        if problem:
            raise refuse(name, op, f"{role_z} ({g.where(zp_in)}) {problem}; correct the value")


def _subgraphs(node: Any) -> Iterable[Any]:
    import onnx

    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            yield a.g
        elif a.type == onnx.AttributeProto.GRAPHS:
            yield from a.graphs


def _inferred(model: Any) -> list:
    """The value infos of ONNX's shape inference (none where it fails)."""
    import onnx

    try:
        return list(onnx.shape_inference.infer_shapes(model).graph.value_info)
    except Exception:
        return []


def _check_graph(g: _Graph) -> None:
    for node in g.graph.node:
        for p in _params_of(node):
            _check_param(g, node, p)
        for sub in _subgraphs(node):
            _check_graph(_Graph(sub, g))


def check_quantization(model: Any) -> None:
    """Refuse a model whose constant quantization parameters are malformed.

    Checks every node that has scales or zero points (QuantizeLinear,
    DequantizeLinear, every form :func:`to_qdq` rewrites, ConvInteger,
    MatMulInteger): scales positive and finite; per-tensor parameters single;
    per-channel ones 1-D with one value per channel of the tensor's axis and as
    many zero points as scales; each zero point of its tensor's type.

    Raises:
        UmahubError: one line, ``node '<name>' (<op>): <parameter> (initializer
            '<tensor>') <what is wrong>; <what to do>``.
    """
    if not any(_params_of(n) for n in _all_nodes(model.graph)):
        return
    _check_graph(_Graph(model.graph, inferred=_inferred(model)))


def _all_nodes(graph: Any) -> Iterable[Any]:
    for node in graph.node:
        yield node
        for sub in _subgraphs(node):
            yield from _all_nodes(sub)
