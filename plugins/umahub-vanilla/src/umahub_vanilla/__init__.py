"""umahub-vanilla: TVM UMA's "vanilla accelerator", on apache-tvm 0.25 to 0.27.

Accelerator ``vanilla_accel``: one instance, TVM's C codegen, a kernel library
of its own (``kernels/vanilla_conv2d.{h,c}``) compiled and linked into the
exported model.

* patterns: ``conv2d`` alone, ``conv2d`` + bias ``add``, and that + a ReLU or
  a clip (a ReLU6), when the convolution is float32, NCHW/OIHW, groups 1,
  dilation 1 (any stride, any zero padding). The check refuses anything else,
  which then stays with the next claimant or the host.
* TIR pass at phase 0: the convolution's loop nest (and its padding) is
  replaced by ``T.call_extern("vanilla_conv2d_nchw", ...)``, and with the bias
  add that follows it by ``vanilla_conv2d_nchw_bias``, which adds the bias as
  it stores, and with the ReLU or clip after that by
  ``vanilla_conv2d_nchw_bias_clamp``, which bounds what it stored while it is
  in cache (a stem's activation does not cross to another device and back);
  the rest of an epilogue stays TIR.
* ``c_includes`` puts the library's header on top of the generated C;
  ``c_sources`` and ``include_dirs`` compile and link the library on export.
* no schedule hook: the pass matches the unscheduled loop nest.
"""

from __future__ import annotations

from umahub.plugin import Accelerator, MemoryPool, Refusal, hookimpl
from umahub_vanilla.library import C_INCLUDES, C_SOURCES, INCLUDE_DIRS

UMAHUB_API = 1

NAME = "vanilla_accel"


#: The Relax operators its patterns take (alone or fused), shown by ``umahub plugins``.
OPERATORS = (
    "relax.nn.conv2d",
    "relax.add",
    "relax.nn.relu",
    "relax.clip",
)


@hookimpl
def umahub_accelerators():
    """The vanilla accelerator, with its kernel library."""
    return [
        Accelerator(
            NAME,
            codegen="c",
            memory=[MemoryPool("vanilla.mem", 8 * 1024 * 1024, copy="sync")],
            c_includes=C_INCLUDES,
            c_sources=C_SOURCES,
            include_dirs=INCLUDE_DIRS,
            description="UMA's vanilla accelerator: conv2d through a C kernel library",
            operators=OPERATORS,
        )
    ]


def supported_conv2d(ctx) -> bool | Refusal:
    """float32 NCHW/OIHW convolution, groups 1, dilation 1: what the kernel computes."""
    from umahub.plugin import calls, dtype_of

    for conv in calls(ctx, "relax.nn.conv2d"):
        attrs = conv.attrs
        layout = (str(attrs.data_layout), str(attrs.kernel_layout))
        if layout != ("NCHW", "OIHW"):
            return Refusal(f"layout {'/'.join(layout)}; its kernel takes NCHW/OIHW")
        if int(attrs.groups) != 1:
            return Refusal(f"{int(attrs.groups)} groups; its kernel takes groups 1")
        dilation = tuple(int(d) for d in attrs.dilation)
        if any(d != 1 for d in dilation):
            return Refusal(f"dilation {dilation}; its kernel takes dilation 1 only")
        if str(attrs.out_layout) not in ("NCHW", ""):
            return Refusal(f"output layout {attrs.out_layout}; its kernel writes NCHW")
        for value in (*conv.args, conv):
            if dtype_of(value) != "float32":
                return Refusal(f"a {dtype_of(value)} tensor; its kernel takes float32")
    return True


@hookimpl(accelerator=NAME)
def umahub_patterns():
    """conv2d + bias add + activation first (the larger match wins), then conv2d +
    bias add, then conv2d alone."""
    from tvm.relax.dpl import is_const, is_op, wildcard

    conv = is_op("relax.nn.conv2d")(wildcard(), wildcard())
    bias = is_op("relax.add")(conv, is_const() | wildcard())
    act = is_op("relax.nn.relu")(bias) | is_op("relax.clip")(bias, wildcard(), wildcard())
    return [
        (f"{NAME}.conv2d_bias_act", act, {}, supported_conv2d),
        (f"{NAME}.conv2d_bias", bias, {}, supported_conv2d),
        (f"{NAME}.conv2d", conv, {}, supported_conv2d),
    ]


@hookimpl(accelerator=NAME)
def umahub_tir_passes(phase):
    """Phase 0: swap the convolution loop nest for the kernel library call."""
    if phase != 0:
        return None
    from umahub_vanilla.passes import conv2d_to_extern

    return [conv2d_to_extern()]
