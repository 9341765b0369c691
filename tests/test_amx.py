"""AMX for the int8 matmul (umahub.host.amx), and the host target that lets a build see it.

The kernels run only where this CPU has AMX and Linux lets the process use it
(an Intel Xeon of Sapphire Rapids or later); the target tests run anywhere.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import tvm
from test_int8_schedules import _classifier
from test_quantized import qconv_graph, reference

import umahub
from umahub import targets
from umahub.host.amx import has_amx

needs_amx = pytest.mark.skipif(not has_amx(), reason="this CPU has no AMX (or Linux refuses it)")

#: This CPU by LLVM's name for it, without the features the name lacks: VNNI, no AMX
#: (an AMX CPU's name that LLVM knows has it: the features are what the test removes).
NAMED_ONLY = {"kind": "llvm", "mcpu": str(tvm.target.codegen.llvm_get_system_cpu())}
NO_AMX = {**NAMED_ONLY, "mattr": ["-amx-int8", "-amx-tile"]}


def test_the_host_target_adds_the_features_the_cpu_has_and_its_name_lacks(monkeypatch):
    """A virtual machine reports its Sapphire Rapids Xeon as model 167, which LLVM
    names Rocket Lake: the target then names the AMX and AVX512-FP16 the CPU reports
    as features, not those it lacks, nor those Rocket Lake has already."""
    monkeypatch.setattr(tvm.target.codegen, "llvm_get_system_cpu", lambda: "rocketlake")
    flags = {"avx512f", "avx512_vnni", "avx512_fp16", "amx_tile", "amx_int8"}
    monkeypatch.setattr(targets, "_cpu_flags", lambda: flags)
    assert targets.host_target() == {
        "kind": "llvm",
        "mcpu": "rocketlake",
        "mattr": ["+avx512fp16", "+amx-tile", "+amx-int8"],
    }
    monkeypatch.setattr(targets, "_cpu_flags", lambda: {"avx512f", "avx512_vnni"})
    assert targets.host_target() == {"kind": "llvm", "mcpu": "rocketlake"}


def test_a_cross_build_or_a_cpu_without_amx_gets_no_amx():
    assert not has_amx({"kind": "llvm", "mtriple": "aarch64-linux-gnu"})
    assert not has_amx({"kind": "llvm", "mcpu": "znver4"})
    assert not has_amx({"kind": "llvm", "mcpu": "rocketlake"})


@pytest.fixture(scope="module")
def hub():
    return umahub.Hub(config={"plugins": ["npu"]}, project_config=False)


def _schedules(compiled):
    return [s for p in compiled.report.partitions for s in p.schedule]


@needs_amx
@pytest.mark.parametrize(
    ("rows", "depth", "channels"),
    [(32, 128, 64), (16, 64, 16), (48, 192, 48), (64, 768, 96)],
    ids=["2x2 tiles", "one tile", "16-row tasks, one block", "bert-like"],
)
def test_an_int8_matmul_on_amx_is_bit_for_bit_the_vnni_one(hub, built_asm, rows, depth, channels):
    mod, a = _classifier(channels, depth=depth, rows=rows, seed=rows)
    amx = hub.compile(mod)
    (asm,) = [a for a in built_asm if "tdpbusd" in a]
    assert "ldtilecfg" in asm and "tilerelease" in asm
    vnni = hub.compile(mod, target=NO_AMX)
    assert _schedules(amx) == ["int8 matmul: amx, 16x16 tiles, weights packed at compile time"]
    assert _schedules(vnni) == ["int8 matmul: vnni, 16x4 dot, weights packed at compile time"]
    out = amx.run(a)
    np.testing.assert_array_equal(out, vnni.run(a))
    # not all saturated or all zero: the sums reach the output
    assert len(np.unique(out)) > 16


#: A CPU with AMX as LLVM names it: a build for it on any x86-64 machine (not run).
SAPPHIRE_RAPIDS = {"kind": "llvm", "mcpu": "sapphirerapids"}


@pytest.mark.skipif(targets.this_machine() != "x86_64", reason="the build is for x86-64")
@pytest.mark.parametrize(
    ("graph", "said", "instruction"),
    [
        ("matmul", "int8 matmul: amx, 16x16 tiles", "tdpbusd"),
        ("1x1", "int8 conv2d 1x1: amx, 16x16 tiles", "tdpbsud"),
        ("3x3", "int8 conv2d: amx, 8x16 tiles", "tdpbusd"),
    ],
)
def test_the_amx_kernels_build_on_any_x86_machine(
    monkeypatch, hub, built_asm, graph, said, instruction
):
    """The schedules and the tile pass, where the tests above skip (a CPU without AMX,
    as the AMD EPYC): a build for a Sapphire Rapids, as if this machine were one, gives
    the tile instructions and the report's words; it is not run."""
    from umahub.host import int8

    monkeypatch.setattr(int8, "has_amx", lambda target=None: True)
    if graph == "matmul":
        mod, _ = _classifier(32, depth=128, rows=32)
    else:
        kernel = 1 if graph == "1x1" else 3
        mod, _ = qconv_graph(kernel=kernel, padding=(kernel // 2,) * 4, channels=(64, 32), size=8)[
            :2
        ]
    compiled = hub.compile(mod, target=SAPPHIRE_RAPIDS)
    assert _schedules(compiled) == [f"{said}, weights packed at compile time"]
    (asm,) = [a for a in built_asm if instruction in a]
    assert "ldtilecfg" in asm and "tilezero" in asm and "tilestored" in asm


@needs_amx
@pytest.mark.parametrize(
    ("rows", "depth"), [(1, 128), (32, 96)], ids=["one row", "depth no multiple of 64"]
)
def test_a_matmul_the_tiles_do_not_fit_keeps_vnni(hub, rows, depth):
    mod, a = _classifier(32, depth=depth, rows=rows)
    compiled = hub.compile(mod)
    assert _schedules(compiled) == ["int8 matmul: vnni, 16x4 dot, weights packed at compile time"]
    np.testing.assert_array_equal(compiled.run(a), hub.compile(mod, target=NO_AMX).run(a))


@needs_amx
@pytest.mark.parametrize(
    ("channels", "size"),
    [((64, 32), 8), ((128, 16), 4), ((64, 48), 6)],
    ids=["2x2 tiles", "one tile", "16-channel tasks, one block of positions"],
)
def test_an_int8_pointwise_convolution_on_amx_is_bit_for_bit_the_vnni_one(
    hub, built_asm, channels, size
):
    """A 1x1 convolution: the weight's rows by 16 positions (``tdpbsud``), also where
    the positions were rounded up to whole vectors (6x6: 36 of 48)."""
    mod, _ = qconv_graph(kernel=1, padding=(0, 0, 0, 0), channels=channels, size=size)
    amx = hub.compile(mod)
    (asm,) = [a for a in built_asm if "tdpbsud" in a]
    assert "ldtilecfg" in asm
    vnni = hub.compile(mod, target=NO_AMX)
    assert _schedules(amx) == ["int8 conv2d 1x1: amx, 16x16 tiles, weights packed at compile time"]
    assert _schedules(vnni) == [
        "int8 conv2d 1x1: vnni, 16x4 dot over 16 positions, weights packed at compile time"
    ]
    x = np.random.default_rng(3).integers(0, 256, size=(1, channels[0], size, size))
    out = amx.run(x.astype("uint8"))
    np.testing.assert_array_equal(out, vnni.run(x.astype("uint8")))
    assert len(np.unique(out)) > 16


@needs_amx
@pytest.mark.parametrize(
    ("channels", "size", "kernel", "strides", "tile"),
    [
        ((64, 32), 12, 3, (1, 1), 12),
        ((64, 48), 9, 5, (1, 1), 9),
        ((128, 64), 14, 3, (2, 2), 7),
        ((64, 32), 11, 3, (1, 1), 11),
        ((64, 32), 12, 3, (2, 1), 12),
    ],
    ids=[
        "3x3, tasks of 2 rows",
        "5x5, 16-channel tasks",
        "3x3 stride 2",
        "odd rows, 1-row tasks",
        "strides 2 down, 1 along",
    ],
)
def test_an_int8_convolution_on_amx_is_bit_for_bit_the_vnni_one(
    hub, built_asm, channels, size, kernel, strides, tile
):
    """A convolution: a tile of a row's positions, each a row of 64 bytes of its
    window's channels (the input copied channels last), by the weight's blocks, for
    each tap; strided too (the tile's rows that many positions apart, a task's rows
    the stride down apart: with strides (2, 1) the rows were once a column's stride
    apart, a wrong answer)."""
    pad = kernel // 2
    mod, parts = qconv_graph(
        kernel=kernel, padding=(pad,) * 4, channels=channels, size=size, strides=strides
    )[:2]
    amx = hub.compile(mod)
    (asm,) = [a for a in built_asm if "tdpbusd" in a]
    assert "tilezero" in asm
    assert _schedules(amx) == [f"int8 conv2d: amx, {tile}x16 tiles, weights packed at compile time"]
    x = np.random.default_rng(6).integers(0, 256, size=(1, channels[0], size, size))
    out = amx.run(x.astype("uint8"))
    np.testing.assert_array_equal(out, reference(x.astype("uint8"), parts))
    np.testing.assert_array_equal(out, hub.compile(mod, target=NO_AMX).run(x.astype("uint8")))
    assert len(np.unique(out)) > 16


@needs_amx
@pytest.mark.parametrize(
    ("channels", "size"),
    [((48, 32), 8), ((64, 24), 8), ((64, 32), 3)],
    ids=["input channels no whole 64-byte steps", "output channels no whole 16", "rows of 3"],
)
def test_a_convolution_the_tiles_do_not_fit_keeps_vnni(hub, channels, size):
    mod, parts = qconv_graph(channels=channels, size=size)[:2]
    compiled = hub.compile(mod)
    assert _schedules(compiled) == ["int8 conv2d: vnni, 16x4 dot, weights packed at compile time"]
    x = np.random.default_rng(7).integers(0, 256, size=(1, channels[0], size, size))
    x = x.astype("uint8")
    np.testing.assert_array_equal(compiled.run(x), reference(x, parts))


@needs_amx
def test_a_pointwise_convolutions_weight_is_packed_as_the_tiles_rows(hub, built_asm):
    """The packing writes the weight as AMX reads it, rows of its channels, once: no
    copy of it in the kernel, and a weight over 64 KiB (256 to 512 channels) leaves the
    kernel's other per-channel stages to compile time (a copy of the packing once kept
    them all in the kernel, the weight's sums summed at every call). The tasks start
    from ``tilezero``, not from zeros stored and loaded."""
    mod, _ = qconv_graph(kernel=1, padding=(0, 0, 0, 0), channels=(256, 512), size=4)
    compiled = hub.compile(mod)
    (partition,) = compiled.report.partitions
    assert partition.packed == ["weight 3 (512x256x1x1 -> 512x64x4)"]
    # requantized in float64: AMX's CPUs are Intel's (double_pays_in_pointwise)
    assert partition.precomputed == [
        "bias_q, requant_bits, requant_double, requant_exp, requant_k, requant_m,"
        " weight_sum (8 KiB)"
    ]
    (asm,) = [a for a in built_asm if "tdpbsud" in a]
    assert "tilezero" in asm
    x = np.random.default_rng(4).integers(0, 256, size=(1, 256, 4, 4)).astype("uint8")
    out = compiled.run(x)
    np.testing.assert_array_equal(out, hub.compile(mod, target=NO_AMX).run(x))
    assert len(np.unique(out)) > 16


@needs_amx
def test_an_exported_amx_library_runs_in_a_process_that_never_asked_for_amx(hub, tmp_path):
    """The kernel asks Linux for the tiles itself: plain TVM, with no umahub imported,
    runs the library (without the request, the first tile instruction kills the process)."""
    mod, a = _classifier(64, depth=128, rows=32)
    compiled = hub.compile(mod)
    assert _schedules(compiled)[0].startswith("int8 matmul: amx")
    path = compiled.export_library(tmp_path / "amx.so")
    np.save(tmp_path / "a.npy", a)
    script = f"""
import numpy as np, tvm
from tvm import relax
vm = relax.VirtualMachine(tvm.runtime.load_module({str(path)!r}), tvm.cpu())
weights = list(vm["umahub_weights"]())  # the partitions' weights, as umahub.load passes them
out = vm["main"](tvm.runtime.tensor(np.load({str(tmp_path / "a.npy")!r})), *weights)
np.save({str(tmp_path / "out.npy")!r}, out.numpy())
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), compiled.run(a))
