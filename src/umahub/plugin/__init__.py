"""The plugin API: everything an accelerator plugin may use of umahub, in one package.

A plugin imports this package and nothing else of umahub::

    import umahub.plugin as up

    UMAHUB_API = 1  # the contract the plugin was written for

    @up.hookimpl
    def umahub_accelerators():
        sram = up.MemoryPool("my.sram", 64 << 10)
        return [up.Accelerator("my_accel", codegen="c", memory=[sram])]

    @up.hookimpl(accelerator="my_accel")
    def umahub_patterns():
        return up.epilogues("my_accel", "conv2d", up.conv2d(), check=my_check)

What it holds, by what a plugin does with it:

Declaring the plugin
    :data:`hookimpl` (``accelerator=`` for hooks of one accelerator),
    :data:`hookspec`, :data:`API_VERSION`, :mod:`~umahub.plugin.hookspecs`
    (the contract: every hook, when it is called, what it takes and returns),
    :class:`Accelerator`, :class:`MemoryPool`, :class:`OnChipBuffer`, :data:`CODEGENS`,
    :data:`COPY_KINDS`; the options users may set for an accelerator
    (:class:`Option`, :mod:`~umahub.plugin.options`), which hooks read as
    ``context.options``.

A device of its own (:mod:`~umahub.plugin.device`)
    ``Accelerator(runtime=...)``; the codegen's :class:`DeviceProgram` (with its
    cycles, :class:`ProgramTiming`); the
    runtime package's :class:`DeviceRuntime` and :class:`Device`, their
    :class:`Completion` (:func:`done`, :class:`Pending`) and
    :class:`DeviceError`. A runtime package imports only this module.

Claiming operators (``umahub_patterns``)
    Pattern factories: :func:`op`, :func:`matmul`, :func:`conv2d`,
    :func:`bias_add`, :func:`activated`, :func:`relu6`, :func:`hardsigmoid`,
    :func:`hardswish`, :func:`epilogues`, :data:`ACTIVATIONS`; quantized
    operators (:mod:`~umahub.plugin.quantization`): :func:`quantized`,
    :func:`dequantized`, :func:`table_lookup` (an 8-bit tensor read through a
    table of its 256 values), and for their checks :func:`quantized_operator`
    (:class:`QuantizedOperator`, :class:`QuantParams`), :func:`table_of`, and
    :func:`quantized_mean` (:class:`QuantizedMean`: ``quantize(mean(dequantized()))``,
    :mod:`~umahub.plugin.integer_mean`). For the
    checks: :class:`Refusal`, :func:`refusal_reason`, :func:`calls`,
    :func:`shape_of`, :func:`bounded_shape_of`, :func:`dtype_of`, :func:`match_bytes`,
    :func:`human_size`, :data:`UNBOUNDED`, :func:`element_bytes`,
    :func:`tensor_bytes`, :func:`upper_bound`.

What the hooks are given
    :class:`CompileContext`, :class:`CostContext`, :class:`Operator`,
    :class:`Copy`.

Lowering (``umahub_relax_to_tir``)
    :class:`Unsupported` (raised by any lowering hook: the partition goes back
    to the host with its message), :func:`default_relax_to_tir`,
    :func:`single_primfunc`, the small constants a partition is passed
    (:func:`constant_inputs`), and the host's lowering of a max pooling,
    :func:`max_pool2d`. A quantized operator's integers
    (:func:`describe_quantized`, :func:`describe_quantized_mean`,
    :func:`bound_value`, :func:`requantization`,
    :func:`requantize`: the arithmetic every device must give bit for bit).

Scheduling (``umahub_schedule``) and TIR passes (``umahub_tir_passes``)
    The host's schedules a plugin may reuse (:func:`schedule_elementwise`,
    :func:`schedule_pooling`, :func:`schedule_int8` for the quantized kernels,
    with :data:`PARALLEL_MIN` and :data:`WINDOW_MAX`); weights packed at compile time
    (:func:`pack_weight`, :data:`PREPACK_ANNOTATION`); the machine
    (:func:`host_target`, :func:`vector_lanes`); TIR helpers that read and
    rewrite a PrimFunc the same way on every supported TVM
    (:mod:`~umahub.plugin.tir`: :func:`root_block` and its :class:`Root`,
    :func:`with_root_body`, :func:`perfect_nest`, :func:`full_region`,
    :func:`extern_block`, :func:`rewrite`, :func:`blocks`, :func:`static_int`,
    :func:`static_ints`, :func:`loop_extents`, and :func:`read_in_place`, which
    inlines a stage that only copies its input).

Tuning (``umahub_tuning_space``)
    :class:`TuningSpace`: a design space (the plugin's schedule with its
    decisions sampled) or MetaSchedule's rules, which ``umahub tune``
    searches and measures against the hook's schedule
    (:mod:`~umahub.plugin.tuning`).

TVM's names that moved between apache-tvm 0.25, 0.26 and 0.27
    :mod:`~umahub.plugin.compat`, re-exported here: :data:`SBlock`,
    :data:`SBlockRealize`, :data:`Load`, :data:`Region`, :data:`Call`,
    :data:`Analyzer`, :data:`TensorType`, :data:`TupleType`,
    :func:`buffer_of`, :func:`is_buffer`, :func:`param_buffers`,
    :func:`data_pointer`, :func:`points_to`, :func:`vars_in`, :func:`nodes_in`,
    :func:`detect_linear_equation`, :func:`type_of`, :func:`ret_type`,
    :func:`type_args`, :func:`name_of`.

``import umahub.plugin`` does not import TVM: every name is resolved when it
is first used, so a plugin's top-level module may import this package and
still be listed by ``umahub plugins`` without TVM being loaded.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from umahub.plugin import compat, tir  # neither imports TVM: their names resolve when used
from umahub.plugin.accelerator import (
    CODEGENS,
    COPY_KINDS,
    Accelerator,
    MemoryPool,
    OnChipBuffer,
)
from umahub.plugin.device import (
    Completion,
    Device,
    DeviceError,
    DeviceProgram,
    DeviceRuntime,
    Pending,
    ProgramTiming,
    done,
)
from umahub.plugin.integer_mean import QuantizedMean, describe_quantized_mean, quantized_mean
from umahub.plugin.markers import API_VERSION, hookimpl, hookspec
from umahub.plugin.options import Option
from umahub.plugin.patterns import (
    ACTIVATIONS,
    Refusal,
    Unsupported,
    activated,
    bias_add,
    bounded_shape_of,
    calls,
    conv2d,
    dtype_of,
    epilogues,
    hardsigmoid,
    hardswish,
    match_bytes,
    matmul,
    op,
    refusal_reason,
    relu6,
    shape_of,
)
from umahub.plugin.quantization import (
    QuantizedOperator,
    QuantParams,
    bound_value,
    dequantized,
    describe_quantized,
    quantized,
    quantized_operator,
    requantization,
    requantize,
    table_lookup,
    table_of,
)
from umahub.plugin.tuning import TuningSpace
from umahub.sizes import human_size

if TYPE_CHECKING:
    from umahub.compiler.lowering import constant_inputs, default_relax_to_tir, single_primfunc
    from umahub.host.int8 import schedule_int8
    from umahub.host.lowering import max_pool2d
    from umahub.host.prepack import pack_weight
    from umahub.host.schedules import (
        PARALLEL_MIN,
        WINDOW_MAX,
        schedule_elementwise,
        schedule_pooling,
    )
    from umahub.plugin import hookspecs
    from umahub.plugin.compat import (
        Analyzer,
        Call,
        Load,
        Region,
        SBlock,
        SBlockRealize,
        TensorType,
        TupleType,
        buffer_of,
        data_pointer,
        detect_linear_equation,
        is_buffer,
        name_of,
        nodes_in,
        param_buffers,
        points_to,
        ret_type,
        type_args,
        type_of,
        vars_in,
    )
    from umahub.plugin.context import CompileContext, Copy, CostContext, Operator
    from umahub.plugin.memory import UNBOUNDED, element_bytes, tensor_bytes, upper_bound
    from umahub.plugin.tir import (
        Root,
        blocks,
        extern_block,
        full_region,
        loop_extents,
        perfect_nest,
        read_in_place,
        rewrite,
        root_block,
        static_int,
        static_ints,
        with_root_body,
    )
    from umahub.targets import host_target, vector_lanes

#: Where each lazily resolved name lives: ``name -> module`` (the name in that
#: module is the same, except where ``module:attribute`` says otherwise).
_LAZY = {
    "hookspecs": "umahub.plugin",
    **dict.fromkeys(("CompileContext", "CostContext", "Copy", "Operator"), "umahub.plugin.context"),
    **dict.fromkeys(
        ("UNBOUNDED", "element_bytes", "tensor_bytes", "upper_bound"), "umahub.plugin.memory"
    ),
    **dict.fromkeys(tir.__all__, "umahub.plugin.tir"),
    **dict.fromkeys(compat.__all__, "umahub.plugin.compat"),
    **dict.fromkeys(
        ("constant_inputs", "default_relax_to_tir", "single_primfunc"), "umahub.compiler.lowering"
    ),
    "max_pool2d": "umahub.host.lowering",
    **dict.fromkeys(
        ("PARALLEL_MIN", "WINDOW_MAX", "schedule_elementwise", "schedule_pooling"),
        "umahub.host.schedules",
    ),
    "pack_weight": "umahub.host.prepack",
    "schedule_int8": "umahub.host.int8",
    "PREPACK_ANNOTATION": "umahub.host.prepack:ANNOTATION",
    **dict.fromkeys(("host_target", "vector_lanes"), "umahub.targets"),
}

__all__ = [
    "ACTIVATIONS",
    "API_VERSION",
    "CODEGENS",
    "COPY_KINDS",
    "PARALLEL_MIN",
    "PREPACK_ANNOTATION",
    "UNBOUNDED",
    "WINDOW_MAX",
    "Accelerator",
    "Analyzer",
    "Call",
    "CompileContext",
    "Completion",
    "Copy",
    "CostContext",
    "Device",
    "DeviceError",
    "DeviceProgram",
    "DeviceRuntime",
    "Load",
    "MemoryPool",
    "OnChipBuffer",
    "Operator",
    "Option",
    "Pending",
    "ProgramTiming",
    "QuantParams",
    "QuantizedMean",
    "QuantizedOperator",
    "Refusal",
    "Region",
    "Root",
    "SBlock",
    "SBlockRealize",
    "TensorType",
    "TuningSpace",
    "TupleType",
    "Unsupported",
    "activated",
    "bias_add",
    "blocks",
    "bound_value",
    "bounded_shape_of",
    "buffer_of",
    "calls",
    "compat",
    "constant_inputs",
    "conv2d",
    "data_pointer",
    "default_relax_to_tir",
    "dequantized",
    "describe_quantized",
    "describe_quantized_mean",
    "detect_linear_equation",
    "done",
    "dtype_of",
    "element_bytes",
    "epilogues",
    "extern_block",
    "full_region",
    "hardsigmoid",
    "hardswish",
    "hookimpl",
    "hookspec",
    "hookspecs",
    "host_target",
    "human_size",
    "is_buffer",
    "loop_extents",
    "match_bytes",
    "matmul",
    "max_pool2d",
    "name_of",
    "nodes_in",
    "op",
    "pack_weight",
    "param_buffers",
    "perfect_nest",
    "points_to",
    "quantized",
    "quantized_mean",
    "quantized_operator",
    "read_in_place",
    "refusal_reason",
    "relu6",
    "requantization",
    "requantize",
    "ret_type",
    "rewrite",
    "root_block",
    "schedule_elementwise",
    "schedule_int8",
    "schedule_pooling",
    "shape_of",
    "single_primfunc",
    "static_int",
    "static_ints",
    "table_lookup",
    "table_of",
    "tensor_bytes",
    "tir",
    "type_args",
    "type_of",
    "upper_bound",
    "vars_in",
    "vector_lanes",
    "with_root_body",
]


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'umahub.plugin' has no attribute {name!r}")
    module, _, attribute = where.partition(":")
    if module == __name__:
        value: Any = importlib.import_module(f"{__name__}.{name}")
    else:
        value = getattr(importlib.import_module(module), attribute or name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
