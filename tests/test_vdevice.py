"""VirtualDevice join/default, held to TVM's own test vectors.

TVM writes (device type, virtual device id, target, memory scope) with -1,
None and "" for unconstrained; the cases below keep that notation.
"""

from __future__ import annotations

import pytest

from umahub import VirtualDevice as VD

CUDA, CPU = 2, 1


def test_unconstrained_fields_normalise_to_none():
    assert VD(-1, -1, "", "") == VD() == VD(None, None, None, None)
    assert VD().is_fully_unconstrained


def test_device_type_by_name_or_number_and_from_target():
    assert VD("cuda") == VD(CUDA)
    assert VD(target="llvm").device_type == CPU
    assert VD(target="cuda").device_type == CUDA


def test_targets_compare_by_value():
    import tvm

    assert VD(CPU, 0, "llvm") == VD(CPU, 0, tvm.target.Target("llvm"))
    assert hash(VD(CPU, 0, "llvm")) == hash(VD(CPU, 0, tvm.target.Target("llvm")))


@pytest.mark.parametrize(
    ("lhs", "rhs", "expected"),
    [
        # TVM: join((CUDA,3,-,""), (CUDA,-1,cuda,"global")) = (CUDA,3,cuda,"global")
        (VD(CUDA, 3), VD(CUDA, -1, "cuda", "global"), VD(CUDA, 3, "cuda", "global")),
        (VD(CUDA, -1, "cuda", "global"), VD(CUDA, 3), VD(CUDA, 3, "cuda", "global")),
        (VD(CUDA), VD(CUDA, 2, "cuda"), VD(CUDA, 2, "cuda")),
        (VD(), VD(CUDA, 3, "cuda", "local"), VD(CUDA, 3, "cuda", "local")),
        # Targets equal by value join (TVM, comparing by identity, would refuse).
        (VD(CUDA, 3, "cuda"), VD(CUDA, 3, "cuda"), VD(CUDA, 3, "cuda")),
    ],
)
def test_join_defined(lhs, rhs, expected):
    assert lhs.join(rhs) == expected
    assert rhs.join(lhs) == expected


@pytest.mark.parametrize(
    ("lhs", "rhs"),
    [
        (VD(CUDA), VD(CPU)),
        (VD(CUDA, 3), VD(CUDA, 4)),
        (VD(CUDA, 3, "cuda", "local"), VD(CUDA, 3, "cuda", "global")),
        (VD(CPU, 0, "llvm"), VD(CPU, 0, "c")),
    ],
)
def test_join_conflict_is_none(lhs, rhs):
    assert lhs.join(rhs) is None
    assert rhs.join(lhs) is None


def test_conflict_names_the_fields():
    assert VD(CUDA, 3, None, "local").conflict(VD(CUDA, 4, None, "global")) == (
        "virtual_device_id 3 vs 4, memory_scope 'local' vs 'global'"
    )


def test_default():
    # TVM: default((CPU,-1,llvm,"local"), (CPU,3,-,"global")) = (CPU,3,llvm,"local")
    assert VD(CPU, -1, "llvm", "local").default(VD(CPU, 3, None, "global")) == VD(
        CPU, 3, "llvm", "local"
    )


def test_default_takes_a_target_only_for_the_same_device_type():
    assert VD(CUDA).default(VD(CPU, 1, "llvm")) == VD(CUDA, 1)
    assert VD().default(VD(CPU, 1, "llvm", "global")) == VD(CPU, 1, "llvm", "global")


def test_target_for_another_device_type_is_refused():
    with pytest.raises(ValueError, match="is for device type cuda, not cpu"):
        VD(CPU, -1, "cuda", "local")


def test_str_uses_tvm_notation():
    assert str(VD(CPU, 1, None, "npu.sram")) == "(cpu,1,-,npu.sram)"
