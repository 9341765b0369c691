"""A plugin with a misspelt hook name."""

import umahub

UMAHUB_API = 1


@umahub.hookimpl
def umahub_patern(accelerator):
    return None
