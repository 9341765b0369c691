"""Test plugin 'alpha': accelerator 'alpha_accel' claims relu and add, LLVM codegen.

Its schedule hook is marked tryfirst, so that tests can see an author's
ordering respected, and overridden by [tool.umahub.hook-order].
"""

import umahub

UMAHUB_API = 1

CALLS = []


@umahub.hookimpl
def umahub_accelerators():
    return [
        umahub.Accelerator(
            "alpha_accel",
            codegen="llvm",
            instances=2,
            memory=[umahub.MemoryPool("alpha.mem", 1 << 20)],
        )
    ]


@umahub.hookimpl
def umahub_patterns(accelerator):
    if accelerator.name != "alpha_accel":
        return None
    from tvm.relax.dpl import is_op, wildcard

    return [
        ("alpha_accel.relu", is_op("relax.nn.relu")(wildcard())),
        ("alpha_accel.add", is_op("relax.add")(wildcard(), wildcard())),
    ]


@umahub.hookimpl(tryfirst=True)
def umahub_schedule(accelerator, schedule):
    CALLS.append(("alpha", accelerator.name))
