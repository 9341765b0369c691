"""The files ``umahub new-plugin`` writes, as :class:`string.Template` texts.

Each constant is one file, written as it will read once ``$dist`` (the
distribution, ``my-accel``), ``$module`` (its Python package, ``my_accel``),
``$acc`` (the accelerator, ``my_accel``), ``$runtime_dist`` and
``$runtime_module`` (the device runtime's package, with ``--device``) are
filled in. The code is lint-clean by umahub's ruff rules, which the generated
``pyproject.toml`` repeats. Keep lines short: a long name must not push one
over 100 characters.

The guides are linked by URL (:data:`DOCS`): a vendor who installed umahub with
pip has no ``docs/`` directory.

Why this module is long: it is the generated package, file by file.
"""

from __future__ import annotations

__all__ = ["DEVICE_FILES", "DOCS", "HOST_FILES", "RUNTIME_FILES"]

#: umahub's documentation pages, as the generated files link them.
DOCS = "https://github.com/umahub/umahub/blob/main/docs"
_WRITING = f"{DOCS}/plugins/writing.md"
_DEVICE = f"{DOCS}/plugins/device.md"
_HOOKS = f"{DOCS}/plugins/hooks.rst"
_CONFORMANCE = f"{DOCS}/plugins/conformance.md"

# ---------------------------------------------------------------- shared pieces

_RUFF = """\
[tool.ruff]
line-length = 100
target-version = "py310"

[tool.ruff.lint]
# umahub's own rules
select = ["E", "F", "W", "I", "B", "UP", "RUF"]
"""

_GITIGNORE = """\
__pycache__/
*.egg-info/
.tox/
.pytest_cache/
build/
dist/
umahub-conformance.json
"""

# ---------------------------------------------------------------- the compiler plugin

PYPROJECT = (
    """\
[build-system]
requires = ["setuptools>=77"]  # license as an SPDX expression (PEP 639)
build-backend = "setuptools.build_meta"

[project]
name = "$dist"
version = "0.1.0"
description = "umahub plugin: the accelerator '$acc'"
readme = "README.md"
requires-python = ">=3.10"
# Your package's license, as an SPDX expression: Apache-2.0 is umahub's and TVM's,
# a closed one is "LicenseRef-Proprietary". With its text in a file LICENSE, add
# license-files = ["LICENSE"].
license = "Apache-2.0"
dependencies = ["umahub"]

[project.optional-dependencies]
test = ["pytest>=8", "hypothesis"]  # umahub's conformance kit needs both

[project.urls]  # placeholders: where your plugin lives
Homepage = "https://github.com/YOUR-ORG/$dist"
Source = "https://github.com/YOUR-ORG/$dist"
Issues = "https://github.com/YOUR-ORG/$dist/issues"

# The plugin's name (what users write in plugins, disable and hook-order) = its module.
[project.entry-points."umahub.plugins"]
$module = "$module"

[tool.setuptools.packages.find]
where = ["src"]

[tool.pytest.ini_options]
testpaths = ["tests"]
pythonpath = ["src"]  # the tests run from a source tree too (conftest.py)
addopts = "-ra"

"""
    + _RUFF
)

CONFTEST = '''\
"""Run the tests from a source tree too, before ``pip install -e .``.

Installed, the plugin is found by its entry point (pyproject.toml) and this
does nothing. Not installed, umahub is told the module's name in
``UMAHUB_PLUGINS`` (pytest puts ``src`` on ``sys.path``), so that the
conformance kit finds the accelerator.
"""

import os
from importlib.metadata import entry_points

PLUGIN = "$module"

if not any(ep.name == PLUGIN for ep in entry_points(group="umahub.plugins")):
    listed = [n for n in os.environ.get("UMAHUB_PLUGINS", "").split(",") if n.strip()]
    os.environ["UMAHUB_PLUGINS"] = ",".join([*listed, PLUGIN])
'''


def _header(declares: str, guides: str) -> str:
    """The module docstring of the plugin's ``__init__.py``."""
    return f'''\
"""$dist: the umahub plugin of the accelerator '$acc'.

Written by ``umahub new-plugin``: it works as it is, and is meant to be changed.
{declares}
It claims one operator, ReLU on float32 (the pattern and its check); every
other hook is here as a stub with its contract, returning what leaves
umahub's default in place. Fill in what your accelerator needs, delete the
stubs you do not.

- {guides};
- every hook's contract: the hook reference,
  {_HOOKS}, or
  ``python -c "import umahub.plugin.hookspecs as h; help(h)"``;
- the API: ``umahub.plugin``, the one package of umahub a plugin imports.

This module does not import TVM: ``umahub plugins`` loads every plugin, and
should stay fast. Import TVM, and your modules that use it, inside the hooks.
"""

from __future__ import annotations
'''


def _swap(text: str, old: str, new: str) -> str:
    """``text`` with ``old`` replaced by ``new``; ``old`` must be there (a template changed)."""
    if old not in text:
        raise AssertionError(f"scaffold template: {old!r} not found")
    return text.replace(old, new)


_PATTERNS = '''

def relu_check(ctx):
    """Take a ReLU of float32 whose tensors fit half the memory; refuse the rest, saying why.

    ``ctx`` is TVM's ``PatternCheckContext``. A refused match goes to the next
    claimant or the host; when a user pinned it here, the warning quotes the reason.
    """
    dtype = up.dtype_of(ctx.matched_expr)
    if dtype != "float32":
        return up.Refusal(f"{dtype}: the kernel computes float32 only")
    need = up.match_bytes(ctx)
    if need > MEMORY_BYTES // 2:
        return up.Refusal(
            f"its tensors take {up.human_size(need)}, more than half of the "
            f"{up.human_size(MEMORY_BYTES)} memory"
        )
    return True


@up.hookimpl(accelerator=NAME)
def umahub_patterns():
    """What the accelerator claims: ``(name, pattern[, annotations[, check]])``, largest first.

    Names are ``"<accelerator>.<what>"``. For more, ``up.epilogues(NAME, "conv2d",
    up.conv2d(), check=...)`` gives a convolution with its bias and activations.
    """
    return [(f"{NAME}.relu", up.op("relax.nn.relu"), {}, relu_check)]


# ---------------------------------------------------------------- the other hooks
# Stubs: each returns None, which leaves umahub's default in place (the contract of
# each is in its docstring, in full in the hook reference). Marked with the
# accelerator, a hook is called for this accelerator's partitions only.


@up.hookimpl(accelerator=NAME)
def umahub_cost(function, context):
    """Seconds one call of a candidate group of operators takes here, for placement by
    cost (``priority = "auto"``), copies left out; ``context`` is a ``CostContext``
    (``context.flops``, ``context.bytes``). None: umahub builds the group and measures it.
    """
    return None


@up.hookimpl(accelerator=NAME)
def umahub_relax_to_tir(function, context):
    """Lower one partition (a Relax function) to TIR.

    None: the default lowering, every operator legalized and fused into one
    PrimFunc named ``context.symbol`` (its inputs, then its output). Else a
    ``tvm.IRModule`` holding that PrimFunc; ``up.default_relax_to_tir(function,
    context.symbol, NAME, legalize={...})`` is the default, to call and adjust.
    """
    return None


@up.hookimpl(accelerator=NAME)
def umahub_schedule(schedule, context):
    """Schedule one partition: change ``schedule`` (a ``tvm.s_tir.Schedule`` over the
    PrimFunc ``context.symbol``) in place, and return a short description for the
    report (``"vectorized x8"``), or None. Never return the schedule or a module.
    ``context.pool_free`` is what the memory has left for tiles.
    """
    return None


@up.hookimpl(accelerator=NAME)
def umahub_tir_passes(phase, context):
    """TIR passes to run at ``phase`` (0: scheduled TIR with its blocks; 1: buffers
    flattened; 2: loops vectorized and unrolled; 3: before the packed API), as a
    list of ``tvm.transform.Pass``, or None for none.
    """
    return None
'''

_HOST_SCHEDULE = '''

@up.hookimpl(accelerator=NAME)
def umahub_tuning_space(function, context):
    """For ``umahub tune``: an ``up.TuningSpace`` to search for this partition's
    schedule (``schedule=`` your schedule with its tile sizes drawn by
    ``schedule.sample_categorical``, or ``rules="llvm"``: MetaSchedule's), measured
    against ``umahub_schedule``'s; None: the hook's schedule is kept.
    """
    return None


@up.hookimpl
def umahub_host_schedule(schedule, target):
    """For a CPU backend: schedule one function of what runs on the host (``"main"``
    of ``schedule.mod``) in place and return a short name of what was done, or None
    for umahub's own schedule. Called for every host function, not per accelerator.
    """
    return None
'''

_SCHEDULE_STUB = '''    ``context.pool_free`` is what the memory has left for tiles.
    """
    return None
'''

_SCHEDULE_WITH_OPTION = '''    ``context.pool_free`` is what the memory has left for tiles.

    This one reads the backend option ``vector-lanes`` (declared in
    ``umahub_accelerators``): 1, the default, leaves TVM's loops as they are; more
    vectorizes the inner loop of each block by that many lanes.
    """
    lanes = context.options["vector-lanes"]  # every declared option is there, checked
    if lanes == 1:
        return None
    done = 0
    for block in schedule.get_child_blocks(schedule.get_sblock("root")):
        loops = schedule.get_loops(block)  # a ReLU's block: elementwise, no reduction
        if not loops:
            continue
        fused = schedule.fuse(*loops) if len(loops) > 1 else loops[0]
        extent = up.static_int(schedule.get(fused).extent)
        if extent is None or extent % lanes:
            continue  # a size known only at run time, or not a multiple of the lanes
        _, inner = schedule.split(fused, factors=[None, lanes])
        schedule.vectorize(inner)
        done += 1
    return f"vectorized {done} block(s) by {lanes} lanes"
'''

HOST_INIT = (
    _header(
        "It declares one accelerator, whose code TVM builds for the host's CPU.",
        f'the guide: "Writing a plugin",\n  {_WRITING}',
    )
    + '''
import umahub.plugin as up

UMAHUB_API = 1  # the hook contract this plugin was written for (write the number)

NAME = "$acc"
#: The accelerator's memory: the tensors of every partition placed on it must fit.
MEMORY_BYTES = 256 * 1024


@up.hookimpl
def umahub_accelerators():
    """The accelerators this plugin declares (called once, when a hub loads the plugin)."""
    return [
        up.Accelerator(
            NAME,
            codegen="llvm",  # or "c": TVM's C codegen, with c_sources of your kernels
            memory=[up.MemoryPool(f"{NAME}.sram", MEMORY_BYTES, copy="async")],
            operators=("relax.nn.relu",),  # what it takes, for users and the kit
            description="ReLU on float32 (generated by umahub new-plugin)",
            # Backend options: users set them in [tool.umahub.options.$acc], with
            # --option $acc.vector-lanes=8 or Hub(config={"options": ...}); umahub checks
            # them against these and hands them to the hooks as context.options.
            options=(
                up.Option(
                    "vector-lanes",
                    1,
                    help="vectorize the ReLU's loop by this many lanes (1: as TVM writes it)",
                    choices=(1, 4, 8, 16),
                ),
            ),
        )
    ]
'''
    + _swap(_PATTERNS, _SCHEDULE_STUB, _SCHEDULE_WITH_OPTION)
    + '''

@up.hookimpl(accelerator=NAME)
def umahub_codegen(module, context):
    """Code for one partition: None for the default codegen that ``Accelerator.codegen``
    names, else a TVM runtime module exporting ``context.symbol``; build it with
    ``pipeline=context.tir_pipeline`` (so the TIR passes run) and for
    ``context.target`` when it is set (a cross build).
    """
    return None
'''
    + _HOST_SCHEDULE
)

_TEST = '''\
"""$dist's tests: one compile checked against plain TVM, and umahub's conformance kit.

Run them with ``pytest`` (installed with ``pip install -e ".[test]"``, or from
this source tree). The kit's options: ``pytest --help``, under "umahub".
"""

import numpy as np
import pytest
import tvm
import umahub
import umahub.models as zoo
from umahub.testing import ConformanceSuite

from $module import NAME


def plain_tvm(mod, inputs):
    """The model's outputs as plain ``tvm.compile`` computes them on the host."""
    vm = tvm.relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()


def test_relu_of_the_mlp_runs_here_and_matches_tvm():
    """In the zoo's mlp the accelerator takes the ReLU, and nothing else."""
    hub = umahub.Hub(
        # only this plugin, found by its entry point (or, not installed, by conftest.py)
        config={"plugins": ["$module"], "priority": [NAME], "on-error": "error"},
        project_config=False,  # whatever [tool.umahub] the directory around has
    )
    mod, inputs = zoo.get("mlp"), zoo.inputs("mlp")
    compiled = hub.compile(mod)
    placement = {o.name: o.device for o in compiled.report.placement}
    assert placement == {
        "fc1": "host",
        "fc1_bias_add": "host",
        "fc1_relu": f"{NAME}:0",
        "fc2": "host",
        "gv": "host",
    }
    expected = plain_tvm(mod, inputs)
    np.testing.assert_allclose(compiled.run(*inputs), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.umahub_conformance(accelerator=NAME, models=["mlp", "cnn"], examples=4)
class TestConformance(ConformanceSuite):
    """Every check of umahub's conformance kit, for the accelerator."""
'''

README = (
    """\
# $dist

A plugin for [umahub](https://github.com/umahub/umahub), the pass-plugin hub
for Apache TVM: it adds the accelerator `$acc`, which takes ReLU on float32
from any model umahub compiles. Written by `umahub new-plugin`, it works as it
is and is the place to start: the one pattern and its check are in
`src/$module/__init__.py`, with every other hook as a stub that states its
contract.

## Install

umahub itself first, into the same environment (from its clone, `pip install
path/to/umahub`, where it is not on your package index):

```sh
pip install -e ".[test]"
umahub plugins            # lists $module and its accelerator $acc
umahub explain mlp        # fc1_relu goes to $acc:0
```

## Test

```sh
pytest                    # a compile against plain TVM, and umahub's conformance kit
tox                       # the same in a fresh environment
tox -m matrix             # Python 3.10-3.13 x apache-tvm 0.25, 0.26, 0.27
```

The tests run from this source tree too, before the package is installed
(`conftest.py`), as long as umahub is. In tox, umahub comes from your index;
to test against a checkout of umahub: `UMAHUB=/path/to/umahub tox`.

## Next

- Claim more: `umahub_patterns` (the pattern factories `up.op`, `up.matmul`,
  `up.conv2d`, `up.epilogues` build what accelerators claim most often), and
  name the operators in `Accelerator(operators=...)`.
- Lower, schedule and generate code your way: the stubs `umahub_relax_to_tir`,
  `umahub_schedule`, `umahub_tir_passes`, `umahub_codegen`.
- Let users tune it: the backend option `vector-lanes` (declared in
  `umahub_accelerators`, read by `umahub_schedule` as `context.options`) is an
  example; users set it in `[tool.umahub.options.$acc]` or with
  `umahub compile MODEL --option $acc.vector-lanes=8`, and `umahub plugins`
  lists it with its help.
- The guide is ["Writing a plugin"]("""
    + _WRITING
    + """) in umahub's documentation,
  the hooks' contracts are in the [hook reference]("""
    + _HOOKS
    + """),
  the kit is ["The conformance kit"]("""
    + _CONFORMANCE
    + """).
"""
)

TOX = """\
# Python 3.10-3.13 x apache-tvm 0.25, 0.26, 0.27, as umahub itself is tested.
#   tox                  the default: this Python, the newest TVM umahub supports
#   tox -e py312-tvm025  one cell of the matrix
#   tox -m matrix        the whole matrix
# umahub comes from your index; UMAHUB=/path/to/umahub tox tests against a checkout.
[tox]
requires = tox>=4.11
env_list = py
labels =
    matrix = py{310,311,312,313}-tvm{025,026,027}

[testenv]
description = the plugin's tests, umahub's conformance kit among them
package = editable
deps =
    {env:UMAHUB:umahub}
$extra_deps\
    pytest>=8
    hypothesis
    tvm025: apache-tvm==0.25.*
    tvm026: apache-tvm==0.26.*
    tvm027: apache-tvm==0.27.*
    # apache-tvm-ffi 0.1.15.post2 crashes TVM; apache-tvm 0.25 loads only with 0.1.12
    !tvm025: apache-tvm-ffi!=0.1.15.post2
    tvm025: apache-tvm-ffi==0.1.12
set_env =
    TVM_NUM_THREADS = {env:TVM_NUM_THREADS:2}
commands =
    pytest {posargs}
"""

# ---------------------------------------------------------------- --device: the compiler half

DEVICE_INIT = (
    _header(
        "It declares one accelerator with a device of its own, whose programs run\n"
        "on the device through its runtime, the package $runtime_dist.",
        f'the guides: "A device of its own",\n  {_DEVICE}, and\n  "Writing a plugin", {_WRITING}',
    )
    + '''
import math
import struct

import umahub.plugin as up

UMAHUB_API = 1  # the hook contract this plugin was written for (write the number)

NAME = "$acc"
#: The device's memory, as its runtime ($runtime_module) has it.
MEMORY_BYTES = 16 << 20
#: The program format, shared with $runtime_module: b"RELU", then the element count
#: (4 bytes, little-endian); the metadata says which version of the format it is.
MAGIC = b"RELU"
FORMAT = 1


@up.hookimpl
def umahub_accelerators():
    """The accelerators this plugin declares (called once, when a hub loads the plugin)."""
    return [
        up.Accelerator(
            NAME,
            runtime=NAME,  # the name of the runtime's entry point (umahub.runtimes)
            runtime_package="$runtime_dist",  # what a board must pip install
            memory=[up.MemoryPool(f"{NAME}.dram", MEMORY_BYTES, copy="async")],
            merge=False,  # one match per partition: a program is one ReLU
            operators=("relax.nn.relu",),  # what it takes, for users and the kit
            description="ReLU on float32 on a device of its own (umahub new-plugin)",
        )
    ]
'''
    + _swap(
        _PATTERNS,
        "    need = up.match_bytes(ctx)\n",
        "    if up.shape_of(ctx.matched_expr) is None:\n"
        '        return up.Refusal("a shape known only at run time: a program has a fixed size")\n'
        "    need = up.match_bytes(ctx)\n",
    )
    + '''

@up.hookimpl(accelerator=NAME)
def umahub_codegen(module, context):
    """The partition as a program for the device: there is no default codegen for a
    device. The runtime executes it on the partition's buffers, inputs then outputs.

    ``module[context.symbol]`` is the partition's TIR; ``context.constants`` holds
    the values of its constant inputs (weights), which umahub writes to the device
    once, at load.
    """
    ops = [o.op for o in context.operators]
    if ops != ["relax.nn.relu"]:
        raise ValueError(f"{NAME} runs one ReLU per program, not {', '.join(ops)}")
    output = up.param_buffers(module[context.symbol])[-1]
    count = math.prod(int(d) for d in output.shape)
    return up.DeviceProgram(MAGIC + struct.pack("<I", count), {"format": FORMAT})
'''
    + _HOST_SCHEDULE
)

DEVICE_TEST = _swap(
    _swap(
        _TEST,
        'Run them with ``pytest`` (installed with ``pip install -e ".[test]"``, or from\n'
        'this source tree). The kit\'s options: ``pytest --help``, under "umahub".',
        "The device's runtime must be installed (``pip install -e ../$runtime_dist``;\n"
        "tox does it). Then ``pytest``, with this package installed or from its source\n"
        'tree. The kit\'s options: ``pytest --help``, under "umahub".',
    ),
    "rtol=1e-5, atol=1e-6)\n",
    "rtol=1e-5, atol=1e-6)\n"
    "    (partition,) = compiled.report.partitions  # a program, run by the device's runtime\n"
    '    assert partition.program["runtime"] == NAME\n',
)

HOST_TEST = (
    _TEST
    + '''

def test_the_option_vector_lanes_reaches_the_schedule():
    """A backend option as a user sets it (``[tool.umahub.options.$acc]``), read by
    ``umahub_schedule`` through ``context.options``; the result is the same."""
    mod, inputs = zoo.get("mlp"), zoo.inputs("mlp")
    said = {}
    for lanes in (1, 8):
        hub = umahub.Hub(
            config={
                "plugins": ["$module"],
                "priority": [NAME],
                "on-error": "error",
                "options": {NAME: {"vector-lanes": lanes}},
            },
            project_config=False,
        )
        compiled = hub.compile(mod)
        (partition,) = compiled.report.partitions
        said[lanes] = partition.schedule
        expected = plain_tvm(mod, inputs)
        np.testing.assert_allclose(compiled.run(*inputs), expected, rtol=1e-5, atol=1e-6)
    assert said == {1: [], 8: ["vectorized 1 block(s) by 8 lanes"]}


def test_a_value_the_option_does_not_take_is_refused():
    with pytest.raises(umahub.UmahubError, match="vector-lanes"):
        umahub.Hub(
            config={"plugins": ["$module"], "options": {NAME: {"vector-lanes": 3}}},
            project_config=False,
        )
'''
)

DEVICE_README = README
for _old, _new in (
    (
        "it adds the accelerator `$acc`, which takes ReLU on float32\n"
        "from any model umahub compiles.",
        "it adds the accelerator `$acc`, a device of its own that takes\n"
        "ReLU on float32 from any model umahub compiles. Its programs run on the\n"
        "device through its runtime, the package `$runtime_dist` next to this one,\n"
        "which a board installs instead of this plugin.",
    ),
    ('pip install -e ".[test]"\n', 'pip install -e ../$runtime_dist -e ".[test]"\n'),
    (
        "- Let users tune it: the backend option `vector-lanes` (declared in\n"
        "  `umahub_accelerators`, read by `umahub_schedule` as `context.options`) is an\n"
        "  example; users set it in `[tool.umahub.options.$acc]` or with\n"
        "  `umahub compile MODEL --option $acc.vector-lanes=8`, and `umahub plugins`\n"
        "  lists it with its help.\n",
        "",
    ),
    (
        "The tests run from this source tree too, before the package is installed\n"
        "(`conftest.py`), as long as umahub is.",
        "The tests run from this source tree too (`conftest.py`), as long as umahub\n"
        "and the runtime are installed.",
    ),
    (
        "- The guide is",
        "- Replace the simulated device by yours: `$runtime_dist`, and the program\n"
        "  format that `umahub_codegen` writes. The guide for both halves is\n"
        f'  ["A device of its own"]({_DEVICE}).\n- The guide is',
    ),
):
    DEVICE_README = _swap(DEVICE_README, _old, _new)

# ---------------------------------------------------------------- --device: the runtime

RUNTIME_PYPROJECT = (
    """\
[build-system]
requires = ["setuptools>=77"]  # license as an SPDX expression (PEP 639)
build-backend = "setuptools.build_meta"

[project]
name = "$runtime_dist"
version = "0.1.0"
description = "umahub device runtime of '$acc': a device simulated in Python"
readme = "README.md"
requires-python = ">=3.10"
# Your package's license, as an SPDX expression: Apache-2.0 is umahub's and TVM's,
# a closed one is "LicenseRef-Proprietary". With its text in a file LICENSE, add
# license-files = ["LICENSE"].
license = "Apache-2.0"
dependencies = ["umahub"]  # only umahub.plugin.device: no TVM compiler, no compiler plugin

[project.optional-dependencies]
test = ["pytest>=8"]

[project.urls]  # placeholders: where your runtime lives
Homepage = "https://github.com/YOUR-ORG/$runtime_dist"
Source = "https://github.com/YOUR-ORG/$runtime_dist"
Issues = "https://github.com/YOUR-ORG/$runtime_dist/issues"

# The runtime's name = Accelerator(runtime=...) in $dist.
[project.entry-points."umahub.runtimes"]
$acc = "$runtime_module:Runtime"

[tool.setuptools.packages.find]
where = ["src"]

[tool.pytest.ini_options]
testpaths = ["tests"]
pythonpath = ["src"]
addopts = "-ra"

"""
    + _RUFF
)

RUNTIME_INIT = (
    '''\
"""$runtime_dist: the runtime of the device '$acc', what a board installs.

umahub finds it by its entry point (group ``umahub.runtimes``, name ``$acc``),
opens each instance once per process, loads each program once, writes the
inputs, executes the program on the partition's buffers (inputs, then
outputs) and reads the outputs back. It imports ``umahub.plugin.device`` and
nothing else: no TVM compiler, no compiler plugin.

The device here is simulated, the simplest honest one: its memory is a
``bytearray`` the host reaches only through ``write`` and ``read``, a buffer
is an offset into it, and it executes one instruction, ReLU on float32.
Replace ``SimulatedDevice`` by calls into your driver; the guide is "A device
of its own", '''
    + _DEVICE
    + '''.
"""

from __future__ import annotations

import struct
from array import array

from umahub.plugin.device import Device, DeviceError, DeviceRuntime, done

#: The program format, shared with the compiler plugin: b"RELU", then the
#: element count (4 bytes, little-endian); metadata {"format": 1}.
MAGIC = b"RELU"
FORMAT = 1
#: Each instance's memory, and how buffers in it are aligned.
MEMORY_BYTES = 16 << 20
ALIGN = 64
INSTANCES = 1


class SimulatedDevice(Device):
    """One instance: ``MEMORY_BYTES`` of memory of its own, buffers at offsets in it."""

    def __init__(self, instance: int):
        self.instance = instance
        self.memory = bytearray(MEMORY_BYTES)
        self.buffers: dict[int, int] = {}  # offset -> size

    def allocate(self, nbytes):
        """The first gap that holds ``nbytes`` (aligned), as its offset."""
        size = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        start = 0
        for offset, used in sorted(self.buffers.items()):
            if offset - start >= size:
                break
            start = offset + used
        if start + size > MEMORY_BYTES:
            free = MEMORY_BYTES - sum(self.buffers.values())
            raise DeviceError(f"out of memory: {nbytes} bytes asked, {free} free")
        self.buffers[start] = size
        return start

    def free(self, buffer):
        self.buffers.pop(buffer, None)

    def _span(self, buffer, nbytes):
        if buffer not in self.buffers:
            raise DeviceError(f"no buffer at offset {buffer!r}")
        if nbytes > self.buffers[buffer]:
            raise DeviceError(f"{nbytes} bytes do not fit the buffer of {self.buffers[buffer]}")
        return slice(buffer, buffer + nbytes)

    def write(self, buffer, data):
        data = memoryview(data).cast("B")
        self.memory[self._span(buffer, data.nbytes)] = data
        return done()  # synchronous: complete already

    def read(self, buffer, out):
        out = memoryview(out).cast("B")
        out[:] = self.memory[self._span(buffer, out.nbytes)]
        return done()

    def load(self, program):
        """Check a program; what ``execute`` is given back: its element count."""
        data = program.data
        if len(data) != 8 or data[:4] != MAGIC or program.metadata.get("format") != FORMAT:
            raise DeviceError(f"program rejected: not a ReLU program of format {FORMAT}")
        (count,) = struct.unpack("<I", data[4:])
        return count

    def execute(self, program, buffers):
        """ReLU of ``program`` float32 elements: ``buffers`` are the input, then the output."""
        if len(buffers) != 2:
            raise DeviceError(
                f"a ReLU program runs on 2 buffers (input, output), not {len(buffers)}"
            )
        source, target = (self._span(b, 4 * program) for b in buffers)
        values = array("f")
        values.frombytes(self.memory[source])
        result = array("f", (v if v > 0.0 else 0.0 for v in values))
        self.memory[target] = result.tobytes()
        return done()


class Runtime(DeviceRuntime):
    """The runtime of '$acc': the entry point of group umahub.runtimes."""

    name = "$acc"

    def open(self, instance):
        if not 0 <= instance < INSTANCES:
            raise DeviceError(f"no instance {instance}: this device has {INSTANCES}")
        return SimulatedDevice(instance)

    def describe(self):
        return {"simulated": True, "instances": INSTANCES, "memory_bytes": MEMORY_BYTES}
'''
)

RUNTIME_TEST = '''\
"""$runtime_dist's own tests: the device alone, without TVM or the compiler plugin.

The compiler plugin's tests ($dist) run whole models through it, with
umahub's conformance kit.
"""

import struct
from array import array

import pytest
from umahub.plugin.device import DeviceError, DeviceProgram, DeviceRuntime

from $runtime_module import MAGIC, MEMORY_BYTES, Runtime


def relu_program(count):
    return DeviceProgram(MAGIC + struct.pack("<I", count), {"format": 1})


@pytest.fixture
def device():
    return Runtime().open(0)


def test_the_runtime_is_a_device_runtime():
    assert isinstance(Runtime(), DeviceRuntime)
    assert Runtime.name == "$acc"


def test_bytes_written_come_back(device):
    data = bytes(range(256)) * 5
    buffer = device.allocate(len(data))
    device.write(buffer, memoryview(data)).wait(1)
    back = bytearray(len(data))
    device.read(buffer, memoryview(back)).wait(1)
    assert back == data


def test_relu_runs_on_device_memory(device):
    x = array("f", [-2.0, -0.5, 0.0, 0.5, 2.0])
    source, target = device.allocate(len(x) * 4), device.allocate(len(x) * 4)
    device.write(source, memoryview(x)).wait(1)
    program = device.load(relu_program(len(x)))
    device.execute(program, [source, target]).wait(1)
    y = array("f", bytes(len(x) * 4))
    device.read(target, memoryview(y)).wait(1)
    assert list(y) == [0.0, 0.0, 0.0, 0.5, 2.0]


def test_what_the_device_refuses(device):
    with pytest.raises(DeviceError, match="rejected"):
        device.load(DeviceProgram(b"\\xde\\xad" * 8, {}))
    with pytest.raises(DeviceError, match="2 buffers"):
        device.execute(device.load(relu_program(4)), [device.allocate(16)])
    with pytest.raises(DeviceError, match="out of memory"):
        device.allocate(MEMORY_BYTES + 1)
    with pytest.raises(DeviceError, match="not addressable"):
        device.host_pointer(device.allocate(4))
'''

RUNTIME_README = (
    """\
# $runtime_dist

The device runtime of `$acc`, for [umahub](https://github.com/umahub/umahub):
what a board installs, next to umahub, to run models whose partitions the
compiler plugin `$dist` compiled for `$acc`. It needs neither TVM's compiler
nor the compiler plugin.

The device is simulated in Python, the simplest honest one: memory of its
own (a `bytearray` addressed by offsets), reached only through `write` and
`read`, and one instruction, ReLU on float32. Replace `SimulatedDevice` in
`src/$runtime_module/__init__.py` by calls into your driver, and the program
format by yours (the compiler plugin's `umahub_codegen` writes it).

```sh
pip install -e ".[test]"
umahub plugins          # lists the runtime $acc under "device runtimes"
pytest                  # the device alone; $dist's tests run models on it
```

The guide is ["A device of its own"]("""
    + _DEVICE
    + """) in umahub's documentation.
"""
)

RUNTIME_TOX = """\
[tox]
requires = tox>=4.11
env_list = py
labels =
    matrix = py{310,311,312,313}

[testenv]
description = the runtime's own tests (the device alone)
package = editable
deps =
    {env:UMAHUB:umahub}
    pytest>=8
commands =
    pytest {posargs}
"""

# ---------------------------------------------------------------- the file lists

#: ``path -> template`` of the compiler plugin, ``$module`` in paths filled in too.
HOST_FILES = {
    "pyproject.toml": PYPROJECT,
    "README.md": README,
    "tox.ini": TOX,
    "conftest.py": CONFTEST,
    ".gitignore": _GITIGNORE,
    "src/$module/__init__.py": HOST_INIT,
    "tests/test_$module.py": HOST_TEST,
}

DEVICE_FILES = {
    **HOST_FILES,
    "README.md": DEVICE_README,
    "src/$module/__init__.py": DEVICE_INIT,
    "tests/test_$module.py": DEVICE_TEST,
}

RUNTIME_FILES = {
    "pyproject.toml": RUNTIME_PYPROJECT,
    "README.md": RUNTIME_README,
    "tox.ini": RUNTIME_TOX,
    ".gitignore": _GITIGNORE,
    "src/$runtime_module/__init__.py": RUNTIME_INIT,
    "tests/test_$runtime_module.py": RUNTIME_TEST,
}
