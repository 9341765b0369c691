"""The TIR names ``passes.py`` needs that differ between apache-tvm 0.25, 0.26 and 0.27.

Found by looking the names up (never by comparing version strings):

==========================  ===============================  ===============================
what                        0.27                             0.25, 0.26
==========================  ===============================  ===============================
S-TIR block (and realize)   ``tvm.s_tir.SBlock(Realize)``    ``tvm.tirx.SBlock(Realize)``
buffer load                 ``tvm.ir.TensorLoad`` ``.source``  ``tirx.BufferLoad`` ``.buffer``
read/write region           ``TensorRegion`` ``.source``     ``tirx.BufferRegion`` ``.buffer``
call (``if_then_else``)     ``tvm.ir.expr.Call``             same in 0.26; ``tirx.Call`` in 0.25
a buffer                    a ``Var``: ``tirx.is_buffer_var``  same in 0.26; ``tirx.Buffer`` in 0.25
PrimFunc parameters         the buffers themselves           same in 0.26; handles +
                                                             ``buffer_map`` in 0.25
a buffer's data pointer     ``buf.data``, an expression      same in 0.26; in 0.25 a handle
                            of the element pointer type      ``Var`` that the C codegen
                                                             declares ``void*``
``detect_linear_equation``  ``tvm.sym.pattern``              ``tvm.arith.pattern``
==========================  ===============================  ===============================

Imported by ``passes.py`` only (the plugin itself loads without TVM).  The plugin
does not import umahub's private ``umahub._tvm``.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

try:  # apache-tvm 0.27
    from tvm.sym.pattern import detect_linear_equation
except ImportError:  # apache-tvm 0.25, 0.26
    from tvm.arith.pattern import detect_linear_equation

__all__ = [
    "Call",
    "Load",
    "SBlock",
    "SBlockRealize",
    "buffer_of",
    "data_pointer",
    "detect_linear_equation",
    "is_buffer",
    "param_buffers",
]

SBlock = getattr(s_tir, "SBlock", None) or tirx.SBlock
SBlockRealize = getattr(s_tir, "SBlockRealize", None) or tirx.SBlockRealize

# 0.27: ``tirx.BufferLoad`` is a constructor function returning a ``tvm.ir.TensorLoad``.
Load = getattr(tvm.ir.expr, "TensorLoad", None) or tirx.BufferLoad
Call = getattr(tvm.ir.expr, "Call", None) or tirx.Call


def buffer_of(node):
    """The buffer a load or a read/write region refers to."""
    source = getattr(node, "source", None)
    return source if source is not None else node.buffer


_is_buffer_var = getattr(tirx, "is_buffer_var", None)


def is_buffer(value) -> bool:
    """Whether ``value`` is a TIR buffer (a ``Var`` from 0.26 on, a ``tirx.Buffer`` before)."""
    if _is_buffer_var is not None:
        return bool(_is_buffer_var(value))
    return isinstance(value, tirx.Buffer)


def param_buffers(func) -> list:
    """The buffers a PrimFunc takes, in parameter order."""
    buffer_map = getattr(func, "buffer_map", None)
    if buffer_map is None:  # 0.26, 0.27: a buffer parameter is the buffer
        return [p for p in func.params if is_buffer(p)]
    return [buffer_map[p] for p in func.params if p in buffer_map]


def data_pointer(buf):
    """The pointer to ``buf``'s first element, as an argument of ``T.call_extern``.

    ``buf.data`` where it is an expression of the element pointer type (0.26, 0.27:
    the C codegen declares it ``float*``).  Where it is a separate handle variable
    (0.25), the C host codegen declares that variable ``void*``, which a C++ compiler
    (g++ builds the exported library) does not pass to a ``float*`` parameter; there
    the argument is ``T.address_of(buf[0, ..., 0])``, printed ``&(((float*)x)[0])``.
    """
    data = buf.data
    if not isinstance(data, tirx.Var):
        return data
    return tirx.address_of(tirx.BufferLoad(buf, [tirx.const(0, _dtype(d)) for d in buf.shape]))


def _dtype(expr) -> str:
    dt = getattr(expr, "dtype", None)
    return str(dt if dt is not None else expr.ty)
