"""What a hook returns, checked against its specification before umahub uses it.

A plugin is code from a vendor umahub does not know. Whatever its hooks return
is checked here, at compile time, so that a wrong answer becomes a
:class:`~umahub.errors.PluginOutputError` naming the hook and what was wrong
(and the pipeline names the plugin and the partition, and applies
``on-error``), never a raw TVM exception, a crash at run time or a silent
wrong number:

* ``umahub_patterns``: a list of FusionPatterns or ``(name, pattern[,
  annotations[, check]])`` tuples, names ``"<accelerator>.<what>"``, patterns
  and annotations that are ``tvm.relax.dpl`` patterns, a callable check;
* ``umahub_relax_to_tir``: an IRModule with a PrimFunc named by the
  partition's symbol whose parameters are the partition's inputs then its
  outputs, of the partition's shapes and dtypes;
* ``umahub_tir_passes``: a list of ``tvm.transform.Pass``;
* ``umahub_codegen``: a TVM runtime module that defines the partition's symbol;
  for a device accelerator (``Accelerator(runtime=...)``), a
  :class:`~umahub.plugin.device.DeviceProgram` whose metadata is JSON;
* ``umahub_tuning_space``: None or a :class:`~umahub.plugin.tuning.TuningSpace`.

A pattern ``check`` that raises is handled where checks run
(:mod:`umahub.compiler.placement`); wrong numbers are :mod:`umahub.compiler.stages.verify`'s job.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from umahub.errors import PluginOutputError

__all__ = [
    "checked_accelerators",
    "checked_codegen",
    "checked_device_program",
    "checked_passes",
    "checked_patterns",
    "checked_relax_to_tir",
    "checked_schedule",
    "checked_tuning_space",
]


def _what(value: Any) -> str:
    """A returned value as an error shows it: its type, and its repr when that is short
    (a printed IRModule or array would say less than its type)."""
    if value is None:
        return "None"
    kind = type(value)
    name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"
    text = repr(value)
    if len(text) > 40 or "\n" in text:
        return name
    return f"{name} {text}"


def checked_accelerators(result: Any) -> list[Any]:
    """The accelerators ``umahub_accelerators`` returned.

    Raises:
        PluginOutputError: not a list of :class:`umahub.Accelerator` (None included:
            a plugin that declares none returns ``[]``).
    """
    from umahub.plugin.accelerator import Accelerator

    if not isinstance(result, (list, tuple)) or not all(isinstance(a, Accelerator) for a in result):
        raise PluginOutputError(
            f"umahub_accelerators returned {_what(result)}: expected a list of "
            "umahub.Accelerator ([] for a plugin that declares none)"
        )
    return list(result)


def checked_patterns(
    accelerator: Any, result: Any, own: bool = False
) -> list[tuple[str, Any, dict, Any]]:
    """``(name, pattern, annotations, check)`` of each pattern an implementation returned.

    ``own``: the implementation is of the plugin that declared ``accelerator``,
    for which None is not an answer (``[]`` claims nothing).

    Raises:
        PluginOutputError: the result or one of its patterns is malformed.
    """
    from tvm import relax
    from tvm.relax.dpl import DFPattern

    if result is None and own:
        raise PluginOutputError(
            f"umahub_patterns returned None for '{accelerator.name}', the plugin's own "
            "accelerator: return its patterns, or [] to claim nothing"
        )
    if result is None:
        return []
    if not isinstance(result, (list, tuple)):
        raise PluginOutputError(
            f"umahub_patterns returned {_what(result)} for '{accelerator.name}': expected a "
            "list of patterns or None"
        )
    out = []
    for item in result:
        if isinstance(item, relax.transform.FusionPattern):
            name, pattern = str(item.name), item.pattern
            annotations, check = dict(item.annotation_patterns), item.check
        elif isinstance(item, tuple) and 2 <= len(item) <= 4:
            name, pattern = item[0], item[1]
            annotations = item[2] if len(item) > 2 and item[2] else {}
            check = item[3] if len(item) > 3 else None
        else:
            raise PluginOutputError(
                f"umahub_patterns for '{accelerator.name}' returned {_what(item)}: expected a "
                "FusionPattern or a tuple (name, pattern[, annotations[, check]])"
            )
        if not isinstance(name, str) or not name.startswith(f"{accelerator.name}."):
            raise PluginOutputError(
                f"umahub_patterns for '{accelerator.name}' returned a pattern named {name!r}: "
                f"pattern names must start with '{accelerator.name}.' (e.g. "
                f"'{accelerator.name}.{str(name).rsplit('.', 1)[-1]}')"
            )
        if not isinstance(pattern, DFPattern):
            raise PluginOutputError(
                f"umahub_patterns for '{accelerator.name}': pattern '{name}' is "
                f"{_what(pattern)}, not a tvm.relax.dpl pattern (is_op(...), wildcard(), ...)"
            )
        if not isinstance(annotations, Mapping) or not all(
            isinstance(v, DFPattern) for v in annotations.values()
        ):
            raise PluginOutputError(
                f"umahub_patterns for '{accelerator.name}': the annotations of pattern '{name}' "
                f"must map names to tvm.relax.dpl patterns, got {_what(annotations)}"
            )
        if check is not None and not callable(check):
            raise PluginOutputError(
                f"umahub_patterns for '{accelerator.name}': the check of pattern '{name}' is "
                f"{_what(check)}, not a function of a PatternCheckContext"
            )
        out.append((name, pattern, dict(annotations), check))
    return out


def _tensor_types(ty: Any) -> list[Any]:
    from umahub._tvm import TensorType, TupleType

    if isinstance(ty, TupleType):
        return [t for f in ty.fields for t in _tensor_types(f)]
    return [ty] if isinstance(ty, TensorType) else []


def _static(dims: Any) -> list[int | None]:
    return [int(d.value) if hasattr(d, "value") else None for d in dims]


def checked_relax_to_tir(result: Any, symbol: str, function: Any) -> Any:
    """The IRModule a ``umahub_relax_to_tir`` implementation returned, checked.

    Its PrimFunc ``symbol`` must take one buffer per input of the partition
    (``function``'s parameters) and then one per output, in that order, each of
    the same dtype and (where both are static) the same shape.

    Raises:
        PluginOutputError: what is missing or differs, parameter by parameter.
    """
    import tvm

    from umahub._tvm import name_of, param_buffers, ret_type, type_of

    if not isinstance(result, tvm.IRModule):
        raise PluginOutputError(
            f"umahub_relax_to_tir returned {_what(result)}: expected a tvm.IRModule with a "
            f"PrimFunc named '{symbol}', or None for the default lowering"
        )
    prims = {name_of(gv): f for gv, f in result.functions.items()}
    prim = prims.get(symbol)
    tir = getattr(tvm, "tirx", None) or tvm.tir
    if not isinstance(prim, tir.PrimFunc):
        raise PluginOutputError(
            f"umahub_relax_to_tir returned a module without a PrimFunc named '{symbol}' "
            f"(it holds: {', '.join(sorted(prims)) or 'nothing'})"
        )
    wanted = [("input", type_of(p)) for p in function.params]
    wanted += [("output", t) for t in _tensor_types(ret_type(function))]
    if len(prim.params) != len(wanted):
        raise PluginOutputError(
            f"umahub_relax_to_tir: PrimFunc '{symbol}' takes {len(prim.params)} parameter(s); "
            f"the partition has {sum(k == 'input' for k, _ in wanted)} input(s) and "
            f"{sum(k == 'output' for k, _ in wanted)} output(s), so it must take {len(wanted)} "
            "(inputs, then outputs)"
        )
    for i, (buffer, (kind, ty)) in enumerate(zip(param_buffers(prim), wanted)):
        if buffer is None or not hasattr(ty, "dtype"):
            continue  # a scalar parameter, or a non-tensor input: nothing to compare
        got = (_static(buffer.shape), str(buffer.dtype))
        want = (_static(ty.shape.values) if ty.shape is not None else None, str(ty.dtype))
        same_shape = want[0] is None or (
            len(got[0]) == len(want[0])
            and all(a is None or b is None or a == b for a, b in zip(got[0], want[0]))
        )
        if not same_shape or got[1] != want[1]:
            raise PluginOutputError(
                f"umahub_relax_to_tir: parameter {i} of PrimFunc '{symbol}' ({kind}) is "
                f"{_shape_text(got)}, but the partition's {kind} is {_shape_text(want)}"
            )
    return result


def _shape_text(shape_dtype: tuple[Any, str]) -> str:
    shape, dtype = shape_dtype
    dims = "?" if shape is None else ", ".join("?" if d is None else str(d) for d in shape)
    return f"({dims}) {dtype}"


def checked_schedule(result: Any) -> str | None:
    """What a ``umahub_schedule`` implementation says it did: None, or a short description.

    Raises:
        PluginOutputError: anything else. A module or a schedule returned is the
            sign of work done on a copy, which umahub never sees: the hook
            changes the schedule it is given, in place.
    """
    import tvm

    if result is None or isinstance(result, str):
        return result
    if isinstance(result, (tvm.IRModule, tvm.s_tir.Schedule)):
        raise PluginOutputError(
            f"umahub_schedule returned a tvm {type(result).__name__}: a schedule hook changes the "
            "schedule it is given, in place (what it returns is not used, so work done on a "
            "copy is lost); return None or a short description of what it did"
        )
    raise PluginOutputError(
        f"umahub_schedule returned {_what(result)}: expected None or a short description of "
        "what it did (a str)"
    )


def checked_passes(result: Any, phase: int) -> list[Any]:
    """The passes a ``umahub_tir_passes`` implementation returned for ``phase``, checked.

    Raises:
        PluginOutputError: not a list of ``tvm.transform.Pass``.
    """
    import tvm

    if result is None:
        return []
    items = list(result) if isinstance(result, (list, tuple)) else [result]
    bad = [p for p in items if not isinstance(p, tvm.transform.Pass)]
    if not isinstance(result, (list, tuple)) or bad:
        raise PluginOutputError(
            f"umahub_tir_passes returned {_what(bad[0] if bad else result)} for phase {phase}: "
            "expected a list of tvm.transform.Pass (e.g. tvm.tirx.transform.prim_func_pass)"
        )
    return items


def checked_codegen(result: Any, symbol: str, kind_of: Callable[[Any], str]) -> Any:
    """The runtime module a ``umahub_codegen`` implementation returned, checked.

    It must be a ``tvm.runtime.Module`` that defines ``symbol`` (for a C source
    module: a definition of ``symbol`` or of TVM's ``__tvm_ffi_<symbol>`` in
    its source).

    Raises:
        PluginOutputError: not a module, or no function of that name.
    """
    import tvm

    if not isinstance(result, tvm.runtime.Module):
        raise PluginOutputError(
            f"umahub_codegen returned {_what(result)}: expected a tvm.runtime.Module (e.g. "
            "from tvm.tirx.build) or None for the default codegen"
        )
    names = (symbol, f"__tvm_ffi_{symbol}")
    if kind_of(result) == "c":
        source = result.inspect_source()
        defined = re.search(rf"\b(?:{'|'.join(names)})\s*\([^;{{]*\)\s*\{{", source)
        found = defined is not None
    else:
        found = any(_implements(result, n) for n in names)
    if not found:
        raise PluginOutputError(
            f"umahub_codegen returned a {kind_of(result) or 'runtime'} module that defines no "
            f"function '{symbol}' (the partition's symbol, context.symbol)"
        )
    return result


def checked_device_program(result: Any, accelerator: str) -> Any:
    """The program a device accelerator's ``umahub_codegen`` returned, checked.

    Raises:
        PluginOutputError: not a DeviceProgram (None included: a device has no
            default codegen), empty, or metadata that JSON cannot hold.
    """
    import json

    from umahub.plugin.device import DeviceProgram

    if not isinstance(result, DeviceProgram):
        raise PluginOutputError(
            f"umahub_codegen returned {_what(result)} for '{accelerator}', a device of its own "
            "(Accelerator(runtime=...)): expected a umahub.plugin.DeviceProgram (a device has no "
            "default codegen)"
        )
    if not result.data:
        raise PluginOutputError("umahub_codegen returned a DeviceProgram with no data")
    try:
        json.dumps(result.metadata, allow_nan=False)
    except (TypeError, ValueError) as exc:
        where, value = _not_json(result.metadata, "metadata") or ("metadata", result.metadata)
        raise PluginOutputError(
            f"umahub_codegen returned a DeviceProgram whose {where} is {_what(value)}, "
            "which JSON cannot hold: metadata takes str, int, float (finite), bool, None, and "
            "lists and dicts (str keys) of them"
        ) from exc
    return result


def _not_json(value: Any, where: str) -> tuple[str, Any] | None:
    """The first place in ``value`` that JSON cannot hold, as ``(path, value)``
    (``metadata["made"]``), or None when it all can."""
    import math

    if value is None or isinstance(value, (str, bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (where, value)
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = _not_json(item, f"{where}[{i}]")
            if found:
                return found
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not (key is None or isinstance(key, (str, int, float))):  # json.dumps's keys
                return f"{where} key", key
            found = _not_json(item, f"{where}[{key!r}]")
            if found:
                return found
        return None
    return where, value


def _implements(module: Any, name: str) -> bool:
    try:
        return bool(module.implements_function(name, True))
    except Exception:
        return False


def checked_tuning_space(result: Any) -> Any:
    """The space a ``umahub_tuning_space`` implementation offered: None or a TuningSpace.

    Raises:
        PluginOutputError: anything else (a bare function or a list of rules is
            named, with how to wrap it).
    """
    from umahub.plugin.tuning import TuningSpace

    if result is None or isinstance(result, TuningSpace):
        return result
    hint, given = "", _what(result)
    if callable(result):
        hint = " (a design space is given as TuningSpace(schedule=function))"
        given = f"the function {getattr(result, '__qualname__', type(result).__name__)}"
    elif isinstance(result, (str, list, tuple)):
        hint = " (schedule rules are given as TuningSpace(rules=...))"
    raise PluginOutputError(
        f"umahub_tuning_space returned {given}: expected None or an umahub.plugin.TuningSpace{hint}"
    )
