"""What a plugin needs of TVM that differs between apache-tvm 0.25, 0.26 and 0.27.

umahub supports apache-tvm 0.25 to 0.27, and so must a plugin. The TIR and Relax
names below moved or changed shape between those releases; a plugin takes them
from here instead of carrying its own shims::

    from umahub.plugin.compat import Load, buffer_of, detect_linear_equation

    def loads_of(expr):
        return [buffer_of(n) for n in vars_in(expr) if isinstance(n, Load)]

``import umahub.plugin.compat`` does not import TVM: every name is resolved when it is
first used (a class such as :data:`SBlock` when it is first imported or read,
a function when it is first called), so a plugin's top-level module may import
this one and still load without TVM. Everything is found by looking the names
up, never by comparing version strings, so a patch release that backports a
rename keeps working.

What moved (each verified on the three wheels, not only read in their
documentation):

.. list-table::
   :header-rows: 1

   * - what
     - 0.27
     - 0.25, 0.26
   * - S-TIR block, its realize (:data:`SBlock`, :data:`SBlockRealize`)
     - ``tvm.s_tir.SBlock``, ``tvm.s_tir.SBlockRealize``
     - ``tvm.tirx.SBlock``, ``tvm.tirx.SBlockRealize``
   * - buffer load (:data:`Load`)
     - ``tvm.ir.expr.TensorLoad``, its buffer in ``.source`` (``tirx.BufferLoad`` is a
       function that makes one)
     - ``tirx.BufferLoad``, its buffer in ``.buffer``
   * - read/write region (:data:`Region`)
     - ``tvm.ir.expr.TensorRegion``, ``.source``
     - ``tirx.BufferRegion``, ``.buffer``
   * - buffer store
     - ``tirx.BufferStore``, ``.buffer``
     - the same
   * - expression base class (:data:`Expr`)
     - ``tvm.ir.expr.Expr``
     - the same in 0.26; ``tvm.tirx.PrimExpr`` in 0.25
   * - call, e.g. ``if_then_else`` (:data:`Call`)
     - ``tvm.ir.expr.Call``
     - the same in 0.26; ``tirx.Call`` in 0.25
   * - a buffer (:func:`is_buffer`)
     - a ``Var`` (``tirx.is_buffer_var``)
     - the same in 0.26; a ``tirx.Buffer`` in 0.25
   * - PrimFunc parameters (:func:`param_buffers`)
     - the buffers themselves
     - the same in 0.26; handles and a ``buffer_map`` in 0.25
   * - a buffer's data pointer (:func:`data_pointer`)
     - ``buf.data``, an expression of the element pointer type
     - the same in 0.26; in 0.25 a handle ``Var`` that C declares ``void*``
   * - whether an argument is a buffer's data pointer (:func:`points_to`)
     - a ``tirx.buffer_data(buf)`` call, made anew at each use of ``buf.data``
     - the same in 0.26; in 0.25 :func:`data_pointer`'s ``T.address_of(buf[0, ..., 0])``
   * - walk an expression (:func:`vars_in`)
     - ``tvm_ffi.structural_walk``
     - the same in 0.26 (it comes with apache-tvm-ffi 0.1.15); 0.25 (tvm-ffi 0.1.12):
       ``tirx.stmt_functor.ir_transform`` with a callback that changes nothing
       (``post_order_visit`` visits a node shared by two parents once; the walk
       lists it each time it occurs) and a statement only
   * - ``detect_linear_equation``, :data:`Analyzer`
     - ``tvm.sym.pattern``, ``tvm.sym``
     - ``tvm.arith.pattern``, ``tvm.arith``
   * - Relax tensor/tuple type (:data:`TensorType`, :data:`TupleType`, :func:`type_of`,
       :func:`ret_type`, :func:`type_args`)
     - ``relax.TensorType``, ``relax.TupleType``; ``expr.ty``, ``func.ret_ty``,
       ``call.ty_args``
     - the same in 0.26; ``relax.TensorStructInfo``, ``expr.struct_info``,
       ``func.ret_struct_info``, ``call.sinfo_args`` in 0.25 (its ``relax.TensorType``
       is an older, shape-less class)

:func:`buffer_of` answers the one question whose answer moved between
attributes: no TIR node of any of the three versions has both ``.buffer`` and
``.source`` (0.27's ``TensorLoad``/``TensorRegion`` have only ``.source``;
``BufferStore``, and 0.25/0.26's ``BufferLoad``/``BufferRegion``, only
``.buffer``), so it takes ``.buffer`` where a node has it and ``.source``
otherwise, and refuses any other node with a ``TypeError``.

umahub's own code uses the private ``umahub._tvm``; the Relax names here are
the same objects, re-exported for plugins.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "Analyzer",
    "Call",
    "Expr",
    "Load",
    "Region",
    "SBlock",
    "SBlockRealize",
    "TensorType",
    "TupleType",
    "buffer_of",
    "data_pointer",
    "detect_linear_equation",
    "dtype_of_expr",
    "is_buffer",
    "name_of",
    "nodes_in",
    "param_buffers",
    "points_to",
    "ret_type",
    "type_args",
    "type_of",
    "vars_in",
]


# ----------------------------------------------------------------- lazily resolved names


def _first(*candidates: tuple[str, str]) -> Any:
    """The first ``(module, attribute)`` that exists."""
    for module, attr in candidates:
        try:
            value = getattr(importlib.import_module(module), attr, None)
        except ImportError:
            continue
        if value is not None:
            return value
    raise ImportError(
        "none of " + ", ".join(f"{m}.{a}" for m, a in candidates) + " exists in this TVM"
    )


def _load_class() -> Any:
    # 0.27: ``tirx.BufferLoad`` is a constructor function returning a ``TensorLoad``.
    return _first(("tvm.ir.expr", "TensorLoad"), ("tvm.tirx", "BufferLoad"))


def _region_class() -> Any:
    # 0.27: ``tirx.BufferRegion`` is a constructor function returning a ``TensorRegion``.
    return _first(("tvm.ir.expr", "TensorRegion"), ("tvm.tirx", "BufferRegion"))


def _from_tvm_shim(name: str) -> Any:
    from umahub import _tvm

    return getattr(_tvm, name)


_RESOLVERS: dict[str, Any] = {
    "SBlock": lambda: _first(("tvm.s_tir", "SBlock"), ("tvm.tirx", "SBlock")),
    "SBlockRealize": lambda: _first(("tvm.s_tir", "SBlockRealize"), ("tvm.tirx", "SBlockRealize")),
    "Load": _load_class,
    "Region": _region_class,
    "Call": lambda: _first(("tvm.ir.expr", "Call"), ("tvm.tirx", "Call")),
    "Expr": lambda: _first(("tvm.ir.expr", "Expr"), ("tvm.tirx", "PrimExpr")),
    "detect_linear_equation": lambda: _first(
        ("tvm.sym.pattern", "detect_linear_equation"),
        ("tvm.arith.pattern", "detect_linear_equation"),
    ),
    "Analyzer": lambda: _from_tvm_shim("Analyzer"),
    "TensorType": lambda: _from_tvm_shim("TensorType"),
    "TupleType": lambda: _from_tvm_shim("TupleType"),
}

if TYPE_CHECKING:  # for type checkers and readers: what the lazy names are
    #: The S-TIR block statement class (``tvm.s_tir.SBlock`` or ``tvm.tirx.SBlock``).
    SBlock: Any
    #: The S-TIR block realize statement class.
    SBlockRealize: Any
    #: The class of a buffer load expression (for ``isinstance``; build loads
    #: with ``tvm.tirx.BufferLoad(buffer, indices)``, which all versions have).
    Load: Any
    #: The class of a read/write region of a block (for ``isinstance``).
    Region: Any
    #: The class of a call expression (``T.if_then_else``, ``T.call_extern`` ...).
    Call: Any
    #: The base class of TIR expressions (for ``nodes_in(e, Expr)``: the expression
    #: nodes of ``e``, none of the types, dtypes and arrays a walk also visits).
    Expr: Any
    #: ``detect_linear_equation(expr, vars)``: the coefficients of a linear
    #: expression in ``vars``, then the constant term; empty when not linear.
    detect_linear_equation: Any
    #: The arithmetic analyzer class (``simplify``, ``can_prove``, ``const_int_bound``).
    Analyzer: Any
    #: The Relax tensor type class: what ``type_of`` a tensor expression is.
    TensorType: Any
    #: The Relax tuple type class.
    TupleType: Any


def __getattr__(name: str) -> Any:
    resolve = _RESOLVERS.get(name)
    if resolve is None:
        raise AttributeError(f"module 'umahub.plugin.compat' has no attribute {name!r}")
    value = resolve()
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


@functools.cache
def _tirx() -> Any:
    from tvm import tirx

    return tirx


# ----------------------------------------------------------------- functions: TIR


def buffer_of(node: Any) -> Any:
    """The buffer a load, a store or a block's read/write region refers to.

    ``.buffer`` where the node has it (a store in every version, a load or a
    region in 0.25 and 0.26), ``.source`` otherwise (a load or a region in
    0.27). No node of 0.25-0.27 has both.

    Raises:
        TypeError: ``node`` is none of these.
    """
    buffer = getattr(node, "buffer", None)
    if buffer is not None:
        return buffer
    source = getattr(node, "source", None)
    if source is not None:
        return source
    raise TypeError(f"buffer_of: a {type(node).__name__} is not a buffer load, store or region")


def is_buffer(value: Any) -> bool:
    """Whether ``value`` is a TIR buffer (a ``Var`` from 0.26 on, a ``tirx.Buffer`` in 0.25)."""
    tirx = _tirx()
    is_buffer_var = getattr(tirx, "is_buffer_var", None)
    if is_buffer_var is not None:
        return bool(is_buffer_var(value))
    return isinstance(value, tirx.Buffer)


def param_buffers(func: Any) -> list[Any]:
    """The buffer of each parameter of a PrimFunc, in order; None for a scalar parameter.

    In 0.25 a buffer parameter is a handle whose buffer is in ``buffer_map``; in
    0.26 and 0.27 the parameter is the buffer itself. The buffers alone are
    ``[b for b in param_buffers(func) if b is not None]``.
    """
    return list(_from_tvm_shim("param_buffers")(func))


def data_pointer(buf: Any) -> Any:
    """The pointer to ``buf``'s first element, as an argument of ``T.call_extern``.

    ``buf.data`` where that is an expression of the element pointer type (0.26,
    0.27: the C codegen declares it ``float*``). Where it is a handle variable
    (0.25), the C host codegen declares that variable ``void*``, which a C++
    compiler (g++ builds the exported library) does not pass to a ``float*``
    parameter; there it is ``T.address_of(buf[0, ..., 0])``, printed
    ``&(((float*)x)[0])``.
    """
    tirx = _tirx()
    data = buf.data
    if not isinstance(data, tirx.Var):
        return data
    zeros = [tirx.const(0, dtype_of_expr(d)) for d in buf.shape]
    return tirx.address_of(tirx.BufferLoad(buf, zeros))


def points_to(arg: Any, buf: Any) -> bool:
    """Whether ``arg`` (an argument of ``T.call_extern``, say) is ``buf``'s data pointer:
    what :func:`data_pointer` gives for ``buf``, or ``buf.data`` itself.

    Not ``arg.same_as(buf.data)`` alone: 0.26 and 0.27 make ``buf.data`` a
    ``tirx.buffer_data(buf)`` call anew at each use, and 0.25's
    :func:`data_pointer` is ``T.address_of(buf[0, ..., 0])``.
    """
    if arg.same_as(buf.data):
        return True
    name = getattr(getattr(arg, "op", None), "name", "")
    if name == "tirx.buffer_data":
        return bool(arg.args[0].same_as(buf))
    if name == "tirx.address_of":
        load = arg.args[0]
        tirx = _tirx()
        return (
            isinstance(load, _load_class())
            and buffer_of(load).same_as(buf)
            and all(isinstance(i, tirx.IntImm) and int(i) == 0 for i in load.indices)
        )
    return False


def dtype_of_expr(expr: Any) -> str:
    """A TIR expression's type as a string (``expr.dtype``; ``expr.ty`` where a TVM
    has moved it), ``"int64"`` or ``"float32x16"``."""
    dt = getattr(expr, "dtype", None)
    return str(dt if dt is not None else expr.ty)


def vars_in(expr: Any) -> list[Any]:
    """Every ``tirx.Var`` under ``expr`` (an expression or a statement), in post order.

    A variable used twice is listed twice (see :func:`nodes_in`).
    """
    return nodes_in(expr, _tirx().Var)


def nodes_in(expr: Any, kind: type) -> list[Any]:
    """Every node of class ``kind`` under ``expr`` (an expression or a statement),
    in post order (``nodes_in(func.body, SBlock)``: the blocks of a PrimFunc).

    A node is listed each time it occurs, on every TVM: a load ``x[i]`` that an
    expression reads twice is two loads even where TVM built it once and shares
    the object. (tvm-ffi's ``structural_walk``, 0.26 on, lists each occurrence;
    0.25's ``post_order_visit`` visits each object once, so 0.25 walks with
    ``ir_transform`` instead, whose callback sees every occurrence.)
    """
    import tvm_ffi

    found: list[Any] = []
    walk = getattr(tvm_ffi, "structural_walk", None)
    if walk is not None:
        walk(expr, (kind, found.append), order="post")
        return found
    # the callback returns None: nothing is replaced
    _ir_transform(expr, lambda node: found.append(node) if isinstance(node, kind) else None)
    return found


def _ir_transform(node: Any, post: Any) -> Any:
    """TIR's ``ir_transform(node, None, post)`` of a statement or an expression: where
    it takes statements only (0.25), an expression is transformed inside a
    ``T.evaluate`` of it and taken back out; ``post`` sees no statement then, as the
    wrapper is the only one. The fallback of :func:`nodes_in` and
    :func:`umahub.plugin.rewrite` where tvm-ffi has no structural walk."""
    tirx = _tirx()
    if not isinstance(node, tirx.PrimExpr):
        return tirx.stmt_functor.ir_transform(node, None, post)

    def expressions_only(n: Any) -> Any:
        return None if isinstance(n, tirx.Stmt) else post(n)

    return tirx.stmt_functor.ir_transform(tirx.Evaluate(node), None, expressions_only).value


# ----------------------------------------------------------------- functions: Relax


def type_of(expr: Any) -> Any:
    """The Relax type of an expression (``expr.ty``; ``expr.struct_info`` in 0.25)."""
    return _from_tvm_shim("type_of")(expr)


def ret_type(func: Any) -> Any:
    """The return type of a Relax function (``ret_ty``; ``ret_struct_info`` in 0.25)."""
    return _from_tvm_shim("ret_type")(func)


def type_args(call: Any) -> Any:
    """The type arguments of a Relax call (``ty_args``; ``sinfo_args`` in 0.25)."""
    return _from_tvm_shim("type_args")(call)


def name_of(var: Any) -> str:
    """The name of a Relax variable or global variable (``name_hint``, or ``name``)."""
    return str(_from_tvm_shim("name_of")(var))
