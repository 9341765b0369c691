"""The few TVM names that moved between apache-tvm 0.25, 0.26 and 0.27, in one place.

TVM 0.26/0.27 renamed Relax's ``StructInfo`` to ``Type`` (``TensorStructInfo`` ->
``TensorType``, ``expr.struct_info`` -> ``expr.ty``, ``out_sinfo=`` -> ``out_ty=``)
and moved ``Var``, ``Constant``, ``VDevice`` and ``StringImm``; umahub code asks here instead of
guessing.

Careful with the order of the look-ups: TVM 0.25 still has ``relax.TensorType``
and ``relax.TupleType``, but they are the old, shape-less ``Type`` classes
(``TensorType(ndim, dtype)``), not what a Relax expression carries; there the
struct info classes are the right ones.  So the ``*StructInfo`` name is taken
when it exists (0.25) and the ``*Type`` name otherwise (0.26, 0.27).
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax

__all__ = [
    "Analyzer",
    "Constant",
    "StringImm",
    "TensorType",
    "TupleType",
    "VDevice",
    "call_dps_packed",
    "call_pure_packed",
    "constant_value",
    "name_of",
    "param_buffers",
    "rebind",
    "remap_var",
    "ret_type",
    "structural_hash",
    "type_args",
    "type_of",
    "well_formed",
]

TensorType: Any = getattr(relax, "TensorStructInfo", None) or relax.TensorType
TupleType: Any = getattr(relax, "TupleStructInfo", None) or relax.TupleType
Constant: Any = getattr(relax, "Constant", None) or tvm.ir.expr.Constant
VDevice: Any = getattr(relax, "VDevice", None) or tvm.ir.VDevice
StringImm: Any = getattr(relax, "StringImm", None) or tvm.ir.StringImm


def remap_var(mutator: Any, var: Any, new: Any) -> None:
    """Tell a Relax ``PyExprMutator`` that ``var``'s uses now read ``new`` (keyed by
    the variable in 0.26 and 0.27, by its id in 0.25)."""
    try:
        mutator.set_var_remap(var, new)
    except TypeError:
        mutator.set_var_remap(var.vid, new)


def constant_value(constant: Any) -> Any:
    """The tensor a Relax constant holds (``.value`` in 0.27, ``.data`` before)."""
    value = getattr(constant, "data", None)
    return value if value is not None else constant.value


def structural_hash(node: Any) -> int:
    """TVM's structural hash of ``node`` (``tvm.ir``'s before 0.27, tvm-ffi's after)."""
    legacy = getattr(tvm.ir, "structural_hash", None)
    if legacy is not None:
        return int(legacy(node))
    import tvm_ffi

    return int(tvm_ffi.structural_hash(node))


def _analyzer() -> Any:
    try:
        from tvm.sym import Analyzer  # apache-tvm 0.27

        return Analyzer
    except ImportError:
        from tvm.arith import Analyzer  # 0.25, 0.26

        return Analyzer


Analyzer: Any = _analyzer()


def name_of(var: Any) -> str:
    """The name of a Relax variable or global variable."""
    hint = getattr(var, "name_hint", None)
    return str(hint if hint is not None else var.name)


def type_of(expr: Any) -> Any:
    """The Relax type (struct info) of an expression."""
    info = getattr(expr, "struct_info", None)
    return info if info is not None else expr.ty


def ret_type(func: Any) -> Any:
    """The return type (struct info) of a Relax function."""
    info = getattr(func, "ret_struct_info", None)
    return info if info is not None else func.ret_ty


def call_dps_packed(func: Any, args: Any, out: Any) -> Any:
    """``relax.op.call_dps_packed`` with the output type ``out`` (the keyword is
    ``out_ty`` in 0.26/0.27 and ``out_sinfo`` in 0.25, the position is the same)."""
    return relax.op.call_dps_packed(func, args, out)


def call_pure_packed(name: str, args: Any, out: Any) -> Any:
    """``relax.op.call_pure_packed(name, *args)`` returning ``out`` (the keyword is
    ``ty_args`` in 0.26/0.27 and ``sinfo_args`` in 0.25)."""
    try:
        return relax.op.call_pure_packed(name, *args, ty_args=out)
    except TypeError:
        return relax.op.call_pure_packed(name, *args, sinfo_args=out)


def type_args(call: Any) -> Any:
    """The type arguments of a Relax call (``sinfo_args`` in 0.25, ``ty_args`` in 0.26, 0.27)."""
    args = getattr(call, "sinfo_args", None)
    return args if args is not None else call.ty_args


def rebind(binding: Any, value: Any) -> Any:
    """A binding of the same kind as ``binding`` (``VarBinding`` or ``MatchCast``) to ``value``.

    A ``MatchCast`` defines the symbolic sizes of a shape computed at run time
    (ONNX's Unsqueeze or Tile with their axes as an input); rebuilding it as a
    plain ``VarBinding`` would leave those sizes undefined.
    """
    if isinstance(binding, relax.MatchCast):
        cast_to = getattr(binding, "struct_info", None)
        if cast_to is None:
            cast_to = binding.ty
        return relax.MatchCast(binding.var, value, cast_to)
    return relax.VarBinding(binding.var, value)


def well_formed(mod: Any) -> bool:
    """Relax's well-formedness check: 0.26 and 0.27 return a bool; 0.25 raises when
    the module is not well formed and returns None when it is."""
    try:
        result = relax.analysis.well_formed(mod)
    except Exception:
        return False
    return result is None or bool(result)


def param_buffers(prim_func: Any) -> list[Any]:
    """The buffer of each PrimFunc parameter, in order (None for a scalar parameter).

    In 0.25 a buffer parameter is a handle with the buffer in ``buffer_map``;
    in 0.26 and 0.27 the parameter is the buffer itself.
    """
    buffer_map = getattr(prim_func, "buffer_map", None)
    if buffer_map is not None:
        return [buffer_map.get(p) for p in prim_func.params]
    tir = getattr(tvm, "tirx", None) or tvm.tir
    is_buffer = getattr(tir, "is_buffer_var", None)
    return [p if is_buffer is not None and is_buffer(p) else None for p in prim_func.params]
