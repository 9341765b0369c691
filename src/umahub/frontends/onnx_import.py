"""ONNX models through TVM's ``from_onnx``, operators named after the ONNX nodes.

Nodes that TVM converts into PrimFuncs of its own where Relax has the
operator are converted by umahub (:mod:`umahub.frontends.onnx_ops`).

A quantized model's parameters are checked and its quantized operator nodes
rewritten into QDQ form first (:mod:`umahub.frontends.onnx_quantized`).
"""

from __future__ import annotations

from typing import Any

from umahub.errors import UmahubError
from umahub.frontends.naming import name_variables, naming_builder
from umahub.frontends.onnx_ops import convert

__all__ = ["from_onnx"]


def _onnx_opset(model: Any) -> int:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return 1


def _onnx_importer() -> Any:
    """TVM's ONNX importer, naming each node's operators (None: this TVM's differs)."""
    try:
        from tvm import relax
        from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter
    except ImportError:
        return None

    class NamingImporter(ONNXGraphImporter):
        def __init__(self) -> None:
            super().__init__({}, "float32", keep_params_in_input=False)
            self.bb = naming_builder()

        def _parse_value_proto(self, value_proto):
            name = super()._parse_value_proto(value_proto)
            if not name and getattr(value_proto, "op_type", None) and value_proto.output:
                return value_proto.output[0]  # an unnamed node: its first output
            return name

        def _convert_operator(self, op_name, inputs, attrs, opset):
            name = attrs.get("tvm_custom", {}).get("name") or op_name
            with self.bb.naming(name):
                op = convert(op_name, inputs, attrs, opset)
                if op is None:
                    op = super()._convert_operator(op_name, inputs, attrs, opset)
                # normalized under the node's name: 0.25's importer normalizes what
                # this returns, outside it, and so made unnamed calls of every
                # operator TVM converts (a DequantizeLinear took the next node's name)
                return self.bb.normalize(op) if isinstance(op, relax.Expr) else op

    if not all(hasattr(ONNXGraphImporter, n) for n in ("_parse_value_proto", "_convert_operator")):
        return None
    return NamingImporter


def from_onnx(model: Any) -> Any:
    """Import an ``onnx.ModelProto`` into Relax, weights as constants, operators named.

    Quantization parameters are checked, and QLinearConv, QLinearMatMul,
    ConvInteger and ONNX Runtime's QLinear operators rewritten into
    DequantizeLinear -> float operator -> QuantizeLinear, before TVM's
    importer sees the graph (:mod:`umahub.frontends.onnx_quantized`).

    Raises:
        UmahubError: a malformed quantization parameter (the message names the
            node and the initializer), or TVM's ONNX frontend failed (an
            unsupported operator, an invalid graph); the message says which.
    """
    from umahub.frontends.onnx_quantized import check_quantization, to_qdq

    check_quantization(model)
    model = to_qdq(model)
    importer = _onnx_importer()
    try:
        if importer is not None:
            try:
                instance = importer()
            except TypeError:  # another TVM's constructor: import without names
                instance = None
            if instance is not None:
                return name_variables(instance.from_onnx(model.graph, _onnx_opset(model)))
        from tvm.relax.frontend.onnx import from_onnx as tvm_from_onnx

        return tvm_from_onnx(model, keep_params_in_input=False)
    except UmahubError:
        raise
    except Exception as exc:
        raise UmahubError(
            f"TVM's ONNX frontend could not import the model: {type(exc).__name__}: {exc}"
        ) from exc


# ---------------------------------------------------------------------------- PyTorch
