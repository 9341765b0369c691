"""umahub's conformance kit for accelerator vendors: a pytest plugin.

Installed with umahub (entry point ``pytest11``: ``umahub = "umahub.testing"``),
so every pytest run in an environment with umahub has it; it costs nothing
until asked for (no TVM, no plugin, no model is imported at start-up).

Run it on the command line
--------------------------

::

    pytest --umahub-conformance=npu                 # a plugin: all its accelerators
    pytest --umahub-conformance=dsp_cpu --umahub-conformance-models=all
    pytest --umahub-conformance=npu,dsp --umahub-conformance-cross   # also together

``--umahub-conformance=NAME[,NAME]``
    umahub plugins or accelerators to check; an unknown name is a usage error
    that lists the known ones and suggests the closest. The checks are added to
    the session's tests (``-k`` and ``-m`` select among them as usual), as
    ``.../umahub/testing/conformance.py::TestConformance::test_<check>[<accel>-<model>]``.
``--umahub-conformance-models=LIST``
    comma-separated zoo models, or ``all`` (default ``mlp,cnn``: resnet18 and
    bert take much longer to compile). An accelerator whose patterns mention
    ``R.quantize`` or ``R.dequantize`` (it claims quantized operators) is also
    checked on the int8 variant of each model (``mlp_int8``, ``cnn_int8``, ...).
``--umahub-conformance-report=PATH``
    the JSON report (default ``umahub-conformance.json`` in the rootdir).
``--umahub-conformance-examples=N``
    random graphs per accelerator, and of the cross check (default 8).
``--umahub-conformance-cross``
    also check the named accelerators together, in one hub: the
    ``random_placement`` check below, as
    ``umahub-conformance::TestCrossConformance::test_random_placement[<a>+<b>]``
    (``-k cross`` runs it alone).

The checks, for each accelerator (and each model where it applies):

``partition``
    the accelerator's patterns partition the model: every operator it takes is
    in one of its partitions, by one of its patterns.
``compile``
    every partition compiles, with ``on-error = "error"``, where the plan put it.
``matches_host``
    the outputs match plain ``tvm.compile(target="llvm")`` within :data:`TOLERANCE`;
    a quantized output (it comes out of ``R.dequantize``, or is an integer
    tensor) within :data:`STEPS`: in units of its quantization step
    (``|a - r| / scale``), 0 units by default, bit for bit. A failure says how
    many elements differ by how many units (``1 element differs by 1 unit of
    its quantization step from the host (0 units allowed); ...``).
``export_and_reload``
    ``export_library`` then :func:`umahub.load` gives the same outputs.
``pin_instance:<i>``
    with every operator it takes pinned to instance ``i``, it takes the same
    operators, all on ``accel:i``, and the outputs match.
``takes_operators`` (per accelerator, over all its models)
    it takes at least one operator of one of the models: a run in which it
    takes none checked nothing of it and fails, naming the accelerator, the
    models and what to do. Unless it declares its operators
    (``Accelerator(operators=("relax.nn.conv2d", ...))``) and none of the
    models has any of them: then the check is skipped, saying so (the
    accelerator still passes; the report's ``all_models`` notes it). It fails
    too when a declared name is not a registered Relax operator (with the
    closest one), or when the models have declared operators it does not take.
``random_graphs``
    hypothesis draws small graphs (2-6 operators, tensors of at most 16 KiB)
    of the operators its patterns mention; each compiles and matches the host,
    and over all of them the accelerator takes at least one operator.
    Deterministic (``derandomize=True``), no example database, no shrinking.
``random_placement`` (with ``--umahub-conformance-cross``)
    hypothesis draws random graphs (2-7 steps) over the operators of all
    the named accelerators' patterns, shaped as the graphs that break
    partitioning: steps reading any earlier value, values computed inside a
    partition and also read outside or returned (several outputs), constants
    shared by several operators; random pins of the operators, by node name,
    to any accelerator, any of its instances (``dsp_cpu:1``) or ``host``; and
    a random ``priority`` order. Each compiles through one hub holding all
    their plugins. It fails when the compile raises or a partition falls back
    to the host (a plugin failed); when a pin is broken: an operator pinned to
    ``accel:i`` (or ``accel``) runs elsewhere although no warning said that
    the accelerator's patterns cannot take it, or one pinned to ``host`` runs
    elsewhere, or an operator runs on an accelerator by another's pattern;
    when the run raises; or when the outputs differ from plain
    ``tvm.compile`` beyond :data:`TOLERANCE`. A pin that cannot be honoured is
    a warning (the hub compiles with ``on-error = "fallback"``, every other
    warning is a failure), suppressed; so is a compile refusing pins of two
    instances inside one pattern match (a user error). Over all examples some
    operator must run on an accelerator. Deterministic, no database, no
    shrinking: a failure prints the graph (``GraphSpec(v0=x[..]; v1=..; out
    ..)``), the pins and the priority.

Only the accelerator under test claims operators, from a hub that loads only
its plugin (in the cross check: the named accelerators, from a hub of their
plugins); the project's ``[tool.umahub]`` cannot change what is checked. The
JSON report gives, per accelerator and model, the operators it took of the
total, its partitions, the largest absolute error, whether it passed and the
message of each failed check (for a quantized model also the largest
difference in units, ``largest_units``); plus the random graphs' summary, the cross
check's (``"cross"``: examples, operators taken, pins and how many could not
be honoured, largest error), the tolerance and the umahub, TVM, hypothesis and
Python versions.

Use it from a vendor's own tests
--------------------------------

Subclass :class:`ConformanceSuite` and say which accelerator with the marker::

    import pytest
    from umahub.testing import ConformanceSuite

    @pytest.mark.umahub_conformance(accelerator="npu", models=["mlp", "cnn"], examples=6)
    class TestNpuConformance(ConformanceSuite):
        pass

and, for several accelerators together, :class:`CrossConformanceSuite`::

    @pytest.mark.umahub_conformance(accelerator=["npu", "dsp"], examples=20)
    class TestNpuWithDsp(CrossConformanceSuite):
        pass

or write checks of your own with the fixtures:

``umahub_conformance_accelerator``
    the accelerator named by the closest ``umahub_conformance`` marker (else
    by ``--umahub-conformance``).
``umahub_conformance_hub``
    factory ``make(accelerator=None, **config) -> umahub.Hub``: only this
    accelerator claims, ``on-error = "error"``.
``umahub_host_reference``
    ``reference(model_name)``: plain-TVM outputs of a zoo model on
    ``umahub.models.inputs(name)``, computed once per session.
``umahub_conformance_report``
    the recorder behind the JSON report, for checks of your own.

With ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1``, load the kit with ``-p umahub.testing``
or ``pytest_plugins = ["umahub.testing"]`` in a ``conftest.py``.

The marker ``umahub_conformance(accelerator, models=None, examples=None)``
names an accelerator or a plugin; ``models`` and ``examples`` default to the
options'. ``--umahub-conformance-report=PATH`` writes the report also when the
suite runs only through a vendor's subclass. :func:`assert_matches_host` and
:func:`compare` apply :data:`TOLERANCE` to outputs of your own, and
:data:`STEPS` to those whose steps :func:`output_steps` finds.
"""

from __future__ import annotations

from umahub.testing._compare import (
    STEPS,
    TOLERANCE,
    StepTolerance,
    Tolerance,
    assert_matches_host,
    compare,
    output_steps,
    steps_apart,
)
from umahub.testing._cross import CrossConformanceSuite
from umahub.testing._plugin import (
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_itemcollected,
    pytest_runtest_makereport,
    pytest_sessionfinish,
    pytest_terminal_summary,
    umahub_conformance_accelerator,
    umahub_conformance_hub,
    umahub_conformance_report,
    umahub_host_reference,
)
from umahub.testing._suite import ConformanceSuite

__all__ = [
    "STEPS",
    "TOLERANCE",
    "ConformanceSuite",
    "CrossConformanceSuite",
    "StepTolerance",
    "Tolerance",
    "assert_matches_host",
    "compare",
    "output_steps",
    "pytest_addoption",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "pytest_itemcollected",
    "pytest_runtest_makereport",
    "pytest_sessionfinish",
    "pytest_terminal_summary",
    "steps_apart",
    "umahub_conformance_accelerator",
    "umahub_conformance_hub",
    "umahub_conformance_report",
    "umahub_host_reference",
]
