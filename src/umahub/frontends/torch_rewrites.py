"""Rewrites of a decomposed ``torch.export`` program for what TVM's PyTorch frontend refuses
or gets wrong, each fixing a class of programs PyTorch accepts.

Run by :func:`umahub.frontends.torch_import.from_exported_program`. Before
``run_decompositions``, on a copy of the user's program (made only when needed;
:func:`prepared`):

- :func:`merge_aliased_constants`: a tensor reached both as a registered
  buffer and through another attribute (a ``transformers`` ``StaticCache``
  whose layers hold the buffers the wrapper registered) is lifted twice by a
  non-strict export, once as a buffer, once as a constant; PyTorch's own
  ``run_decompositions`` then fails ("expected compiled_fn to be GraphModule").
  The constant's uses take the buffer.
- :func:`without_guards`: the guards on the inputs that ``torch.export`` keeps
  with a program (run by a ``_guards_fn`` call when PyTorch retraces it to
  decompose it) fail if the export had a constant input (``use_cache=True``:
  "name 'L' is not defined"); TVM needs no guards (the compiled model checks
  its inputs' shapes), so they are removed.

After ``run_decompositions`` (on the program the import owns, in place),
before TVM sees it:

- :func:`drop_constant_inputs`: an input that is not a tensor (``use_cache=False``
  passed to ``torch.export.export``) is a constant of the export; TVM's
  frontend wants a tensor for every user input and fails on its shape.
- :func:`lift_mutated_buffers`: a buffer the program writes (a static KV
  cache's ``index_copy_``, a counter's ``copy_``) becomes an input and an
  output of the imported function: TVM's frontend binds buffers as constants
  and drops the writes, so that every call would see the first cache.
- :func:`promote_empty_concat_inputs`: ``torch.cat`` of a 1-D empty tensor with
  tensors of another rank (PyTorch's legacy rule, what a dynamic KV cache
  concatenates on its first step) keeps only the non-empty inputs; TVM's
  ``concat`` requires one rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "LiftedState",
    "drop_constant_inputs",
    "full_index_puts",
    "lift_mutated_buffers",
    "merge_aliased_constants",
    "prepared",
    "promote_empty_concat_inputs",
    "rewrite_program",
    "without_guards",
]


@dataclass(frozen=True)
class LiftedState:
    """A buffer the program writes, lifted to an input and an output of the import.

    Attributes:
        name: the buffer's name in the module (``key_cache_0``).
        initial: its value at export (a numpy array): what the first call passes.
    """

    name: str
    initial: Any


def prepared(program: Any) -> Any:
    """The user's program with the rewrites that must precede ``run_decompositions``.

    ``program`` itself when none applies, else a copy.
    """
    if _guard_calls(program) or _aliases(program):
        import copy

        program = copy.deepcopy(program)
        without_guards(program)
        merge_aliased_constants(program)
    return program


def _guard_calls(program: Any) -> list:
    calls = [n for n in program.graph.nodes if n.op == "call_module" and n.target == "_guards_fn"]
    return calls + list(getattr(program, "_guards_code", None) or ())


def without_guards(program: Any) -> None:
    """Remove a program's guards on its inputs, in place."""
    calls = [n for n in program.graph.nodes if n.op == "call_module" and n.target == "_guards_fn"]
    for node in calls:
        program.graph.erase_node(node)
    if calls:
        program.graph_module.recompile()
    if getattr(program, "_guards_code", None):
        program._guards_code = []


def merge_aliased_constants(program: Any) -> dict[str, str]:
    """Replace every constant that aliases a buffer by that buffer, in place.

    Returns the merged constants' placeholder names, each with its buffer's.
    """
    found = _aliases(program)
    if not found:
        return found
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    for constant, buffer in found.items():
        placeholders[constant].replace_all_uses_with(placeholders[buffer])
        program.graph.erase_node(placeholders[constant])
    signature = program.graph_signature
    for spec in [s for s in signature.input_specs if s.arg.name in found]:
        program.constants.pop(spec.target, None)
    signature.input_specs[:] = [s for s in signature.input_specs if s.arg.name not in found]
    program.graph_module.recompile()
    return found


def _aliases(program: Any) -> dict[str, str]:
    """Placeholder name of each constant aliasing a buffer -> placeholder name of the buffer."""
    from torch.export.graph_signature import InputKind

    signature = program.graph_signature
    buffers = dict(program.named_buffers())
    owner: dict[Any, Any] = {}
    for spec in signature.input_specs:
        if spec.kind is InputKind.BUFFER:
            owner.setdefault(_storage(buffers[spec.target]), spec)
    found = {}
    for spec in signature.input_specs:
        if spec.kind is not InputKind.CONSTANT_TENSOR:
            continue
        value = program.constants.get(spec.target)
        buffer = owner.get(_storage(value)) if value is not None else None
        if buffer is not None and _same_view(value, buffers[buffer.target]):
            found[spec.arg.name] = buffer.arg.name
    return found


def _storage(tensor: Any) -> Any:
    import torch

    if not isinstance(tensor, torch.Tensor):
        return None
    return tensor.untyped_storage().data_ptr()


def _same_view(a: Any, b: Any) -> bool:
    return (
        a.shape == b.shape
        and a.stride() == b.stride()
        and a.storage_offset() == b.storage_offset()
        and a.dtype == b.dtype
    )


def drop_constant_inputs(program: Any) -> list[str]:
    """Remove user inputs that are constants of the export (not tensors), in place.

    Their uses get the constant value. Returns the removed inputs' names.
    """
    from torch.export.graph_signature import ConstantArgument, InputKind

    signature = program.graph_signature
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    dropped, kept = [], []
    for spec in signature.input_specs:
        if spec.kind is InputKind.USER_INPUT and isinstance(spec.arg, ConstantArgument):
            node = placeholders.get(spec.arg.name)
            if node is not None:
                _replace_with_value(node, spec.arg.value)
                program.graph.erase_node(node)
            dropped.append(spec.arg.name)
        else:
            kept.append(spec)
    if dropped:
        signature.input_specs[:] = kept
    return dropped


def _replace_with_value(node: Any, value: Any) -> None:
    """Put ``value`` in place of ``node`` in the arguments of its users."""
    from torch.fx.node import map_arg

    for user in list(node.users):
        user.args = map_arg(user.args, lambda a: value if a is node else a)
        user.kwargs = map_arg(user.kwargs, lambda a: value if a is node else a)


def lift_mutated_buffers(program: Any) -> list[LiftedState]:
    """Make every buffer the program writes an input and an output, in place.

    The lifted buffers follow the user inputs, in the program's buffer order;
    their new values follow the user outputs, in the same order. Returns them
    with their values at export.
    """
    from torch.export.graph_signature import (
        InputKind,
        InputSpec,
        OutputKind,
        OutputSpec,
        TensorArgument,
    )

    signature = program.graph_signature
    written = {
        spec.target: spec.arg.name
        for spec in signature.output_specs
        if spec.kind is OutputKind.BUFFER_MUTATION
    }
    if not written:
        return []
    values = dict(program.named_buffers())
    lifted: list[LiftedState] = []
    inputs, lifted_inputs = [], []
    for spec in signature.input_specs:
        if spec.kind is InputKind.BUFFER and spec.target in written:
            lifted.append(LiftedState(spec.target, values[spec.target].detach().numpy().copy()))
            lifted_inputs.append(InputSpec(InputKind.USER_INPUT, spec.arg, None))
            program.constants.pop(spec.target, None)
            program.state_dict.pop(spec.target, None)
        else:
            inputs.append(spec)
    new_values = {written[state.name] for state in lifted}
    outputs = [s for s in signature.output_specs if s.kind is not OutputKind.BUFFER_MUTATION]
    outputs = [OutputSpec(OutputKind.USER_OUTPUT, s.arg, None) for s in outputs] + [
        OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(written[state.name]), None)
        for state in lifted
    ]
    assert all(name in new_values for name in written.values())
    signature.input_specs[:] = inputs + lifted_inputs
    signature.output_specs[:] = outputs
    output = next(n for n in program.graph.nodes if n.op == "output")
    by_name = {a.name: a for a in output.args[0] if hasattr(a, "name")}
    output.args = (tuple(by_name[s.arg.name] for s in outputs),)
    program.graph_module.recompile()
    return lifted


def promote_empty_concat_inputs(program: Any) -> int:
    """Drop the 1-D empty inputs of every ``aten.cat`` whose other inputs have another rank.

    PyTorch skips such an input (its legacy rule for ``torch.cat``); TVM's
    ``concat`` refuses it. A concatenation left with one input becomes that
    input. Returns how many inputs were dropped.
    """
    import torch

    dropped = 0
    for node in list(program.graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.cat.default:
            continue
        tensors = list(node.args[0])
        ranks = {len(_shape(t)) for t in tensors if not _legacy_empty(t)}
        if len(ranks) != 1 or not any(_legacy_empty(t) for t in tensors):
            continue
        kept = [t for t in tensors if not _legacy_empty(t)]
        dropped += len(tensors) - len(kept)
        if len(kept) == 1:
            node.replace_all_uses_with(kept[0])
            program.graph.erase_node(node)
        else:
            node.args = (kept, *node.args[1:])
    if dropped:
        program.graph_module.recompile()
    return dropped


def _shape(node: Any) -> tuple:
    value = node.meta.get("val") if hasattr(node, "meta") else None
    return tuple(value.shape) if value is not None and hasattr(value, "shape") else ()


def _legacy_empty(node: Any) -> bool:
    """A 1-D tensor of size 0: what ``torch.cat`` skips whatever the others' rank."""
    shape = _shape(node)
    return len(shape) == 1 and isinstance(shape[0], int) and shape[0] == 0


def rewrite_program(program: Any) -> list[LiftedState]:
    """Every rewrite of this module, in place; returns the lifted state (see above)."""
    drop_constant_inputs(program)
    promote_empty_concat_inputs(program)
    full_index_puts(program)
    return lift_mutated_buffers(program)


def full_index_puts(program: Any) -> int:
    """Give every ``aten.index_put`` an index tensor per dimension, in place.

    ``x[:, :, pos] = v`` (a static KV cache's write) is ``index_put`` with
    ``None`` for the sliced dimensions; TVM's ``index_put`` wants one index
    tensor per dimension. A ``None`` becomes ``arange`` of its dimension,
    shaped to broadcast as NumPy's indexing places it. Only index lists whose
    tensors are adjacent, over dimensions of static size, are rewritten (the
    others are left to TVM). Returns how many were rewritten.
    """
    import torch

    aten = torch.ops.aten
    graph = program.graph
    rewritten = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.index_put.default:
            continue
        data, indices = node.args[0], list(node.args[1])
        shape = _shape(data)
        given = [i for i, index in enumerate(indices) if index is not None]
        if not given or len(given) == len(shape) or given != list(range(given[0], given[-1] + 1)):
            continue
        indices += [None] * (len(shape) - len(indices))
        first, count = given[0], len(given)
        rank = max(len(_shape(indices[i])) for i in given)
        total = first + rank + len(shape) - first - count
        if not all(isinstance(shape[j], int) for j, index in enumerate(indices) if index is None):
            continue
        full = []
        with graph.inserting_before(node):
            for j, index in enumerate(indices):
                if index is not None:
                    lead = rank - len(_shape(index))
                    dims = [1] * first + [1] * lead + list(_shape(index))
                    dims += [1] * (total - len(dims))
                    if any(not isinstance(d, int) for d in dims):
                        dims = [-1 if not isinstance(d, int) else d for d in dims]
                    full.append(graph.call_function(aten.view.default, (index, dims)))
                    continue
                position = j if j < first else j - count + rank
                dims = [1] * total
                dims[position] = shape[j]
                steps = graph.call_function(
                    aten.arange.start, (0, shape[j]), {"dtype": torch.int64}
                )
                full.append(graph.call_function(aten.view.default, (steps, dims)))
        node.args = (data, full, *node.args[2:])
        rewritten += 1
    if rewritten:
        program.graph_module.recompile()
    return rewritten
