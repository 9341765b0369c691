"""PyTorch models (``torch.export``) through TVM's ``from_exported_program``, operators
named after the ``torch.nn`` layers."""

from __future__ import annotations

import collections
import contextlib
import logging
import re
import warnings
from collections.abc import Iterator
from typing import Any

from umahub.errors import UmahubError
from umahub.frontends.naming import name_variables, naming_builder

__all__ = ["from_exported_program", "quiet_logger", "quiet_torch"]


def _torch_namer() -> Any:
    """``name(fx_node)``: the name of a node's operators (see the module doc)."""
    counts: collections.Counter = collections.Counter()
    calls: dict[tuple[str, str], str] = {}

    def name(node: Any) -> str:
        if str(getattr(node, "target", "")).startswith("quantized_decomposed."):
            return node.name  # PT2E's Q/DQ belong to no layer: their FX names, as errors say
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
                builder = naming_builder()
            self.__dict__["_umahub_builder"] = builder

        def __init__(self) -> None:
            super().__init__()
            self.convert_map: Any = _NamingConverters(
                self.convert_map, lambda: self.block_builder, _torch_namer()
            )

    if not hasattr(ExportedProgramImporter, "from_exported_program"):
        return None
    return NamingImporter


@contextlib.contextmanager
def quiet_torch() -> Iterator[None]:
    with warnings.catch_warnings():
        # torch's own run_decompositions deep-copies a deprecated pytree class.
        warnings.filterwarnings("ignore", message=r".*LeafSpec.* is deprecated")
        yield


@contextlib.contextmanager
def quiet_logger(name: str) -> Iterator[None]:
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

    A model with one output gives a ``main`` that returns it as a tensor. A
    model quantized by PT2E has its ``quantized_decomposed`` operators imported
    as Relax ``quantize`` / ``dequantize``, its parameters checked first
    (:mod:`umahub.frontends.torch_quantized`). Division and ``Tensor.unfold`` go
    through umahub's converters (:mod:`umahub.frontends.torch_ops`), where TVM's
    frontend lacks them or gets them wrong.

    Raises:
        UmahubError: a malformed quantization parameter (the message names the
            FX node), or TVM's PyTorch frontend failed (an unsupported
            operator); the message says which.
    """
    from umahub.frontends import torch_ops
    from umahub.frontends.torch_quantized import check_program, converters
    from umahub.frontends.torch_rewrites import prepared, rewrite_program

    try:
        with quiet_torch():
            importer = _torch_importer()
            # decomposed here (not only by TVM): the rewrites work on the decomposed program
            program = prepared(program).run_decompositions()
            lifted = rewrite_program(program)
            check_program(program)
            custom = {**torch_ops.converters(), **converters(program)}
            if importer is not None:
                mod = importer().from_exported_program(
                    program,
                    keep_params_as_input=False,
                    unwrap_unit_return_tuple=True,
                    no_bind_return_tuple=False,
                    custom_convert_map=custom,
                )
                return _with_state(name_variables(mod), lifted)
            from tvm.relax.frontend.torch import from_exported_program as tvm_from_program

            mod = tvm_from_program(
                program,
                keep_params_as_input=False,
                unwrap_unit_return_tuple=True,
                custom_convert_map=custom,
            )
            return _with_state(mod, lifted)
    except UmahubError:
        raise
    except Exception as exc:
        raise UmahubError(
            f"TVM's PyTorch frontend could not import the model: {type(exc).__name__}: {exc}"
        ) from exc


def _with_state(mod: Any, lifted: list) -> Any:
    """``main`` with the names of its lifted buffers (attribute ``umahub_state``), if any."""
    if not lifted:
        return mod
    mod["main"] = mod["main"].with_attr("umahub_state", [state.name for state in lifted])
    return mod


# ---------------------------------------------------------------------------- files
