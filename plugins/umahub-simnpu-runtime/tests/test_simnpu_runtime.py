"""The runtime contract on the simnpu: transfers, programs loaded and run, programs
rejected, faults mid-run, a device lost, memory, asynchrony; and the package alone
(no TVM), its library built on first use."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from umahub_simnpu_runtime import SimNpuDevice, SimNpuRuntime, isa, native
from umahub_simnpu_runtime.device import parse_faults
from umahub_simnpu_runtime.memory import ALIGNMENT, Allocator

from umahub.plugin.device import DeviceError, DeviceProgram, Pending

SRC = Path(__file__).resolve().parents[1] / "src"
WAIT = 10


@pytest.fixture
def device():
    dev = SimNpuRuntime(dram_bytes=1 << 20).open(0)
    yield dev
    dev.close()


def _put(dev: SimNpuDevice, array: np.ndarray) -> int:
    buffer = dev.allocate(array.nbytes)
    dev.write(buffer, memoryview(np.ascontiguousarray(array)).cast("B")).wait(WAIT)
    return buffer


def _get(dev: SimNpuDevice, buffer: int, shape, dtype) -> np.ndarray:
    out = np.empty(shape, dtype)
    dev.read(buffer, memoryview(out).cast("B")).wait(WAIT)
    return out


def _dot_program(rows: int, x_type: int = isa.I8, pad: int = 0) -> tuple[bytes, np.ndarray]:
    """``y[r] = W @ x[r]`` (int32) for ``rows`` rows of 16 int8/uint8 values, W in the data."""
    w = np.arange(256, dtype=np.int64).reshape(16, 16) % 7 - 3
    program = isa.program(
        [
            isa.load(isa.INP, 0, 0, x_type, 0, [(rows, 0, 0, 16, 16), (16, 0, 0, 1, 1)], pad),
            isa.load(isa.WGT, 0, isa.DATA_SLOT, isa.I8, 0, [(256, 0, 0, 1, 1)]),
            isa.gemm([rows], (0, 16), (0, 0), (0, 0), reset=True),
            isa.gemm([rows], (0, 16), (0, 16), (0, 0)),
            isa.store(1, isa.I32, 0, 0, [(rows, 16, 16), (16, 1, 1)]),
        ],
        buffers=2,
        data=w.astype(np.int8).tobytes(),
        version=1,
    )
    return program, w


# ------------------------------------------------------------------ transfers and memory


def test_transfers_round_trip_bytes_of_any_type(device):
    for array in (
        np.arange(1000, dtype=np.float32),
        np.arange(-128, 128, dtype=np.int8).reshape(16, 16),
        np.array([7], dtype=np.uint8),
    ):
        buffer = _put(device, array)
        assert np.array_equal(_get(device, buffer, array.shape, array.dtype), array)
        device.free(buffer)
    assert device.free_bytes == 1 << 20


def test_buffers_are_offsets_and_the_host_pointer_is_refused(device):
    a, b = device.allocate(10), device.allocate(10)
    assert (a, b) == (0, ALIGNMENT)
    with pytest.raises(DeviceError, match="not addressable by the host"):
        device.host_pointer(a)


def test_out_of_memory_says_requested_and_free(device):
    device.allocate(1000)
    with pytest.raises(DeviceError, match=r"out of device memory: 2000000 bytes requested, \d+"):
        device.allocate(2_000_000)


def test_a_transfer_beyond_its_buffer_is_refused(device):
    buffer = device.allocate(8)
    with pytest.raises(DeviceError, match="writing 16 bytes into a buffer of 8"):
        device.write(buffer, memoryview(bytes(16)))
    with pytest.raises(DeviceError, match="not a buffer"):
        device.read(12345, memoryview(bytearray(4)))


def test_the_allocator_is_first_fit_and_merges_neighbours():
    memory = Allocator(4 * ALIGNMENT)
    a, b, c = (memory.allocate(ALIGNMENT) for _ in range(3))
    memory.free(b)
    assert memory.allocate(1) == b  # first fit reuses the hole
    memory.free(a)
    memory.free(b)
    assert memory.largest_free == 2 * ALIGNMENT  # a and b merged
    memory.free(c)
    assert memory.largest_free == 4 * ALIGNMENT
    with pytest.raises(DeviceError, match="not a buffer"):
        memory.free(c)


# ------------------------------------------------------------------ programs


@pytest.mark.parametrize("x_type", [isa.I8, isa.U8])
def test_a_program_runs_the_matrix_core_asynchronously(device, x_type):
    rows = 5
    dtype = np.int8 if x_type == isa.I8 else np.uint8
    x = np.random.default_rng(0).integers(0, 256, (rows, 16)).astype(np.uint8).view(dtype)
    program, w = _dot_program(rows, x_type)
    loaded = device.load(DeviceProgram(program, {"version": 1}))
    xb, yb = _put(device, x), device.allocate(rows * 16 * 4)
    completion = device.execute(loaded, [xb, yb])
    assert isinstance(completion, Pending)
    completion.wait(WAIT)
    machine = x.astype(np.int64) - (128 if x_type == isa.U8 else 0)  # uint8 made int8 by the load
    assert np.array_equal(_get(device, yb, (rows, 16), np.int32), machine @ w.T)
    counters = device.counters()
    assert counters["instructions"] == 5 and counters["runs"] == 1
    assert counters["macs"] == rows * 256 and counters["gemm_cycles"] > 0


def test_loads_pad_and_the_vector_unit_requantizes_exactly(device):
    """LOAD's padding, ALU's FXP (rounding half to even in int64), ADD, MAX, MIN and
    STORE's saturation, against numpy."""
    rng = np.random.default_rng(1)
    acc = rng.integers(-(2**31), 2**31, 32, dtype=np.int64).astype(np.int32)
    acc[:4] = [5, -5, 6, -6]  # halves: 5 * m / 2**k with m = 1, k = 1 is 2.5
    m = np.r_[np.ones(4), rng.integers(2**30, 2**31, 12)].astype(np.int32)
    k = np.r_[np.ones(4), rng.integers(20, 40, 12)].astype(np.int32)
    data = np.concatenate([m, k]).astype("<i4").tobytes()
    program = isa.program(
        [
            isa.load(isa.ACC, 0, 0, isa.I32, 0, [(2, 1, 0, 16, 16), (16, 0, 0, 1, 1)], pad_value=9),
            isa.load(isa.ACC, 1024, isa.DATA_SLOT, isa.I32, 0, [(32, 0, 0, 1, 1)]),
            isa.alu(isa.ALU_FXP, (3, 1), (0, 16, 0), mul_base=1024, shift_base=1040),
            isa.alu(isa.ALU_ADD, (3, 1), (0, 16, 0), imm=3),
            isa.alu(isa.ALU_MAX, (3, 1), (0, 16, 0), imm=-100),
            isa.alu(isa.ALU_MIN, (3, 1), (0, 16, 0), imm=100),
            isa.store(1, isa.I8, 0, 0, [(48, 1, 1)]),
        ],
        buffers=2,
        data=data,
        version=1,
    )
    loaded = device.load(DeviceProgram(program))
    src, out = _put(device, acc), device.allocate(48)
    device.execute(loaded, [src, out]).wait(WAIT)
    got = _get(device, out, (3, 16), np.int8)
    tiles = np.stack([np.full(16, 9), acc[:16], acc[16:]]).astype(np.int64)  # row 0: padding
    p = tiles * m
    kk = k.astype(np.int64)
    rounded = (p + (np.int64(1) << (kk - 1)) - 1 + ((p >> kk) & 1)) >> kk
    want = np.clip(np.clip(rounded, -(2**31), 2**31 - 1) + 3, -100, 100)
    assert np.array_equal(got, want)
    assert list(got[1, :4]) == [5, 1, 6, 0]  # 2.5 -> 2, -2.5 -> -2, 3 -> 3, -3 -> -3, plus 3


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: b"NOPE" + p[4:], "bad magic"),
        (lambda p: p[:4] + b"\x09\x00" + p[6:], "format version 9"),
        (lambda p: p[:-3], "but its header says"),
        (lambda p: p[:32] + b"\x07" + p[33:], "opcode 7"),
        (lambda p: p[:33] + b"\x01" + p[34:], "dependency flags"),
        (lambda p: p[: 32 + 4] + b"\x05\x00" + p[32 + 6 :], "names buffer 5; the program has 2"),
        (lambda p: p[:8], "shorter than the 32-byte header"),
    ],
)
def test_a_damaged_program_is_rejected_saying_why(device, damage, message):
    program, _ = _dot_program(2)
    with pytest.raises(DeviceError, match=f"program rejected: .*{message}"):
        device.load(DeviceProgram(damage(program)))


def test_on_chip_ranges_out_of_bounds_are_rejected(device):
    too_far = isa.gemm([isa.ACC_WORDS // 16], (16, 16), (0, 0), (0, 0))
    with pytest.raises(DeviceError, match=r"program rejected: instruction 0 \(GEMM\) reaches ACC"):
        device.load(DeviceProgram(isa.program([too_far], buffers=0)))
    past_data = isa.load(isa.INP, 0, isa.DATA_SLOT, isa.I8, 0, [(17, 0, 0, 1, 1)])
    with pytest.raises(DeviceError, match="reads bytes \\[0, 17\\) of the data segment"):
        device.load(DeviceProgram(isa.program([past_data], buffers=0, data=bytes(16))))


def test_an_access_outside_a_buffer_faults_mid_run_and_the_device_goes_on(device):
    program, _ = _dot_program(4)
    loaded = device.load(DeviceProgram(program))
    x, small = _put(device, np.zeros((4, 16), np.int8)), device.allocate(4 * 16 * 4 - 1)
    with pytest.raises(DeviceError, match=r"fault at instruction 4 \(STORE\): bytes \[0, 256\)"):
        device.execute(loaded, [x, small]).wait(WAIT)
    with pytest.raises(DeviceError, match="runs on 2 buffers, 1 were given"):
        device.execute(loaded, [x])
    y = device.allocate(4 * 16 * 4)
    device.execute(loaded, [x, y]).wait(WAIT)  # still usable


def test_injected_faults_and_hangs(device):
    program, _ = _dot_program(1)
    loaded = device.load(DeviceProgram(program))
    buffers = [_put(device, np.ones((1, 16), np.int8)), device.allocate(64)]
    device.inject_fault(after_instructions=2)
    with pytest.raises(DeviceError, match=r"fault at instruction 2 \(GEMM\): injected"):
        device.execute(loaded, buffers).wait(WAIT)
    device.execute(loaded, buffers).wait(WAIT)  # one run only
    device.inject_fault(hang=True)
    hung = device.execute(loaded, buffers)
    with pytest.raises(TimeoutError):
        hung.wait(0.2)
    device.lose()
    with pytest.raises(DeviceError, match="simnpu:0 is gone"):
        hung.wait(WAIT)


def test_a_lost_device_refuses_every_later_call(device):
    buffer = device.allocate(16)
    device.lose()
    for call in (
        lambda: device.allocate(16),
        lambda: device.write(buffer, memoryview(bytes(4))),
        lambda: device.read(buffer, memoryview(bytearray(4))),
        lambda: device.load(DeviceProgram(_dot_program(1)[0])),
    ):
        with pytest.raises(DeviceError, match="simnpu:0 is gone"):
            call()


def test_the_runtime_opens_its_instances_and_describes_itself():
    runtime = SimNpuRuntime(instances=2, dram_bytes=1 << 16)
    assert runtime.name == "simnpu"
    with pytest.raises(DeviceError, match="no instance 2; there are 2"):
        runtime.open(2)
    device = runtime.open(1)
    assert device.instance == 1 and device.dram_bytes == 1 << 16
    device.close()
    assert runtime.describe()["format_version"] == isa.VERSION == 2
    assert runtime.describe()["format_versions"] == [1, 2]


def test_fault_environment_variable_is_parsed_per_instance():
    assert parse_faults("fault:3@1,hang@0, gone", 1) == {"fault": 3, "gone": True}
    assert parse_faults("fault:3@1,hang@0", 0) == {"hang": True}
    with pytest.raises(DeviceError, match="'explode' is not"):
        parse_faults("explode", 0)


# ------------------------------------------------------------------ the package alone


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=environ,
        timeout=180,
    )


def test_the_runtime_runs_a_program_with_tvm_unimportable(tmp_path):
    done = _python(
        """
        import sys
        sys.modules["tvm"] = None  # any import of TVM fails
        import numpy as np
        from umahub_simnpu_runtime import SimNpuRuntime, isa
        from umahub.plugin.device import DeviceProgram
        dev = SimNpuRuntime().open(3)
        prog = isa.program(
            [isa.load(isa.ACC, 0, 0, isa.I8, 0, [(16, 0, 0, 1, 1)]),
             isa.alu(isa.ALU_ADD, (1, 1), (0, 0, 0), imm=1),
             isa.store(1, isa.I8, 0, 0, [(16, 1, 1)])], buffers=2, version=1)
        loaded = dev.load(DeviceProgram(prog))
        a, b = dev.allocate(16), dev.allocate(16)
        dev.write(a, memoryview(np.arange(16, dtype=np.int8))).wait(5)
        dev.execute(loaded, [a, b]).wait(5)
        out = np.empty(16, np.int8)
        dev.read(b, memoryview(out)).wait(5)
        assert list(out) == list(range(1, 17)), out
        loaded = [m for m, v in sys.modules.items() if v is not None]
        assert not [m for m in loaded if m.split(".")[0] in ("tvm", "umahub_simnpu")]
        print("ok")
        """,
        UMAHUB_SIMNPU_CACHE=str(tmp_path),
    )
    assert done.stdout.strip() == "ok", done.stderr


def test_the_library_is_compiled_into_a_cache_keyed_by_the_source(tmp_path):
    """What a source checkout on PYTHONPATH does on first use (where no library was built
    at install, or the built one is not of these sources)."""
    done = _python(
        """
        from umahub_simnpu_runtime import native
        digest = native.source_hash()
        path = native._compile(digest)
        lib = native._open(path)
        assert lib is not None and lib.snpu_source_hash().decode() == digest
        print(path.relative_to(native._cache_dir(digest).parent))
        """,
        UMAHUB_SIMNPU_CACHE=str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("libsimnpu.so")
    assert len(list(tmp_path.glob("*/libsimnpu.so"))) == 1


def test_without_a_compiler_the_error_says_what_to_install(tmp_path):
    done = _python(
        """
        from umahub_simnpu_runtime import native
        from umahub.plugin.device import DeviceError
        try:
            native._compile(native.source_hash())
        except DeviceError as exc:
            print(exc)
        """,
        UMAHUB_SIMNPU_CACHE=str(tmp_path),
        PATH=str(tmp_path),
        CC="",
    )
    assert "install a C compiler" in done.stdout, done.stderr


def test_the_source_hash_follows_the_sources(tmp_path):
    """What keeps a stale library from being used: an editable install whose sim.c changed
    after the build has a built library whose hash no longer matches the sources'."""
    stale = tmp_path / "pkg"
    stale.mkdir()
    for name in ("sim.c", "sim.h"):
        (stale / name).write_bytes((SRC / "umahub_simnpu_runtime" / name).read_bytes())
    assert native.source_hash(stale) == native.source_hash()
    (stale / "sim.c").write_bytes((stale / "sim.c").read_bytes() + b"\n/* changed */\n")
    assert native.source_hash(stale) != native.source_hash()


def test_a_board_process_can_be_told_to_fail_by_the_environment(tmp_path):
    done = _python(
        """
        from umahub_simnpu_runtime import SimNpuRuntime
        from umahub.plugin.device import DeviceError
        runtime = SimNpuRuntime()
        runtime.open(0)  # not named: works
        try:
            runtime.open(1).allocate(4)
        except DeviceError as exc:
            print(exc)
        """,
        UMAHUB_SIMNPU_CACHE=str(tmp_path),
        UMAHUB_SIMNPU_FAULT="gone@1",
    )
    assert done.stdout.strip() == "simnpu:1 is gone", done.stderr


def test_native_counters_match_the_header():
    assert [name for name, _ in native.Counters._fields_] == [
        "instructions",
        "runs",
        "load_cycles",
        "gemm_cycles",
        "alu_cycles",
        "store_cycles",
        "macs",
        "compute_cycles",
        "cycles",
        "last_cycles",
    ]


# ------------------------------------------------------------------ never a crash


def _valid_program() -> bytes:
    """A program using every opcode, operation and flag, on two buffers and data."""
    data = np.r_[np.ones(16), np.full(16, 3), np.zeros(16)].astype("<i4").tobytes()
    return isa.program(
        [
            isa.load(isa.INP, 0, 0, isa.U8, 0, [(2, 1, 1, 16, 16), (16, 0, 0, 1, 1)], 5),
            isa.load(isa.WGT, 0, isa.DATA_SLOT, isa.I8, 0, [(192, 0, 0, 1, 1)]),
            isa.load(isa.ACC, 512, isa.DATA_SLOT, isa.I32, 0, [(48, 0, 0, 1, 1)]),
            isa.gemm([4], (0, 16), (0, 0), (0, 0), reset=True),
            isa.gemm([4, 1], (0, 16, 0), (0, 16, 0), (0, 0, 0)),
            isa.load(isa.ACC, 256, 0, isa.I8, 0, [(4, 0, 0, 16, 16), (16, 0, 0, 1, 1)]),
            isa.alu(isa.ALU_ADD, (4, 1), (256, 16, 0), imm=-3),
            isa.alu(isa.ALU_FXP, (4, 1), (0, 16, 0), (256, 16, 0), 7, 512, 528, 544, True),
            isa.alu(isa.ALU_MAX, (4, 1), (0, 16, 0), (256, 16, 0)),
            isa.alu(isa.ALU_MIN, (4, 1), (0, 16, 0), imm=90),
            isa.store(1, isa.U8, 0, 0, [(4, 16, 16), (16, 1, 1)]),
        ],
        buffers=2,
        data=data,
        version=1,
    )


def test_damaged_programs_are_rejected_or_run_never_crashing(device):
    """Random bytes written over a valid program's instructions: load rejects the
    program or accepts it, and a run of what it accepts completes or faults, with a
    DeviceError each time (a crash would end the test process)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    program = _valid_program()
    x, y = _put(device, np.arange(64, dtype=np.uint8)), device.allocate(64)
    device.execute(device.load(DeviceProgram(program)), [x, y]).wait(WAIT)
    body = range(isa.HEADER_BYTES, isa.HEADER_BYTES + 11 * isa.INSTRUCTION_BYTES)

    @settings(
        max_examples=400,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(st.tuples(st.sampled_from(body), st.integers(0, 255)), max_size=6))
    def damaged(edits):
        data = bytearray(program)
        for at, value in edits:
            data[at] = value
        try:
            loaded = device.load(DeviceProgram(bytes(data)))
        except DeviceError as exc:
            assert "program rejected" in str(exc)
            return
        try:
            device.execute(loaded, [x, y]).wait(WAIT)
        except DeviceError as exc:
            assert "fault at instruction" in str(exc)
        finally:
            device.unload(loaded)

    damaged()
