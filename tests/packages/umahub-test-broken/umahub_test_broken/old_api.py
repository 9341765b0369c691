"""A plugin written for a hook contract umahub does not speak."""

import umahub

UMAHUB_API = 0


@umahub.hookimpl
def umahub_accelerators():
    return []
