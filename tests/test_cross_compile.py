"""Cross-compiling: the zoo's cnn built on this machine for a 64-bit Arm board.

One compile (module-scoped): the host part and the npu's LLVM partitions for
``llvm -mtriple=aarch64-linux-gnu``, the vanilla and dsp C partitions and the
export by Debian's ``aarch64-linux-gnu-g++`` (or ``-gcc``). The library must be
an aarch64 ELF; here it refuses to run or load with a message that says where
to run it; a board of that architecture accepts it. Wrong targets and
compilers are refused before any work, without a compile.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import warnings

import pytest

import umahub
from umahub.cli import main
from umahub.errors import ConfigError, UmahubError
from umahub.targets import TargetError, machine_of, parse_target, this_machine

# as the README's demo: conv1's ReLU pinned to a DSP core, so that all three take a part
BUNDLED = {
    "plugins": ["npu", "vanilla", "dsp"],
    "priority": ["npu", "vanilla_accel", "dsp_cpu"],
    "placement": {"conv1_relu": "dsp_cpu:0"},
}
TARGET = "llvm -mtriple=aarch64-linux-gnu"
EM_AARCH64 = 183
CROSS = next(
    (c for c in ("aarch64-linux-gnu-g++", "aarch64-linux-gnu-gcc") if shutil.which(c)), None
)
HERE = this_machine()

needs_arm_host = pytest.mark.skipif(
    HERE == "aarch64", reason="this machine is aarch64: a build for it is no cross build"
)


def _hub(**config):
    return umahub.Hub(config={**BUNDLED, **config}, project_config=False)


@pytest.fixture(scope="module")
def arm(tmp_path_factory):
    """The zoo's cnn across the bundled plugins, built for aarch64 and exported."""
    if CROSS is None:
        pytest.skip(
            "no aarch64 cross compiler (aarch64-linux-gnu-g++ or -gcc) on PATH; on Debian "
            "or Ubuntu: apt install g++-aarch64-linux-gnu"
        )
    if HERE == "aarch64":
        pytest.skip("this machine is aarch64: a build for it is no cross build")
    import umahub.models as zoo

    compiled = _hub().compile(zoo.get("cnn"), target=TARGET, cc=CROSS)
    path = compiled.export_library(tmp_path_factory.mktemp("cross") / "cnn.so")
    return {"compiled": compiled, "path": str(path), "inputs": zoo.inputs("cnn")}


def test_the_library_is_an_aarch64_elf_with_every_partition_placed(arm):
    with open(arm["path"], "rb") as f:
        head = f.read(20)
    assert head[:4] == b"\x7fELF" and head[4] == 2  # 64-bit
    assert int.from_bytes(head[18:20], "little") == EM_AARCH64
    compiled = arm["compiled"]
    assert compiled.devices == ["host", "npu:0", "vanilla_accel:0", "dsp_cpu:0"]
    assert compiled.report.notes == []
    assert all(not p.fallback for p in compiled.report.partitions)
    assert compiled.target.arch == "aarch64" and compiled.target.cc == CROSS


def test_the_host_part_and_the_npu_partitions_are_llvm_for_the_target(arm):
    modules = arm["compiled"].executable.mod._collect_dso_modules()
    llvm = [json.loads(m.get_function("_get_target_string")()) for m in modules if m.kind == "llvm"]
    assert len(llvm) == 3  # the host, the npu's conv2d and its matmul
    assert all(t["mtriple"] == "aarch64-linux-gnu" for t in llvm)
    assert sorted(m.kind for m in modules) == ["c", "c", "llvm", "llvm", "llvm"]


def test_running_it_here_says_where_to_run_it(arm):
    expected = (
        f"this model is built for aarch64 (target {TARGET}), not for this machine ({HERE}); "
        "run it on such a board: umahub run model.so --rpc HOST:PORT --key KEY (export it "
        "first: Compiled.export_library)"
    )
    with pytest.raises(UmahubError) as caught:
        arm["compiled"].run(*arm["inputs"])
    assert str(caught.value) == expected
    with pytest.raises(UmahubError) as caught:
        arm["compiled"].profile(*arm["inputs"])
    assert str(caught.value) == expected


def test_loading_it_here_says_where_to_run_it(arm, capsys):
    path = arm["path"]
    expected = (
        f"{path} is built for aarch64, not for this machine ({HERE}); run it on such a board: "
        f"umahub run {path} --rpc HOST:PORT --key KEY (or --rpc-server HOST:PORT)"
    )
    with pytest.raises(UmahubError) as caught:
        umahub.load(path)
    assert str(caught.value) == expected
    capsys.readouterr()
    assert main(["run", path]) == 2
    assert capsys.readouterr().err == f"umahub: error: {expected}\n"


class _FakeSession:
    """What a board's RPC session answers, in this process: its machine, upload, load."""

    def __init__(self, machine: str):
        self.machine = machine
        self.uploaded: dict[str, bytes] = {}

    def get_function(self, name: str):
        if name == "umahub.board.info":
            return lambda: json.dumps({"machine": self.machine})
        assert name == "umahub.board.load"
        return lambda library, devices, weights: ("loaded", library, devices, weights)

    def upload(self, blob, name: str) -> None:
        self.uploaded[name] = bytes(blob)


def _board(machine: str):
    from umahub.boards.rpc import Board, _Worker

    session = _FakeSession(machine)
    return Board(session, f"board '{machine}'", 10.0, _Worker()), session


@pytest.mark.parametrize("machine", ["aarch64", "arm64"])  # Linux and macOS say it so
def test_an_aarch64_board_accepts_it(arm, machine):
    board, session = _board(machine)
    model = board.load(arm["path"])
    [(name, blob)] = session.uploaded.items()
    with open(arm["path"], "rb") as f:
        assert blob == f.read()
    assert model.devices == ["host", "npu:0", "vanilla_accel:0", "dsp_cpu:0"]


def test_a_board_of_this_machine_refuses_it(arm):
    from umahub.boards.rpc import RemoteError

    board, session = _board(HERE)
    with pytest.raises(RemoteError) as caught:
        board.load(arm["path"])
    assert str(caught.value) == (
        f"board '{HERE}' cannot load {arm['path']}: the library is built for aarch64, the "
        f"board is {HERE} (wrong architecture); compile for the board: umahub compile MODEL "
        f'--target "llvm -mtriple={HERE}-linux-gnu" --cc {HERE}-linux-gnu-gcc'
    )
    assert session.uploaded == {}


# ---------------------------------------------------------------- refused before any work


def test_target_forms():
    assert parse_target(TARGET) == {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}
    assert parse_target("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a76 -mattr=+neon,+fp16") == {
        "kind": "llvm",
        "mtriple": "aarch64-linux-gnu",
        "mcpu": "cortex-a76",
        "mattr": ["+neon", "+fp16"],
    }
    assert parse_target('{"kind": "llvm", "mtriple": "aarch64-linux-gnu"}') == parse_target(TARGET)
    assert parse_target({"kind": "llvm", "num-cores": 4}) == {"kind": "llvm", "num-cores": 4}
    assert [machine_of(m) for m in ("arm64", "armv7l", "arm-linux-gnueabihf", "AMD64")] == [
        "aarch64",
        "arm",
        "arm",
        "x86_64",
    ]


@pytest.mark.parametrize(
    ("target", "cc", "message"),
    [
        (
            "lvm -mtriple=aarch64-linux-gnu",
            "gcc",
            "target 'lvm -mtriple=aarch64-linux-gnu': umahub builds the host part with LLVM, so "
            "the target must be an llvm target (kind 'lvm' is not); say "
            "'llvm -mtriple=aarch64-linux-gnu'",
        ),
        (
            "llvm mtriple=aarch64",
            "gcc",
            "target 'llvm mtriple=aarch64': 'mtriple=aarch64' is not an option of the form "
            "-name=value (as in 'llvm -mtriple=aarch64-linux-gnu')",
        ),
        (
            "llvm -mtriple=foo-bar",
            "gcc",
            "target 'llvm -mtriple=foo-bar' is not a target this TVM can build for (No "
            'available targets are compatible with triple "foo-bar"); say, for a 64-bit Arm '
            "board, 'llvm -mtriple=aarch64-linux-gnu'",
        ),
        (
            "llvm -mtriple=aarch64-linux-gnu",
            "aarch64-nowhere-linux-gnu-gcc",
            "cc aarch64-nowhere-linux-gnu-gcc: no such compiler (not on PATH); install it (for "
            "aarch64 on Debian or Ubuntu: apt install gcc-aarch64-linux-gnu) or give its path",
        ),
    ],
)
def test_a_wrong_target_or_compiler_is_one_clear_line(target, cc, message):
    import umahub.models as zoo

    with pytest.raises(TargetError) as caught:
        _hub().compile(zoo.get("mlp"), target=target, cc=cc)
    assert str(caught.value) == message


@needs_arm_host
def test_another_architecture_needs_a_compiler_for_it():
    import umahub.models as zoo

    with pytest.raises(TargetError) as caught:
        _hub().compile(zoo.get("mlp"), target=TARGET)
    assert str(caught.value) == (
        f"target 'llvm -mtriple=aarch64-linux-gnu' builds for aarch64, not for this machine "
        f"({HERE}): give a C compiler for aarch64 to compile and link the library (cc "
        "aarch64-linux-gnu-gcc; on Debian or Ubuntu: apt install gcc-aarch64-linux-gnu)"
    )
    native_cc = shutil.which("gcc")
    if native_cc:
        with pytest.raises(TargetError) as caught:
            _hub().compile(zoo.get("mlp"), target=TARGET, cc="gcc")
        assert str(caught.value).startswith("cc gcc builds for ")
        assert str(caught.value).endswith(
            ", the target is aarch64; give a compiler for aarch64 (cc aarch64-linux-gnu-gcc)"
        )


@needs_arm_host
@pytest.mark.skipif(CROSS is None, reason="no aarch64 cross compiler on PATH")
def test_verify_and_profile_are_refused_or_skipped():
    import umahub.models as zoo
    from umahub.compiler.pipeline import check_target

    for option in ("verify", "profile"):
        with pytest.raises(TargetError) as caught:
            _hub().compile(zoo.get("mlp"), target=TARGET, cc=CROSS, **{option: True})
        assert str(caught.value) == (
            f"{option} runs the model on this machine ({HERE}), and it is built for aarch64: "
            f"compile without {option}, or check a build for this machine first"
        )
    hub = _hub(verify=True, target=TARGET, cc=CROSS)
    with warnings.catch_warnings(record=True) as caught_warnings:
        warnings.simplefilter("always")
        target = check_target(hub)
    assert target.arch == "aarch64" and target.cc == CROSS and not target.native
    assert [str(w.message) for w in caught_warnings] == [
        "umahub: verify (in <defaults> + config=) skipped: the model is built for aarch64 "
        f"and cannot run on this machine ({HERE})"
    ]


def test_the_config_takes_a_target_and_a_compiler():
    hub = _hub(target={"kind": "llvm", "mtriple": "aarch64-linux-gnu"}, cc="cc")
    assert hub.config.target == {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}
    assert hub.config.cc == "cc"
    with pytest.raises(ConfigError) as caught:
        _hub(target="cuda")
    assert str(caught.value) == (
        "config=: [tool.umahub] target 'cuda': umahub builds the host part with LLVM, so the "
        "target must be an llvm target (kind 'cuda' is not); say 'llvm -mtriple=aarch64-linux-gnu'"
    )


def test_a_native_target_builds_and_runs_here():
    from umahub.compiler.pipeline import check_target

    target = check_target(_hub(), f"llvm -mtriple={platform.machine()}-linux-gnu")
    assert target.native and target.arch == HERE and target.cc is None


@needs_arm_host
def test_the_command_line_refuses_before_loading_the_model(tmp_path, capsys):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.umahub]\nplugins = ["npu", "vanilla", "dsp"]\n'
        'priority = ["npu", "vanilla_accel", "dsp_cpu"]\n'
    )
    out = tmp_path / "cnn.so"
    assert main(["compile", "cnn", "-o", str(out), "--target", TARGET]) == 2
    captured = capsys.readouterr()
    assert captured.err == (
        f"umahub: error: --target 'llvm -mtriple=aarch64-linux-gnu' builds for aarch64, not "
        f"for this machine ({HERE}): give a C compiler for aarch64 to compile and link the "
        "library (--cc aarch64-linux-gnu-gcc; on Debian or Ubuntu: apt install "
        "gcc-aarch64-linux-gnu)\n"
    )
    assert not out.exists()
    if CROSS is not None:
        argv = ["compile", "cnn", "-o", str(out), "--target", TARGET, "--cc", CROSS, "--verify"]
        assert main(argv) == 2
        assert capsys.readouterr().err == (
            f"umahub: error: --verify runs the model on this machine ({HERE}), and it is built "
            "for aarch64: compile without --verify, or check a build for this machine first\n"
        )
    assert main(["compile", "cnn", "--target", TARGET, "--cc", "aarch64-nowhere-gcc"]) == 2
    assert capsys.readouterr().err == (
        "umahub: error: --cc aarch64-nowhere-gcc: no such compiler (not on PATH); install it "
        "(for aarch64 on Debian or Ubuntu: apt install gcc-aarch64-linux-gnu) or give its path\n"
    )
    assert os.listdir(tmp_path) == ["pyproject.toml"]  # nothing written


class _Stubborn:
    """A plugin whose LLVM codegen ignores ``context.target`` (builds for this machine)."""

    UMAHUB_API = 1

    @umahub.hookimpl
    def umahub_accelerators(self):
        return [umahub.Accelerator("stubborn", codegen="llvm")]

    @umahub.hookimpl(accelerator="stubborn")
    def umahub_patterns(self):
        from tvm.relax.dpl import is_op, wildcard

        return [("stubborn.relu", is_op("relax.nn.relu")(wildcard()))]

    @umahub.hookimpl(accelerator="stubborn")
    def umahub_codegen(self, module, context):
        import tvm

        return tvm.tirx.build(module, target="llvm", pipeline=context.tir_pipeline)


@needs_arm_host
@pytest.mark.skipif(CROSS is None, reason="no aarch64 cross compiler on PATH")
def test_a_plugin_that_ignores_the_target_falls_back_naming_it():
    import umahub.models as zoo

    hub = umahub.Hub(plugins=[_Stubborn()], autoload=False, project_config=False)
    with pytest.warns(umahub.UmahubWarning):
        compiled = hub.compile(zoo.get("mlp"), target=TARGET, cc=CROSS)
    assert compiled.report.notes == [
        "plugin '_Stubborn' failed in umahub_codegen for partition stubborn_0_relu "
        "(stubborn.relu) on stubborn:0: CompileError: the LLVM code is built for "
        f"{HERE}, the compile's target is aarch64: build it for context.target "
        "(tvm.tirx.build(module, target=context.target, ...))"
    ]
    assert compiled.devices == ["host"]
