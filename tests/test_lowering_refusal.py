"""A lowering hook's refusal (``umahub.plugin.Unsupported``): the partition goes back to the
host with the plugin's reason in the report, a decision and not a failure, so neither a
warning nor the end of a compile with ``on-error = "error"``; any other exception stays
the plugin's failure."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from graphs import chain

import umahub
import umahub.plugin as up
from umahub.errors import CompileError


class TooWide(up.Unsupported):
    """A plugin's own type of refusal."""


class Picky:
    """Takes relu; refuses in ``hook`` what is wider than 8 columns, or fails with ``raises``."""

    UMAHUB_API = 1

    def __init__(self, hook: str, raises: type[Exception] = up.Unsupported):
        self.hook, self.raises = hook, raises

    def _maybe_refuse(self, hook: str, width: int) -> None:
        if hook == self.hook and width > 8:
            raise self.raises(f"{width} columns, more than the 8 lanes of the array")

    @up.hookimpl
    def umahub_accelerators(self):
        return [up.Accelerator("picky")]

    @up.hookimpl(accelerator="picky")
    def umahub_patterns(self):
        return [("picky.relu", up.op("relax.nn.relu"))]

    @up.hookimpl(accelerator="picky")
    def umahub_relax_to_tir(self, function):
        self._maybe_refuse("umahub_relax_to_tir", up.shape_of(function.params[0])[-1])

    @up.hookimpl(accelerator="picky")
    def umahub_schedule(self, schedule, context):
        (param,) = up.param_buffers(schedule.mod[context.symbol])[:1]
        self._maybe_refuse("umahub_schedule", int(param.shape[-1]))


def _compile(plugin, **config):
    hub = umahub.Hub(autoload=False, plugins=[plugin], config=config, project_config=False)
    return hub.compile(chain(shape=(4, 16), ops=("relu",)))


@pytest.mark.parametrize(
    ("hook", "raises"),
    [("umahub_relax_to_tir", up.Unsupported), ("umahub_schedule", TooWide)],
)
def test_a_refusal_sends_the_partition_to_the_host_with_its_reason(hook, raises):
    with warnings.catch_warnings():
        warnings.simplefilter("error", umahub.UmahubWarning)
        compiled = _compile(Picky(hook, raises), **{"on-error": "error"})
    (part,) = compiled.report.partitions
    message = (
        f"plugin 'Picky' refused partition picky_0_relu in {hook}: 16 columns, more than the "
        "8 lanes of the array"
    )
    assert part.fallback == message
    assert f"picky_0_relu  [FELL BACK to host: {message}]" in str(compiled.report)
    x = np.random.default_rng(0).standard_normal((4, 16)).astype("float32")
    assert np.array_equal(compiled.run(x), np.maximum(x, 0))


def test_any_other_exception_is_still_the_plugins_failure():
    with pytest.raises(CompileError) as caught:
        _compile(Picky("umahub_relax_to_tir", ValueError), **{"on-error": "error"})
    assert str(caught.value) == (
        "plugin 'Picky' failed in umahub_relax_to_tir for partition picky_0_relu (picky.relu) "
        "on picky:0: ValueError: 16 columns, more than the 8 lanes of the array"
    )
