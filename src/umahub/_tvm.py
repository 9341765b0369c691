"""The few TVM names that moved between apache-tvm 0.25, 0.26 and 0.27, in one place.

TVM 0.26/0.27 renamed Relax's ``StructInfo`` to ``Type`` (``TensorStructInfo`` ->
``TensorType``, ``expr.struct_info`` -> ``expr.ty``) and moved ``Var``,
``Constant`` and ``VDevice``; umahub code asks here instead of guessing.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax

__all__ = ["Constant", "TensorType", "TupleType", "VDevice", "name_of", "ret_type", "type_of"]

TensorType: Any = getattr(relax, "TensorType", None) or relax.TensorStructInfo
TupleType: Any = getattr(relax, "TupleType", None) or relax.TupleStructInfo
Constant: Any = getattr(relax, "Constant", None) or tvm.ir.expr.Constant
VDevice: Any = getattr(relax, "VDevice", None) or tvm.ir.VDevice


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
