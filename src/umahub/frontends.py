"""Where a model comes from: a Relax module, PyTorch, ONNX, the zoo, a TVMScript file.

:func:`to_relax` is what ``Hub.compile`` and ``Hub.explain`` call first; it
takes

* a Relax ``tvm.IRModule`` with a ``main`` (returned as it is);
* a ``torch.export.ExportedProgram``, through TVM's
  ``from_exported_program`` (PyTorch is the optional extra ``umahub[torch]``);
* an ``onnx.ModelProto``, through TVM's ``from_onnx`` (the extra
  ``umahub[onnx]``).

Both imports bind the weights as constants (``main`` takes the model's inputs
only) and return a single output as a tensor, not a 1-tuple. ``torch`` and
``onnx`` are imported only when such a model is given.

:func:`load_model` is what ``umahub compile MODEL`` and ``umahub explain
MODEL`` call: a model-zoo name (``umahub.models.names()``), a ``.py`` file
holding a TVMScript ``IRModule`` (the module-level ``tvm.IRModule`` with a
``main``; if there are several, the one named ``Module``, ``mod`` or
``model``), an ``.onnx`` file, or a ``.pt2`` file written by
``torch.export.save``.

Operator names
--------------

TVM's frontends (0.25-0.27) keep no names: every operator is bound to a
variable ``lv``, ``lv1``, ... and carries no span. umahub names each operator
(its span, and the variable it is bound to) after the source node it came
from, so that pins and the report speak the model's language:

* ONNX: the node's ``name``, or its first output's name when the node is
  unnamed.
* PyTorch: the path of the ``torch.nn`` layer the operator belongs to, as in
  ``model.named_modules()``: ``layer1.0.conv1``, ``features.3.block.1``,
  ``encoder.layers.encoder_layer_0.self_attention``. A layer called twice (the
  ``relu`` of torchvision's ``BasicBlock``) names the operators of both calls.
  An operator written in a model's own ``forward`` (``out += identity``,
  ``torch.flatten(x, 1)``) is ``<module path>.<torch function>``, numbered
  from the second call of that function in that module: ``layer1.0.add``,
  ``layer1.0.add_1``; at the top, just ``flatten``. (Taken from the FX node's
  ``meta["nn_module_stack"]`` and ``meta["torch_fn"]``; a node without them
  keeps its FX name.)

When the importer turns one node into several Relax operators (ONNX's
``Gemm`` into ``permute_dims``, ``matmul``, ``add``; a convolution with bias
into ``conv2d`` and ``add``), all of them get the node's name: a pin by the
node's name places all of them, and the report shows one row per operator
with the same name and each its own op. A glob (``"layer1.*"``) pins a whole
block.
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import logging
import re
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from umahub.errors import UmahubError, UnknownModelError

__all__ = ["from_exported_program", "from_onnx", "load_model", "to_relax"]

ACCEPTED = (
    "a Relax tvm.IRModule with a 'main' function, a torch.export.ExportedProgram "
    "(torch.export.export(model, example_inputs)) or an onnx.ModelProto (onnx.load(path))"
)


# ---------------------------------------------------------------------------- dispatch


def _is_onnx_model(model: Any) -> bool:
    cls = type(model)
    return cls.__name__ == "ModelProto" and cls.__module__.split(".")[0] == "onnx"


def _is_exported_program(model: Any) -> bool:
    torch = sys.modules.get("torch")  # an ExportedProgram exists only if torch is imported
    export = getattr(torch, "export", None) if torch is not None else None
    cls = getattr(export, "ExportedProgram", None)
    return cls is not None and isinstance(model, cls)


def _is_torch_module(model: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(model, torch.nn.Module)


def to_relax(model: Any) -> Any:
    """The Relax ``tvm.IRModule`` of ``model``, with its operators named (see the module doc).

    Args:
        model: a Relax ``tvm.IRModule`` (returned unchanged), a
            ``torch.export.ExportedProgram`` or an ``onnx.ModelProto``.

    Raises:
        UmahubError: ``model`` is none of these (the message names its type and
            what is accepted), or TVM's frontend could not import it.
    """
    import tvm

    if isinstance(model, tvm.IRModule):
        return model
    if _is_exported_program(model):
        return from_exported_program(model)
    if _is_onnx_model(model):
        return from_onnx(model)
    kind = f"{type(model).__module__}.{type(model).__qualname__}"
    hint = ""
    if _is_torch_module(model):
        hint = "; export the module first: torch.export.export(model.eval(), example_inputs)"
    elif isinstance(model, (str, Path)):
        hint = "; to load a file or a zoo model, use umahub.frontends.load_model(path)"
    raise UmahubError(f"cannot compile a {kind}: expected {ACCEPTED}{hint}")


# ---------------------------------------------------------------------------- naming


def _span(name: str) -> Any:
    import tvm

    return tvm.ir.Span(tvm.ir.SourceName(name), 0, 0, 0, 0)


def _naming_builder() -> Any:
    """A BlockBuilder that spans what it emits with the name of the node being converted.

    The frontends build ``main`` through one BlockBuilder, and hand it nested
    expressions (``add(matmul(a, permute_dims(b)), c)``) whose inner calls it
    binds to variables of its own. TVM's normalizer rebuilds a call whose
    arguments it bound without the call's span, so this builder binds the
    inner calls itself, innermost first, each with a span: the span it had
    (a call made for an earlier node, which ONNX converters may hand on
    unbound) or the current node's.
    """
    from tvm import relax

    from umahub._tvm import type_args

    class NamingBlockBuilder(relax.BlockBuilder):
        span: Any = None  # the current node's span; None between nodes

        def _spanned(self, call):
            args = [self._bound(a) for a in call.args]
            span = call.span if call.span is not None else self.span
            if span is call.span and all(a.same_as(b) for a, b in zip(args, call.args)):
                return call
            return relax.Call(call.op, args, call.attrs, type_args(call), span)

        def _bound(self, expr):
            """``expr`` as an argument: its calls bound to variables, with spans."""
            if isinstance(expr, relax.Call):
                return super().emit(super().normalize(self._spanned(expr)))
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

        @contextlib.contextmanager
        def naming(self, name: str) -> Iterator[None]:
            self.span = _span(name)
            try:
                yield
            finally:
                self.span = None

    return NamingBlockBuilder()


def _span_name(expr: Any) -> str | None:
    span = getattr(expr, "span", None)
    if span is not None and span.source_name is not None:
        return str(span.source_name.name)
    return None


def _name_variables(mod: Any) -> Any:
    """``mod`` with every operator call of ``main`` bound to a variable named by its span.

    umahub's partitioner names an operator by its span, or else by its
    variable; naming both keeps the names through every pass that rebuilds
    calls or variables.
    """
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    from umahub._tvm import type_of

    @mutator
    class Rename(PyExprMutator):
        def visit_var_binding_(self, binding):
            value = self.visit_expr(binding.value)
            name = None
            if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
                name = _span_name(value)
            if name is None:
                return super().visit_var_binding_(binding)
            kind = relax.DataflowVar if isinstance(binding.var, relax.DataflowVar) else relax.Var
            var = kind(name, type_of(binding.var))
            self.builder_.emit_normalized(relax.VarBinding(var, value))
            try:
                self.set_var_remap(binding.var, var)  # keyed by the variable (0.26, 0.27)
            except TypeError:
                self.set_var_remap(binding.var.vid, var)  # by its id (0.25)

    main_gv = mod.get_global_var("main")
    updated = Rename().visit_expr(mod[main_gv])
    funcs = dict(mod.functions)
    funcs[main_gv] = updated
    return tvm.IRModule(funcs, attrs=mod.attrs, global_infos=mod.global_infos)


# ---------------------------------------------------------------------------- ONNX


def _onnx_opset(model: Any) -> int:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return 1


def _onnx_importer() -> Any:
    """TVM's ONNX importer, naming each node's operators (None: this TVM's differs)."""
    try:
        from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter
    except ImportError:
        return None

    class NamingImporter(ONNXGraphImporter):
        def __init__(self) -> None:
            super().__init__({}, "float32", keep_params_in_input=False)
            self.bb = _naming_builder()

        def _parse_value_proto(self, value_proto):
            name = super()._parse_value_proto(value_proto)
            if not name and getattr(value_proto, "op_type", None) and value_proto.output:
                return value_proto.output[0]  # an unnamed node: its first output
            return name

        def _convert_operator(self, op_name, inputs, attrs, opset):
            name = attrs.get("tvm_custom", {}).get("name") or op_name
            with self.bb.naming(name):
                return super()._convert_operator(op_name, inputs, attrs, opset)

    if not all(hasattr(ONNXGraphImporter, n) for n in ("_parse_value_proto", "_convert_operator")):
        return None
    return NamingImporter


def from_onnx(model: Any) -> Any:
    """Import an ``onnx.ModelProto`` into Relax, weights as constants, operators named.

    Raises:
        UmahubError: TVM's ONNX frontend failed (an unsupported operator, an
            invalid graph); the message says which.
    """
    importer = _onnx_importer()
    try:
        if importer is not None:
            try:
                instance = importer()
            except TypeError:  # another TVM's constructor: import without names
                instance = None
            if instance is not None:
                return _name_variables(instance.from_onnx(model.graph, _onnx_opset(model)))
        from tvm.relax.frontend.onnx import from_onnx as tvm_from_onnx

        return tvm_from_onnx(model, keep_params_in_input=False)
    except UmahubError:
        raise
    except Exception as exc:
        raise UmahubError(
            f"TVM's ONNX frontend could not import the model: {type(exc).__name__}: {exc}"
        ) from exc


# ---------------------------------------------------------------------------- PyTorch


def _torch_namer() -> Any:
    """``name(fx_node)``: the name of a node's operators (see the module doc)."""
    counts: collections.Counter = collections.Counter()
    calls: dict[tuple[str, str], str] = {}

    def name(node: Any) -> str:
        meta = getattr(node, "meta", {})
        stack = meta.get("nn_module_stack")
        if not stack:
            return node.name
        path, kind = list(stack.values())[-1]
        qualified = kind if isinstance(kind, str) else f"{kind.__module__}.{kind.__qualname__}"
        if path and qualified.startswith("torch.nn."):
            return path  # a torch.nn layer: its operators are the layer's
        # A call in a model's own forward: named after the torch function called
        # (torch_fn survives decomposition: every aten node of one call shares it).
        function = meta.get("torch_fn")
        if function:
            call, op = str(function[0]), str(function[1]).rsplit(".", 1)[-1].strip("_")
        else:
            call, op = node.name, re.sub(r"_\d+$", "", node.name)
        key = f"{path}.{op}" if path else op
        if (key, call) not in calls:
            counts[key] += 1
            calls[key, call] = key if counts[key] == 1 else f"{key}_{counts[key] - 1}"
        return calls[key, call]

    return name


class _NamingConverters(dict):
    """The importer's converter table, each converter run under its node's name."""

    def __init__(self, table: dict, builder: Any, name: Any):
        super().__init__(table)
        self._builder, self._name = builder, name

    def __getitem__(self, key):
        convert = super().__getitem__(key)

        def named(node, *rest):
            builder = self._builder()
            if builder is None or not hasattr(builder, "naming"):
                return convert(node, *rest)
            with builder.naming(self._name(node)):
                return convert(node, *rest)

        return named


def _torch_importer() -> Any:
    """TVM's ExportedProgram importer, naming each node's operators (None: this TVM's differs)."""
    try:
        from tvm.relax.frontend.torch.exported_program_translator import (
            ExportedProgramImporter,
        )
    except ImportError:
        return None

    class NamingImporter(ExportedProgramImporter):
        @property
        def block_builder(self):
            return self.__dict__.get("_umahub_builder")

        @block_builder.setter
        def block_builder(self, builder):
            from tvm import relax

            if type(builder) is relax.BlockBuilder:  # the fresh one of each import
                builder = _naming_builder()
            self.__dict__["_umahub_builder"] = builder

        def __init__(self) -> None:
            super().__init__()
            self.convert_map = _NamingConverters(
                self.convert_map, lambda: self.block_builder, _torch_namer()
            )

    if not hasattr(ExportedProgramImporter, "from_exported_program"):
        return None
    return NamingImporter


@contextlib.contextmanager
def _quiet_torch() -> Iterator[None]:
    with warnings.catch_warnings():
        # torch's own run_decompositions deep-copies a deprecated pytree class.
        warnings.filterwarnings("ignore", message=r".*LeafSpec.* is deprecated")
        yield


@contextlib.contextmanager
def _quiet_logger(name: str) -> Iterator[None]:
    """Silence a logger: torch.export.load logs a traceback before it raises."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def from_exported_program(program: Any) -> Any:
    """Import a ``torch.export.ExportedProgram`` into Relax, weights as constants, named.

    A model with one output gives a ``main`` that returns it as a tensor.

    Raises:
        UmahubError: TVM's PyTorch frontend failed (an unsupported operator);
            the message says which.
    """
    try:
        with _quiet_torch():
            importer = _torch_importer()
            if importer is not None:
                program = program.run_decompositions()
                mod = importer().from_exported_program(
                    program,
                    keep_params_as_input=False,
                    unwrap_unit_return_tuple=True,
                    no_bind_return_tuple=False,
                    custom_convert_map=None,
                )
                return _name_variables(mod)
            from tvm.relax.frontend.torch import from_exported_program as tvm_from_program

            return tvm_from_program(
                program, keep_params_as_input=False, unwrap_unit_return_tuple=True
            )
    except UmahubError:
        raise
    except Exception as exc:
        raise UmahubError(
            f"TVM's PyTorch frontend could not import the model: {type(exc).__name__}: {exc}"
        ) from exc


# ---------------------------------------------------------------------------- files


def _from_python(path: Path) -> Any:
    import tvm

    name = f"umahub_model_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # TVMScript reads the source through the module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise UmahubError(
            f"{path}: executing the file failed: {type(exc).__name__}: {exc}"
        ) from exc
    found = {
        name: value
        for name, value in vars(module).items()
        if isinstance(value, tvm.IRModule)
        and "main" in [gv.name_hint for gv in value.get_global_vars()]
    }
    if not found:
        raise UmahubError(
            f"{path}: no tvm.IRModule with a 'main' function at module level "
            "(write one with @tvm.script.ir_module)"
        )
    for preferred in ("Module", "mod", "model"):
        if preferred in found:
            return found[preferred]
    if len(found) > 1:
        raise UmahubError(
            f"{path}: several IRModules ({', '.join(sorted(found))}); name the one "
            "to compile 'Module', 'mod' or 'model'"
        )
    return next(iter(found.values()))


def _from_onnx_file(path: Path) -> Any:
    try:
        import onnx
    except ImportError:
        raise UmahubError(
            f"{path}: reading ONNX needs the 'onnx' package: pip install 'umahub[onnx]'"
        ) from None
    try:
        model = onnx.load(str(path))
    except Exception as exc:
        raise UmahubError(
            f"{path}: not a readable ONNX model ({type(exc).__name__}: {exc})"
        ) from exc
    if not model.graph.node and not model.graph.output:
        raise UmahubError(f"{path}: not a readable ONNX model (no graph in it)")
    try:
        return from_onnx(model)
    except UmahubError as exc:
        raise UmahubError(f"{path}: {exc}") from exc.__cause__


def _from_pt2(path: Path) -> Any:
    try:
        import torch
    except ImportError:
        raise UmahubError(
            f"{path}: reading a torch.export program needs PyTorch: pip install 'umahub[torch]'"
        ) from None
    try:
        with _quiet_torch(), _quiet_logger("torch.export"):
            program = torch.export.load(str(path))
    except Exception as exc:
        raise UmahubError(
            f"{path}: not a readable torch.export program, as torch.export.save writes "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    try:
        return from_exported_program(program)
    except UmahubError as exc:
        raise UmahubError(f"{path}: {exc}") from exc.__cause__


def load_model(spec: str) -> Any:
    """The Relax IRModule named by ``spec``: zoo name, ``.py``, ``.onnx`` or ``.pt2`` path.

    Raises:
        UmahubError: a missing, unreadable or unimportable file, or a missing
            optional package (the message says which extra to install).
        UnknownModelError: neither a file nor a zoo name.
    """
    path = Path(spec)
    loaders = {".py": _from_python, ".onnx": _from_onnx_file, ".pt2": _from_pt2}
    if path.suffix in loaders:
        if not path.is_file():
            raise UmahubError(f"{spec}: no such file")
        return loaders[path.suffix](path)
    import umahub.models as zoo

    try:
        return zoo.get(spec)
    except UnknownModelError as exc:
        raise UnknownModelError(
            f"{exc}; or give a .py (TVMScript), .onnx or .pt2 (torch.export) file"
        ) from None
