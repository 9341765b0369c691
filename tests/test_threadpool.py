"""umahub's side effects: none at ``import umahub`` or ``import tvm``; TVM's thread
pool spins briefly for the models umahub runs (umahub.runtime.threadpool)."""

import json
import os
import subprocess
import sys

import pytest

from umahub.runtime.threadpool import SPIN_COUNT

SPIN = "TVM_THREAD_POOL_SPIN_COUNT"

# Prints what the import changed: the environment, and the umahub modules imported.
IMPORTS = """
import json, os, sys
before = dict(os.environ)
import {module}
changed = sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k))
print(json.dumps([changed, sorted(m for m in sys.modules if m.split(".")[0] == "umahub")]))
"""

RUNS = """
import os, numpy as np, umahub, umahub.models as zoo
hub = umahub.Hub(config={"plugins": ["npu"]}, project_config=False)
compiled = hub.compile(zoo.get("cnn"))
print(os.environ.get("TVM_THREAD_POOL_SPIN_COUNT"))
"""


def _python(code, unset=(), **env):
    """The last line ``code`` prints, run without the spin count and ``unset``, with ``env``."""
    clean = {k: v for k, v in os.environ.items() if k != SPIN and k not in unset}
    out = subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    return out.stdout.strip().splitlines()[-1]


def test_import_tvm_imports_only_umahubs_entry_point_and_changes_no_environment():
    changed, modules = json.loads(_python(IMPORTS.format(module="tvm")))
    assert changed == []
    assert modules == ["umahub", "umahub.compiler", "umahub.compiler.tvm_backend"]


def test_import_umahub_imports_nothing_else_and_changes_no_environment():
    changed, modules = json.loads(_python(IMPORTS.format(module="umahub")))
    assert changed == []
    assert modules == ["umahub"]


def test_the_pipeline_name_is_registered_at_import_tvm():
    code = "import tvm; from tvm import relax; print('umahub' in relax.pipeline.PIPELINE_MAP)"
    assert _python(code) == "True"


def test_a_model_umahub_runs_gets_a_short_spin():
    assert SPIN_COUNT == 3000
    assert _python(RUNS) == "3000"


# The spin count when the build first runs a kernel: an int8 convolution's constant
# stages (its weight sums, with a zero point on the input), computed at compile time.
FIRST_KERNEL = """
import os, sys
sys.path.insert(0, {tests!r})
import umahub
from umahub.host import prepack
from test_quantized import qconv_graph
seen = []
real = prepack.compute
spin = lambda: os.environ.get("TVM_THREAD_POOL_SPIN_COUNT")
prepack.compute = lambda todo: seen.append(spin()) or real(todo)
mod, _ = qconv_graph(channels=(16, 16))
umahub.Hub(config={{"plugins": ["npu"]}}, project_config=False).compile(mod)
print(seen)
"""


def test_a_compile_sets_the_spin_count_before_its_build_runs_a_kernel():
    # set later, the pool that kernel started kept TVM's 300,000 turns for the process,
    # and the concurrent executor's idle workers spun whole seconds beside the VM
    tests = os.path.dirname(os.path.abspath(__file__))
    assert _python(FIRST_KERNEL.format(tests=tests)) == "['3000']"


@pytest.mark.parametrize("value", ["0", "300000"])
def test_a_spin_count_the_user_set_is_left_alone(value):
    assert _python(RUNS, **{SPIN: value}) == value


def test_old_module_paths_still_import_with_a_warning():
    code = (
        "import warnings; warnings.simplefilter('error')\n"
        "try:\n    import umahub.threadpool\nexcept DeprecationWarning as w:\n    print(w)"
    )
    assert _python(code) == (
        "umahub.threadpool is now umahub.runtime.threadpool; "
        "the old name goes away in the release after next"
    )


# Started on one core (as under ``taskset -c N``), a model run on the concurrent executor:
# its lanes (the threads umahub pins) keep to that core.
ONE_CORE = """
import os, json
core = min(os.sched_getaffinity(0))
os.sched_setaffinity(0, {core})
import umahub, umahub.models as zoo
hub = umahub.Hub(config={"plugins": ["npu", "dsp"]}, project_config=False)
compiled = hub.compile(zoo.get("cnn"))
compiled.run(*zoo.inputs("cnn"), executor="concurrent")
lanes = compiled._executors.concurrent().cores
print(json.dumps([core, sorted({c for cores in lanes.values() for c in cores})]))
"""


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs two cores and Linux's affinity calls",
)
def test_the_cores_a_process_is_started_on_are_kept():
    core, used = json.loads(_python(ONE_CORE))
    assert used == [core]


# A model run on the VM, started on the last core (TVM pins a pool's threads from
# core 0 on): the thread that ran it, before and after, and TVM's pool size.
VM_ON = """
import os, json
core = max(os.sched_getaffinity(0))
if {one_core}:
    os.sched_setaffinity(0, {{core}})
import umahub, umahub.models as zoo
hub = umahub.Hub(config={{"plugins": ["npu"]}}, project_config=False)
compiled = hub.compile(zoo.get("cnn"))
before = sorted(os.sched_getaffinity(0))
compiled.run(*zoo.inputs("cnn"), executor={executor!r})
print(json.dumps([core, before, sorted(os.sched_getaffinity(0))]))
"""


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs two cores and Linux's affinity calls",
)
@pytest.mark.parametrize("executor", ["vm", "auto"])
def test_the_thread_that_runs_a_model_keeps_the_cores_it_was_started_on(executor):
    core, before, after = json.loads(_python(VM_ON.format(one_core=True, executor=executor)))
    assert before == after == [core]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux's affinity calls")
def test_the_thread_that_runs_a_model_is_not_pinned_to_one_core():
    _, before, after = json.loads(_python(VM_ON.format(one_core=False, executor="vm")))
    assert after == before


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs two cores and Linux's affinity calls",
)
def test_tvm_bind_threads_leaves_the_pinning_to_tvm():
    # a pool of one thread: TVM pins the thread that runs it to core 0 (with more, it
    # leaves that thread on every core)
    code = VM_ON.format(one_core=False, executor="vm")
    _, before, after = json.loads(_python(code, TVM_BIND_THREADS="1", TVM_NUM_THREADS="1"))
    assert len(before) >= 2 and after == [0]


# A model run with the environment the user gave: TVM's pool size after it, the
# count umahub would start a pool with, and the variables the run changed.
POOL = """
import os, json, tvm
before = dict(os.environ)
import umahub, umahub.models as zoo
from umahub.runtime.threadpool import default_threads
hub = umahub.Hub(config={"plugins": ["npu"]}, project_config=False)
hub.compile(zoo.get("cnn")).run(*zoo.inputs("cnn"))
pool = tvm.get_global_func("runtime.NumThreads")()
changed = sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k))
print(json.dumps([pool, default_threads(), changed]))
"""


def _without_thread_counts(code, **env):
    return json.loads(_python(code, unset=("TVM_NUM_THREADS", "OMP_NUM_THREADS"), **env))


def test_a_model_runs_on_one_thread_per_physical_core_and_the_environment_is_kept():
    # TVM alone would start half the logical CPUs on x86 (one thread on a 2-vCPU VM)
    pool, default, changed = _without_thread_counts(POOL)
    assert default is not None  # Linux says which CPUs share a core (CI's machine does)
    assert pool == default
    assert changed == [SPIN]  # the spin count only: TVM_NUM_THREADS was set while TVM read it


@pytest.mark.parametrize("variable", ["TVM_NUM_THREADS", "OMP_NUM_THREADS"])
def test_a_thread_count_the_user_set_is_kept(variable):
    pool, _, changed = _without_thread_counts(POOL, **{variable: "1"})
    assert (pool, changed) == (1, [SPIN])


def _cpus(root, siblings):
    """A sysfs tree of CPUs: ``siblings[i]`` the core_cpus_list of CPU i."""
    for cpu, text in enumerate(siblings):
        topology = root / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "core_cpus_list").write_text(text + "\n")


@pytest.mark.parametrize(
    ("siblings", "cores", "cpu_max", "expected"),
    [
        (["0", "1"], [0, 1], None, 2),  # a VM's vCPUs, reported as cores of their own
        (["0,2", "1,3", "0,2", "1,3"], [0, 1, 2, 3], None, 2),  # two cores, two threads each
        (["0,2", "1,3", "0,2", "1,3"], [0, 2], None, 1),  # both threads of one core
        (["0", "1", "2", "3"], [0, 1, 2, 3], "150000 100000", 2),  # a quota of 1.5 CPUs
        (["0", "1", "2", "3"], [0, 1, 2, 3], "100000 100000", 1),
        (["0", "1", "2", "3"], [0, 1, 2, 3], "max 100000", 4),
    ],
)
def test_default_threads_counts_physical_cores_within_the_cpu_quota(
    tmp_path, monkeypatch, siblings, cores, cpu_max, expected
):
    from umahub.runtime import threadpool

    _cpus(tmp_path / "cpus", siblings)
    (tmp_path / "cgroup").mkdir()
    if cpu_max:
        (tmp_path / "cgroup" / "cpu.max").write_text(cpu_max + "\n")
    monkeypatch.setattr(threadpool, "SYSFS_CPUS", str(tmp_path / "cpus"))
    monkeypatch.setattr(threadpool, "CGROUP", str(tmp_path / "cgroup"))
    assert threadpool.default_threads(cores) == expected


def test_default_threads_leaves_the_count_to_tvm_where_the_topology_is_unknown(
    tmp_path, monkeypatch
):
    from umahub.runtime import threadpool

    monkeypatch.setattr(threadpool, "SYSFS_CPUS", str(tmp_path))
    assert threadpool.default_threads([0, 1]) is None
