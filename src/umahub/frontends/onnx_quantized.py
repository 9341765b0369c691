"""Quantized ONNX models in QDQ form: the operator forms rewritten, the parameters checked.

Inside umahub a quantized operator is always ``DequantizeLinear -> float
operator -> QuantizeLinear`` (Relax's ``R.dequantize`` / ``R.quantize``), the
form the quantized patterns match. ONNX and ONNX Runtime also write quantized
operators as one node each; :func:`to_qdq` rewrites them into that form before
TVM's importer sees the graph:

=============================  ==================================================
node                           becomes
=============================  ==================================================
QLinearConv                    DQ(x), DQ(w, axis 0), [DQ(B, int32, x_scale*w_scale)]
                               -> Conv -> Q(y)
QLinearMatMul                  DQ(a), DQ(b, per column) -> MatMul -> Q(y)
ConvInteger                    int32 (x - x_zp), int32 (w - w_zp) -> Conv in int32
                               (exact; an integer result, no QDQ)
com.microsoft QGemm            DQ(A), DQ(B), [DQ(C, int32, A_scale*B_scale)] -> Gemm
                               -> Q(Y) (float Y when it has no y_scale)
com.microsoft QLinearAdd, Mul  DQ(A), DQ(B) -> Add / Mul -> Q(C)
com.microsoft QLinearConcat    DQ of each input -> Concat -> Q(Y)
com.microsoft QLinear-         DQ(X) -> GlobalAveragePool, AveragePool, Sigmoid,
GlobalAveragePool, AveragePool LeakyRelu, Softmax (NCHW; channels_last through
Sigmoid, LeakyRelu, Softmax    Transposes) -> Q(Y)
com.microsoft QLinearWhere     DQ(X), DQ(Y) -> Where -> Q(Z)
=============================  ==================================================

The float operator keeps the node's name; the nodes around it are named
``<node>.dequantize_<input>``, ``<node>.quantize`` (and ``<node>.bias_scale``,
``<node>.<input>_int32``), so a pin or a report names the user's node, and
the glob ``<node>*`` takes all of them. Scales are made float32 (a float16
scale of opset 21 would otherwise compute in float16). A bias's scale is
``x_scale * w_scale`` computed once in float32 when both are constants.

The rewritten graph is read by TVM's importer only: it may hold what ONNX's
checker refuses (a per-channel DequantizeLinear at opset 10, a Conv on int32),
never what TVM's converters misread.

:func:`check_quantization` refuses malformed parameters, before any rewrite:
a scale that is not positive and finite, a per-tensor input given several
scales, a per-channel scale whose length is not the channel count, a zero
point of another type than its tensor, or of another length than its scale.
Parameters computed at run time are not checked.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from umahub.errors import UmahubError
from umahub.frontends.onnx_qparams import (
    MS,
    PARAMS,
    _all_nodes,
    _attrs,
    _concat_params,
    _domain,
    _gemm_b_axis,
    _Graph,
    _inferred,
    _input,
    _node_name,
    _Param,
    _subgraphs,
    check_quantization,
)

__all__ = ["check_quantization", "to_qdq"]


# ---------------------------------------------------------------------------- rewriting


class _Rewriter:
    """Builds the nodes that replace one quantized node, named after it."""

    def __init__(self, g: _Graph, node: Any, opset: int):
        self.g, self.node, self.opset = g, node, opset
        self.base = _node_name(node)
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []

    def input(self, i: int | None) -> str:
        return _input(self.node, i)

    def add(self, op: str, inputs: list[str], suffix: str, output: str = "", **attrs: Any) -> str:
        """Add ``op`` named ``<node><suffix>`` (suffix "": the node's own name); its output."""
        import onnx

        name = self.base if not suffix else self.g.fresh(f"{self.base}{suffix}")
        output = output or self.g.fresh(f"{self.base}{suffix or '.' + op.lower()}_out")
        self.nodes.append(onnx.helper.make_node(op, inputs, [output], name=name, **attrs))
        return output

    def constant(self, suffix: str, value: Any) -> str:
        from onnx import numpy_helper

        name = self.g.fresh(f"{self.base}{suffix}")
        self.initializers.append(numpy_helper.from_array(value, name))
        self.g.values[name] = value
        return name

    def float_scale(self, name: str) -> str:
        """``name`` as a float32 scale (a constant converted, else a Cast where not float32)."""
        import numpy as np
        import onnx

        if not name:
            return name
        value = self.g.values.get(name)
        if value is not None:
            if value.dtype == np.float32:
                return name
            return self.constant(f".{name}_float32", value.astype(np.float32))
        if self.g.types.get(name, onnx.TensorProto.FLOAT) == onnx.TensorProto.FLOAT:
            return name
        return self.add("Cast", [name], f".{name}_float32", to=onnx.TensorProto.FLOAT)

    def dequantize(self, p: _Param, axis: int | None = None) -> str:
        """DequantizeLinear of the node's quantized input ``p``; its float output."""
        scale = self.float_scale(self.input(p.scale))
        inputs = [self.input(p.tensor), scale, self.input(p.zero_point)]
        return self._dq(inputs, f".dequantize_{p.names[0]}", scale, axis)

    def _dq(self, inputs: list[str], suffix: str, scale: str, axis: int | None) -> str:
        while inputs and not inputs[-1]:
            inputs.pop()
        extra: dict[str, Any] = {}
        if axis is not None and self._per_channel(scale):
            extra["axis"] = axis
        return self.add("DequantizeLinear", inputs, suffix, **extra)

    def _per_channel(self, scale: str) -> bool:
        import numpy as np

        value = self.g.values.get(scale)
        if value is not None:
            return bool(np.size(value) > 1)
        shape = self.g.shapes.get(scale)
        return shape is None or (len(shape) > 0 and shape[0] != 1)

    def quantize(self, y: str, p: _Param, like: str) -> None:
        """QuantizeLinear of ``y`` into the node's output (no zero point: ``like``'s type)."""
        import numpy as np

        scale = self.float_scale(self.input(p.scale))
        zp = self.input(p.zero_point)
        if not zp:
            dtype = self.g.type_name(like) or "uint8"
            zp = self.constant(".zero_point", np.zeros((), dtype=dtype))
        self.add("QuantizeLinear", [y, scale, zp], ".quantize", output=self.node.output[0])

    def bias(self, index: int, x_scale: str, w_scale: str, axis: int = 0) -> str:
        """The int32 bias at ``index`` dequantized with scale ``x_scale * w_scale``."""
        import numpy as np

        bias = self.input(index)
        if not bias:
            return ""
        xs, ws = self.float_scale(x_scale), self.float_scale(w_scale)
        if xs in self.g.values and ws in self.g.values:
            product = (self.g.values[xs].astype(np.float32) * self.g.values[ws]).astype(np.float32)
            scale = self.constant(
                ".bias_scale", product.reshape(-1) if product.size > 1 else product
            )
        else:
            scale = self.add("Mul", [xs, ws], ".bias_scale")
        return self._dq([bias, scale], ".dequantize_bias", scale, axis)


def _copy_attrs(node: Any, keep: Iterable[str]) -> dict:
    return {k: v for k, v in _attrs(node).items() if k in set(keep)}


_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
_POOL_ATTRS = ("auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides")


def _qlinear_conv(r: _Rewriter) -> None:
    x_p, w_p, y_p = PARAMS["", "QLinearConv"]
    x, w = r.dequantize(x_p), r.dequantize(w_p, axis=0)
    bias = r.bias(8, r.input(1), r.input(4))
    y = r.add("Conv", [x, w, bias] if bias else [x, w], "", **_copy_attrs(r.node, _CONV_ATTRS))
    r.quantize(y, y_p, r.input(0))


def _qlinear_matmul(r: _Rewriter) -> None:
    a_p, b_p, y_p = PARAMS["", "QLinearMatMul"]
    rank = r.g.rank(r.input(3))
    a, b = r.dequantize(a_p), r.dequantize(b_p, axis=-1 if rank is None else rank - 1)
    r.quantize(r.add("MatMul", [a, b], ""), y_p, r.input(0))


def _as_int32(r: _Rewriter, i: int, zp_index: int, name: str) -> str:
    """Input ``i`` minus its zero point, in int32 (computed here when both are constants)."""
    import numpy as np
    import onnx

    x, zp = r.input(i), r.input(zp_index)
    rank = r.g.rank(x)
    zp_value = r.g.values.get(zp) if zp else np.zeros((), np.int32)
    if zp_value is not None and np.size(zp_value) > 1:
        if rank is None:
            raise UmahubError(
                f"node '{r.base}' (ConvInteger): the rank of '{x}' is not known, so its "
                "per-channel zero point cannot be applied; give the model's shapes (onnx "
                "shape inference) or a per-tensor zero point"
            )
        zp_value = zp_value.reshape((-1,) + (1,) * (rank - 1))
    if x in r.g.values and zp_value is not None:
        return r.constant(
            f".{name}_int32", r.g.values[x].astype(np.int32) - zp_value.astype(np.int32)
        )
    x32 = r.add("Cast", [x], f".{name}_int32", to=onnx.TensorProto.INT32)
    if zp_value is not None:
        if not np.any(zp_value):
            return x32
        zp32 = r.constant(f".{name}_zero_point_int32", zp_value.astype(np.int32))
    else:
        zp32 = r.add("Cast", [zp], f".{name}_zero_point_int32", to=onnx.TensorProto.INT32)
        if len(r.g.shapes.get(zp, ())) == 1 and rank is not None:  # one per output channel
            shape = r.constant(f".{name}_zero_point_shape", np.array([-1] + [1] * (rank - 1)))
            zp32 = r.add("Reshape", [zp32, shape], f".{name}_zero_point_per_channel")
    return r.add("Sub", [x32, zp32], f".{name}_minus_zero_point")


def _conv_integer(r: _Rewriter) -> None:
    x, w = _as_int32(r, 0, 2, "x"), _as_int32(r, 1, 3, "w")
    r.add("Conv", [x, w], "", output=r.node.output[0], **_copy_attrs(r.node, _CONV_ATTRS))


def _qgemm(r: _Rewriter) -> None:
    a_p, b_p, y_p = PARAMS[MS, "QGemm"]
    attrs = _attrs(r.node)
    a, b = r.dequantize(a_p), r.dequantize(b_p, axis=_gemm_b_axis(attrs, None))
    # ORT's QGemm adds the int32 C to the int32 product, then scales both by alpha.
    alpha = float(attrs.get("alpha", 1.0))
    bias = r.bias(6, r.input(1), r.input(4))
    gemm_attrs = {k: attrs[k] for k in ("transA", "transB") if k in attrs}
    if alpha != 1.0:
        gemm_attrs.update(alpha=alpha, beta=alpha)
    quantized = bool(r.input(7))
    out = "" if quantized else r.node.output[0]
    y = r.add("Gemm", [a, b, bias] if bias else [a, b], "", output=out, **gemm_attrs)
    if quantized:
        r.quantize(y, y_p, r.input(0))


def _qlinear_binary(op: str) -> Any:
    def rewrite(r: _Rewriter) -> None:
        a_p, b_p, c_p = PARAMS[MS, f"QLinear{op}"]
        r.quantize(r.add(op, [r.dequantize(a_p), r.dequantize(b_p)], ""), c_p, r.input(0))

    return rewrite


def _channels_last(r: _Rewriter, x: str, op: str, **attrs: Any) -> str:
    """``op`` on NCHW ``x``, or on NHWC ``x`` through two Transposes (channels_last=1)."""
    if not _attrs(r.node).get("channels_last", 0):
        return r.add(op, [x], "", **attrs)
    rank = r.g.rank(r.input(0))
    if rank is None:
        raise UmahubError(
            f"node '{r.base}' ({r.node.op_type}): channels_last with an input of unknown rank; "
            "give the model's shapes (onnx shape inference)"
        )
    first = [0, rank - 1, *range(1, rank - 1)]
    back = [0, *range(2, rank), 1]
    nchw = r.add("Transpose", [x], ".to_channels_first", perm=first)
    y = r.add(op, [nchw], "", **attrs)
    return r.add("Transpose", [y], ".to_channels_last", perm=back)


def _qlinear_unary(op: str, keep: Iterable[str] = ()) -> Any:
    def rewrite(r: _Rewriter) -> None:
        x_p, y_p = PARAMS[MS, f"QLinear{op}"]
        x = r.dequantize(x_p)
        y = _channels_last(r, x, op, **_copy_attrs(r.node, keep))
        r.quantize(y, y_p, r.input(0))

    return rewrite


def _qlinear_softmax(r: _Rewriter) -> None:
    x_p, y_p = PARAMS[MS, "QLinearSoftmax"]
    attrs = _attrs(r.node)
    semantics = int(attrs.get("opset", r.opset))
    if (semantics < 13) != (r.opset < 13) and int(attrs.get("axis", -1)) != -1:
        raise UmahubError(
            f"node '{r.base}' (QLinearSoftmax): written for opset {semantics}'s Softmax, in a "
            f"model of opset {r.opset} whose Softmax means another axis; quantize the model "
            "again at its own opset"
        )
    y = r.add("Softmax", [r.dequantize(x_p)], "", **_copy_attrs(r.node, ["axis"]))
    r.quantize(y, y_p, r.input(0))


def _qlinear_concat(r: _Rewriter) -> None:
    y_p, *xs = _concat_params(r.node)
    first = r.input(xs[0].tensor) if xs else ""
    y = r.add("Concat", [r.dequantize(p) for p in xs], "", **_copy_attrs(r.node, ["axis"]))
    r.quantize(y, y_p, first)


def _qlinear_where(r: _Rewriter) -> None:
    x_p, y_p, z_p = PARAMS[MS, "QLinearWhere"]
    y = r.add("Where", [r.input(0), r.dequantize(x_p), r.dequantize(y_p)], "")
    r.quantize(y, z_p, r.input(1))


#: (domain, op) -> the function that rewrites such a node.
REWRITES: dict[tuple[str, str], Any] = {
    ("", "QLinearConv"): _qlinear_conv,
    ("", "QLinearMatMul"): _qlinear_matmul,
    ("", "ConvInteger"): _conv_integer,
    (MS, "QGemm"): _qgemm,
    (MS, "QLinearAdd"): _qlinear_binary("Add"),
    (MS, "QLinearMul"): _qlinear_binary("Mul"),
    (MS, "QLinearGlobalAveragePool"): _qlinear_unary("GlobalAveragePool"),
    (MS, "QLinearAveragePool"): _qlinear_unary("AveragePool", _POOL_ATTRS),
    (MS, "QLinearSigmoid"): _qlinear_unary("Sigmoid"),
    (MS, "QLinearLeakyRelu"): _qlinear_unary("LeakyRelu", ["alpha"]),
    (MS, "QLinearSoftmax"): _qlinear_softmax,
    (MS, "QLinearConcat"): _qlinear_concat,
    (MS, "QLinearWhere"): _qlinear_where,
}


def _rewrite_graph(g: _Graph, opset: int) -> None:
    graph = g.graph
    nodes: list[Any] = []
    for node in graph.node:
        for sub in _subgraphs(node):
            _rewrite_graph(_Graph(sub, g), opset)
        rewrite = REWRITES.get((_domain(node), node.op_type))
        if rewrite is None:
            nodes.append(node)
            continue
        r = _Rewriter(g, node, opset)
        rewrite(r)
        nodes.extend(r.nodes)
        graph.initializer.extend(r.initializers)
    del graph.node[:]
    graph.node.extend(nodes)


def to_qdq(model: Any) -> Any:
    """``model`` with its quantized operator nodes in QDQ form (see the module doc).

    The model given is not changed: a model with something to rewrite is
    copied first; one without is returned as it is. Call
    :func:`check_quantization` first: the rewrite assumes valid parameters.

    Raises:
        UmahubError: a node that cannot be rewritten as it is written (a
            channels_last pool or a per-channel ConvInteger of unknown rank, a
            QLinearSoftmax of another opset's meaning); the message names it.
    """
    import onnx

    if not any((_domain(n), n.op_type) in REWRITES for n in _all_nodes(model.graph)):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    opset = next((int(o.version) for o in out.opset_import if o.domain in ("", "ai.onnx")), 1)
    _rewrite_graph(_Graph(out.graph, inferred=_inferred(out)), opset)
    return out
