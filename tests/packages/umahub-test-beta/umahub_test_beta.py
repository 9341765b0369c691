"""Test plugin 'beta': accelerator 'beta_accel' claims relu, C codegen."""

import umahub

UMAHUB_API = 1

CALLS = []


@umahub.hookimpl
def umahub_accelerators():
    return [umahub.Accelerator("beta_accel", codegen="c")]


@umahub.hookimpl
def umahub_patterns(accelerator):
    if accelerator.name != "beta_accel":
        return None
    from tvm.relax.dpl import is_op, wildcard

    return [("beta_accel.relu", is_op("relax.nn.relu")(wildcard()))]


@umahub.hookimpl
def umahub_schedule(accelerator, schedule):
    CALLS.append(("beta", accelerator.name))
