"""On-chip buffers: an accelerator declares memory scopes of fixed capacity; its tiles are
counted against them after its TIR passes, and a partition whose tiles do not fit is
refused naming the scope, what it needs and what there is."""

from __future__ import annotations

import numpy as np
import pytest
from graphs import chain

import umahub
import umahub.plugin as up
from umahub.errors import CompileError
from umahub.plugin.accelerator import OnChipBuffer


class Staging:
    """An accelerator taking relu whose schedule stages the input in its on-chip buffer
    (``local.stage.buf``, 1 KiB) with ``cache_read``: a whole input, however big."""

    UMAHUB_API = 1

    @up.hookimpl
    def umahub_accelerators(self):
        buffer = up.OnChipBuffer("local.stage.buf", 1024, "staged inputs")
        return [up.Accelerator("stage", buffers=[buffer])]

    @up.hookimpl(accelerator="stage")
    def umahub_patterns(self):
        return [("stage.relu", up.op("relax.nn.relu"))]

    @up.hookimpl(accelerator="stage")
    def umahub_schedule(self, schedule):
        (block,) = [b for b in up.blocks(schedule.mod[schedule.func_working_on.name_hint])
                    if b.name_hint != "root"]  # fmt: skip
        schedule.cache_read(schedule.get_sblock(block.name_hint), 0, "local.stage.buf")
        return "input staged"


def _compile(shape, **config):
    hub = umahub.Hub(autoload=False, plugins=[Staging()], config=config, project_config=False)
    return hub.compile(chain(shape=shape, ops=("relu",)))


def test_tiles_that_fit_are_counted_per_buffer():
    compiled = _compile((4, 16))  # 256 bytes staged
    (part,) = compiled.report.partitions
    assert not part.fallback
    assert part.buffers == {"local.stage.buf": [256, 1024]}
    assert "      on-chip: local.stage.buf 256 B of 1 KiB" in str(compiled.report)
    x = np.random.default_rng(0).standard_normal((4, 16)).astype("float32")
    assert np.array_equal(compiled.run(x), np.maximum(x, 0))


def test_tiles_that_do_not_fit_are_refused_naming_the_buffer():
    with pytest.raises(CompileError) as info:
        _compile((8, 64), **{"on-error": "error"})  # 2 KiB staged
    assert str(info.value).startswith(
        "partition stage_0_relu does not fit 'stage': its tiles need 2 KiB of on-chip buffer "
        "local.stage.buf (staged inputs), which holds 1 KiB; the plugin must tile it smaller "
        "or refuse it"
    )
    with pytest.warns(umahub.UmahubWarning, match="does not fit 'stage'"):
        compiled = _compile((8, 64))
    (part,) = compiled.report.partitions
    assert "its tiles need 2 KiB of on-chip buffer local.stage.buf" in part.fallback
    x = np.random.default_rng(1).standard_normal((8, 64)).astype("float32")
    assert np.array_equal(compiled.run(x), np.maximum(x, 0))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scope": "stage.buf", "size_bytes": 8}, "must be a TIR storage scope with a tag"),
        ({"scope": "local.a", "size_bytes": 0}, "size_bytes must be a positive int, got 0"),
    ],
)
def test_a_buffer_declared_wrong_says_what_is_wrong(kwargs, message):
    with pytest.raises(ValueError, match=message):
        OnChipBuffer(**kwargs)


def test_an_accelerator_checks_its_buffers_and_clock():
    buffer = OnChipBuffer("local.a.b", 8)
    with pytest.raises(ValueError, match=r"two on-chip buffers have the scope 'local\.a\.b'"):
        up.Accelerator("a", buffers=[buffer, buffer])
    with pytest.raises(ValueError, match="clock_hz must be a positive number"):
        up.Accelerator("a", clock_hz=0)
    assert up.Accelerator("a", buffers=[buffer]).buffer("local.a.b") is buffer
