"""The TIR names ``schedules.py`` needs that differ between apache-tvm 0.25, 0.26 and 0.27.

Found by looking the names up (never by comparing version strings):

=========================  ==================================  ================================
what                       0.27                                0.25, 0.26
=========================  ==================================  ================================
buffer load                ``tvm.ir.TensorLoad``, ``.source``   ``tirx.BufferLoad``, ``.buffer``
                           (``tirx.BufferLoad`` is a function)
read/write region          ``TensorRegion``, ``.source``       ``tirx.BufferRegion``, ``.buffer``
walk an expression         ``tvm_ffi.structural_walk``         same in 0.26 (apache-tvm-ffi
                                                               0.1.15); ``tirx.stmt_functor.
                                                               post_order_visit`` in 0.25
``detect_linear_equation``  ``tvm.sym.pattern``                 ``tvm.arith.pattern``
=========================  ==================================  ================================

Imported by ``schedules.py`` only (the plugin itself loads without TVM).  The plugin
does not import umahub's private ``umahub._tvm``.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

try:  # apache-tvm 0.27
    from tvm.sym.pattern import detect_linear_equation
except ImportError:  # apache-tvm 0.25, 0.26
    from tvm.arith.pattern import detect_linear_equation

__all__ = ["Load", "buffer_of", "detect_linear_equation", "vars_in"]

# 0.27: ``tirx.BufferLoad`` is a constructor function returning a ``tvm.ir.TensorLoad``.
Load = tirx.BufferLoad if isinstance(tirx.BufferLoad, type) else tvm.ir.expr.TensorLoad


def buffer_of(node):
    """The buffer a load, a store or a read/write region refers to."""
    return node.buffer if hasattr(node, "buffer") else node.source


_structural_walk = getattr(tvm_ffi, "structural_walk", None)


def vars_in(expr) -> list:
    """Every ``tirx.Var`` under ``expr``, in post order."""
    found: list = []
    if _structural_walk is not None:
        _structural_walk(expr, (tirx.Var, found.append), order="post")
    else:
        tirx.stmt_functor.post_order_visit(
            expr, lambda node: found.append(node) if isinstance(node, tirx.Var) else None
        )
    return found
