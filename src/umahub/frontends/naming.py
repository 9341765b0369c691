"""Operator names for imported models: spans carrying the source model's node names.

TVM's frontends keep no names; the builder made by :func:`naming_builder`
puts the name of the source node being converted on every call it emits (see
the package's docs for which names), and :func:`name_variables` binds each
operator to a variable of that name too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["name_variables", "naming_builder"]


def naming_builder() -> Any:
    """A BlockBuilder that spans what it emits with the name of the node being converted.

    The frontends build ``main`` through one BlockBuilder, and hand it nested
    expressions (``add(matmul(a, permute_dims(b)), c)``) whose inner calls it
    binds to variables of its own. TVM's normalizer rebuilds a call whose
    arguments it bound without the call's span, so this builder binds the
    inner calls itself, innermost first, each with a span: the span it had
    (a call made for an earlier node, which ONNX converters may hand on
    unbound) or the current node's.

    Such an unbound call is bound once, however many later nodes read it:
    TVM's normalizer does the same, and binding it at every read would
    compute the node once per reader (a ResNet's max pooling, read by a
    convolution and a residual add, ran twice).
    """
    from tvm import relax

    from umahub._tvm import type_args
    from umahub.ir import name_span

    class NamingBlockBuilder(relax.BlockBuilder):
        span: Any = None  # the current node's span; None between nodes
        bound_calls: dict | None = None  # call -> its variable, in the current block

        def _spanned(self, call):
            args = [self._bound(a) for a in call.args]
            span = call.span if call.span is not None else self.span
            if span is call.span and all(a.same_as(b) for a, b in zip(args, call.args)):
                return call
            return relax.Call(call.op, args, call.attrs, type_args(call), span)

        def _bound(self, expr):
            """``expr`` as an argument: its calls bound to variables, with spans."""
            if isinstance(expr, relax.Call):
                if self.bound_calls is None:
                    self.bound_calls = {}
                var = self.bound_calls.get(expr)  # keyed by the object, not its structure
                if var is None:
                    var = super().emit(super().normalize(self._spanned(expr)))
                    self.bound_calls[expr] = var
                return var
            if isinstance(expr, relax.Tuple):
                fields = [self._bound(f) for f in expr.fields]
                if all(a.same_as(b) for a, b in zip(fields, expr.fields)):
                    return expr
                return relax.Tuple(fields)
            if isinstance(expr, relax.TupleGetItem):
                inner = self._bound(expr.tuple_value)
                if inner.same_as(expr.tuple_value):
                    return expr
                return relax.TupleGetItem(inner, expr.index)
            return expr

        def normalize(self, expr):
            if self.span is not None:
                if isinstance(expr, relax.Call):
                    expr = self._spanned(expr)
                elif isinstance(expr, (relax.Tuple, relax.TupleGetItem)):
                    expr = self._bound(expr)
            return super().normalize(expr)

        def emit(self, expr, name_hint=""):
            if self.span is not None:
                expr = self.normalize(expr)
            return super().emit(expr, name_hint)

        # A variable is read only inside its block: a new or ended block forgets them.
        def _begin_dataflow_block(self):
            self.bound_calls = None
            return super()._begin_dataflow_block()

        def _begin_binding_block(self):
            self.bound_calls = None
            return super()._begin_binding_block()

        def _end_block(self):
            self.bound_calls = None
            return super()._end_block()

        @contextlib.contextmanager
        def naming(self, name: str) -> Iterator[None]:
            self.span = name_span(name)
            try:
                yield
            finally:
                self.span = None

    return NamingBlockBuilder()


def name_variables(mod: Any) -> Any:
    """``mod`` with every operator call of ``main`` bound to a variable named by its span.

    umahub's partitioner names an operator by its span, or else by its
    variable; naming both keeps the names through every pass that rebuilds
    calls or variables.
    """
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    from umahub._tvm import remap_var, type_of
    from umahub.ir import span_name

    @mutator
    class Rename(PyExprMutator):
        def visit_var_binding_(self, binding):
            value = self.visit_expr(binding.value)
            name = None
            if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
                name = span_name(value)
            if name is None:
                return super().visit_var_binding_(binding)
            kind = relax.DataflowVar if isinstance(binding.var, relax.DataflowVar) else relax.Var
            var = kind(name, type_of(binding.var))
            self.builder_.emit_normalized(relax.VarBinding(var, value))
            remap_var(self, binding.var, var)

    main_gv = mod.get_global_var("main")
    updated = Rename().visit_expr(mod[main_gv])
    funcs = dict(mod.functions)
    funcs[main_gv] = updated
    return tvm.IRModule(funcs, attrs=mod.attrs, global_infos=mod.global_infos)


# ---------------------------------------------------------------------------- ONNX
