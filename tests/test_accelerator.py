"""Accelerator and MemoryPool: what a plugin may declare."""

from __future__ import annotations

import pytest

import umahub


def test_instances_are_named_virtual_devices():
    acc = umahub.Accelerator(
        "dsp_cpu", codegen="c", instances=2, memory=[umahub.MemoryPool("dsp.tcm", 65536)]
    )
    assert acc.devices == ("dsp_cpu:0", "dsp_cpu:1")
    assert acc.pool == umahub.MemoryPool("dsp.tcm", 65536, "sync")
    assert hash(acc) == hash(
        umahub.Accelerator(
            "dsp_cpu", codegen="c", instances=2, memory=(umahub.MemoryPool("dsp.tcm", 65536),)
        )
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "NPU"}, "Accelerator name 'NPU' must start with a lower-case letter"),
        ({"name": "host"}, "'host' is reserved"),
        (
            {"name": "npu", "codegen": "cuda"},
            "codegen must be one of ('c', 'llvm', 'device'), got 'cuda'",
        ),
        ({"name": "npu", "instances": 0}, "instances must be an int >= 1, got 0"),
        (
            {"name": "npu", "memory": [("sram", 1)]},
            "memory holds ('sram', 1), not a umahub.MemoryPool",
        ),
        (
            {"name": "npu", "operators": "relax.add"},
            "operators must be a sequence of Relax operator names, got the string 'relax.add'",
        ),
        (
            {"name": "npu", "operators": ["conv2d"]},
            "operators holds 'conv2d', which is not a Relax operator name: write them as in "
            "is_op(...), e.g. 'relax.nn.conv2d', 'relax.add'",
        ),
    ],
)
def test_bad_accelerator_is_refused_with_the_reason(kwargs, message):
    with pytest.raises(ValueError) as info:
        umahub.Accelerator(**kwargs)
    assert message in str(info.value)


def test_bad_memory_pool_is_refused():
    with pytest.raises(ValueError, match=r"MemoryPool\('npu.sram'\).copy must be one of"):
        umahub.MemoryPool("npu.sram", 1024, copy="dma")
    with pytest.raises(ValueError, match="size_bytes must be a positive int"):
        umahub.MemoryPool("npu.sram", 0)


def test_declared_operators_are_checked_against_the_registered_relax_operators():
    """A typo is named with the closest registered operator; names repeat once."""
    from umahub.plugin.accelerator import unknown_operators

    acc = umahub.Accelerator("npu", operators=["relax.nn.conv2d", "relax.nn.conv2", "relax.add"])
    assert acc.operators == ("relax.nn.conv2d", "relax.nn.conv2", "relax.add")
    assert unknown_operators(acc) == [
        "Accelerator 'npu': operators names 'relax.nn.conv2', which is not a registered "
        "Relax operator (did you mean 'relax.nn.conv2d'?)"
    ]
    assert umahub.Accelerator("npu", operators=("relax.add", "relax.add")).operators == (
        "relax.add",
    )
    assert unknown_operators(umahub.Accelerator("npu")) == []


def test_import_umahub_does_not_import_tvm():
    import subprocess
    import sys

    code = "import sys, umahub; print('tvm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_loading_the_bundled_plugins_does_not_import_tvm():
    import subprocess
    import sys

    code = (
        "import sys, umahub; umahub.Hub(config={'plugins': ['npu', 'vanilla', 'dsp']}); "
        "print('tvm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_c_of_accelerators_is_compiled_at_o3_with_their_includes_and_sources(tmp_path):
    """-O3: at -O2 gcc vectorizes no loop that needs a run-time overlap check of
    two pointers, and TVM's C loops over several buffers all do (a bias add ran
    one float at a time). Each directory and source once, in order."""
    from umahub.compiler.codegen import export_options

    kernels = tmp_path / "k.c"
    accs = [
        umahub.Accelerator("a", codegen="c", include_dirs=[str(tmp_path)], c_sources=[kernels]),
        umahub.Accelerator("b", codegen="c", include_dirs=[str(tmp_path)]),
    ]
    flags = ["-Wl,-z,now", f"-I{tmp_path}", str(kernels)]
    assert export_options(accs, native=False) == ["-O3", *flags]
    # for this machine, for its CPU (gcc takes -march=native on x86-64 and aarch64)
    assert export_options(accs, native=True) == ["-O3", "-march=native", *flags]


def test_c_is_compiled_for_this_cpu_only_where_the_compiler_takes_it(tmp_path):
    """A build for this machine gets ``-march=native`` (its LLVM kernels are built
    for this CPU too; gcc's default is SSE2); a build for another machine gets
    nothing, and neither does a compiler that refuses the option."""
    from umahub.compiler.codegen import cpu_options

    refusing = tmp_path / "refusing-cc"
    refusing.write_text('#!/bin/sh\nfor a in "$@"; do [ "$a" = -march=native ] && exit 1; done\n')
    refusing.chmod(0o755)
    assert cpu_options(True, "gcc") == ["-march=native"]
    assert cpu_options(False, "gcc") == []
    assert cpu_options(True, str(refusing)) == []
