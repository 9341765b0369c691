"""A plugin whose hookimpl takes an argument no hook specification has."""

import umahub

UMAHUB_API = 1


@umahub.hookimpl
def umahub_patterns(accelerator, flavour):
    return None
