"""Program format version 2 on the simnpu: dependency tokens between the load, compute
and store modules, dataflow execution under the cycle model, hazards and deadlocks as
faults, and the timeline without a run (``timing``)."""

from __future__ import annotations

import ctypes
import itertools

import numpy as np
import pytest
from umahub_simnpu_runtime import SimNpuRuntime, Timing, isa, native, timing

from umahub.plugin.device import DeviceError, DeviceProgram

WAIT = 10

# The double-buffered program: N iterations of y_k = W_k @ x_k, x_k ROWS rows of 16 int8,
# W_k one 16x16 tile; iteration k uses half k % 2 of INP, WGT and ACC.
ROWS, N = 16, 4
HALF = 256  # bytes of INP and WGT, words of ACC, per half

# The README's cycle model, by hand, for the instructions of one iteration:
LOAD_INP = 8 + ROWS * 16 // 16  # 256 bytes: 24
LOAD_WGT = 8 + 256 // 16  # one tile: 24
GEMM = 4 + ROWS  # one 16x16 step per row: 20 (the reset as well)
STORE = 8 + ROWS * 16 * 4 // 16  # int32: 72


@pytest.fixture
def device():
    dev = SimNpuRuntime(dram_bytes=1 << 20).open(0)
    yield dev
    dev.close()


def _double_buffered(version: int) -> tuple[bytes, np.ndarray]:
    """The program (version 2: with VTA's tokens; version 1: the same instructions
    without, in the same order) and the weights (N tiles)."""
    tokens = version == 2

    def deps(flags: int) -> int:
        return flags if tokens else 0

    instructions = []
    for k in range(N):
        h = k % 2
        first_use = k < 2  # the half is free: no token to wait for
        reused = k + 2 < N  # the half is used again: release it when done
        instructions += [
            # load: wait until compute has released the half (but for its first use)
            isa.load(
                isa.INP,
                h * HALF,
                0,
                isa.I8,
                k * ROWS * 16,
                [(ROWS, 0, 0, 16, 16), (16, 0, 0, 1, 1)],
                deps=deps(0 if first_use else isa.POP_NEXT),
            ),
            # ... and tell compute the half is loaded
            isa.load(
                isa.WGT,
                h * HALF,
                isa.DATA_SLOT,
                isa.I8,
                k * 256,
                [(256, 0, 0, 1, 1)],
                deps=deps(isa.PUSH_NEXT),
            ),
            # compute: wait for the inputs, and for store to have released the ACC half
            isa.gemm(
                [ROWS],
                (h * HALF, 16),
                (h * HALF, 16),
                (h * HALF, 0),
                reset=True,
                deps=deps(isa.POP_PREV | (0 if first_use else isa.POP_NEXT)),
            ),
            # ... then release INP/WGT to load and hand ACC to store
            isa.gemm(
                [ROWS],
                (h * HALF, 16),
                (h * HALF, 16),
                (h * HALF, 0),
                deps=deps(isa.PUSH_NEXT | (isa.PUSH_PREV if reused else 0)),
            ),
            # store: wait for ACC, then release it to compute
            isa.store(
                1,
                isa.I32,
                k * ROWS * 16 * 4,
                h * HALF,
                [(ROWS, 16, 16), (16, 1, 1)],
                deps=deps(isa.POP_PREV | (isa.PUSH_PREV if reused else 0)),
            ),
        ]
    w = (np.arange(N * 256, dtype=np.int64).reshape(N, 16, 16) * 37 % 255 - 127).astype(np.int8)
    return isa.program(instructions, buffers=2, data=w.tobytes(), version=version), w


# Every instruction's (module, start, end), by hand: load runs ahead into the other half
# while compute works; compute waits for a loaded half (and, from the third iteration, for
# store to release ACC); store is the bottleneck (72 cycles each).
_C0 = 2 * LOAD_INP  # compute starts when load pushes after its first LOAD WGT: 48
DOUBLE_BUFFERED_INTERVALS = (
    # k = 0
    ("load", 0, 24),
    ("load", 24, 48),
    ("compute", 48, 68),  # pops load's token, available at 48
    ("compute", 68, 88),  # pushes to load and to store at 88
    ("store", 88, 160),
    # k = 1: load never waited (half 1 was free)
    ("load", 48, 72),
    ("load", 72, 96),
    ("compute", 96, 116),  # load's second token: 96
    ("compute", 116, 136),
    ("store", 160, 232),  # the store module is busy until 160
    # k = 2: load waits for compute's release of half 0 (88), but is busy until 96
    ("load", 96, 120),
    ("load", 120, 144),
    ("compute", 160, 180),  # load's token at 144, store's release of ACC half 0 at 160
    ("compute", 180, 200),
    ("store", 232, 304),
    # k = 3: compute's release of half 1 came at 136; load is free at 144
    ("load", 144, 168),
    ("load", 168, 192),
    ("compute", 232, 252),  # store's release of ACC half 1 at 232
    ("compute", 252, 272),
    ("store", 304, 376),
)


def _run(device, program: bytes, x: np.ndarray, out_bytes: int) -> bytes:
    loaded = device.load(DeviceProgram(program))
    xb = device.allocate(x.nbytes)
    device.write(xb, memoryview(np.ascontiguousarray(x)).cast("B")).wait(WAIT)
    yb = device.allocate(out_bytes)
    device.execute(loaded, [xb, yb]).wait(WAIT)
    out = bytearray(out_bytes)
    device.read(yb, memoryview(out)).wait(WAIT)
    return bytes(out)


# ------------------------------------------------------------------ double buffering


def test_double_buffering_computes_what_the_in_order_program_does_in_fewer_cycles(device):
    x = np.random.default_rng(3).integers(-128, 128, (N, ROWS, 16)).astype(np.int8)
    v2, w = _double_buffered(2)
    v1, _ = _double_buffered(1)
    out_bytes = N * ROWS * 16 * 4

    got = _run(device, v2, x, out_bytes)
    overlapped = device.counters()
    want = _run(device, v1, x, out_bytes)
    in_order = device.counters()

    assert got == want
    y = np.frombuffer(got, np.int32).reshape(N, ROWS, 16)
    assert np.array_equal(y, np.einsum("koi,kri->kro", w.astype(np.int64), x.astype(np.int64)))

    serial = N * (LOAD_INP + LOAD_WGT + 2 * GEMM + STORE)
    assert serial == 640
    # the last store: store-bound from the first store's start at 88, four stores of 72
    overlapped_total = (_C0 + 2 * GEMM) + N * STORE
    assert overlapped_total == 376
    assert overlapped["last_cycles"] == overlapped_total
    assert in_order["last_cycles"] == serial
    assert in_order["cycles"] == overlapped_total + serial
    assert in_order["runs"] == 2


def test_the_timeline_of_the_double_buffered_program(device):
    program, _ = _double_buffered(2)
    t = timing(program, trace=True)
    assert t == Timing(
        cycles=376,
        busy={"load": 2 * N * 24, "compute": 2 * N * GEMM, "store": N * STORE},
        instructions={"load": 2 * N, "compute": 2 * N, "store": N},
        intervals=DOUBLE_BUFFERED_INTERVALS,
    )
    assert t.serial_cycles == 640
    assert timing(program).intervals == ()


def test_a_version_1_program_takes_the_sum_of_its_costs_one_after_the_other():
    program, _ = _double_buffered(1)
    t = timing(program, trace=True)
    assert t.cycles == t.serial_cycles == 640
    ends = 0
    for (module, start, end), (want_module, _, _) in zip(
        t.intervals, DOUBLE_BUFFERED_INTERVALS, strict=True
    ):
        assert module == want_module and start == ends
        ends = end
    assert ends == 640


def test_trace_intervals_do_not_overlap_within_a_module_and_follow_program_order():
    program, _ = _double_buffered(2)
    intervals = timing(program, trace=True).intervals
    assert len(intervals) == 5 * N
    for module in isa.MODULES:
        own = [(start, end) for m, start, end in intervals if m == module]
        assert own, module
        for (_, end), (start, _) in itertools.pairwise(own):
            assert start >= end


def test_timing_equals_a_runs_cycles_and_the_counters_split_by_module(device):
    """A run follows the schedule ``timing`` computes; busy cycles are counted per module,
    LOAD into ACC as compute's."""
    program = isa.program(
        [
            isa.load(isa.ACC, 0, 0, isa.I8, 0, [(16, 0, 0, 1, 1)], deps=isa.PUSH_NEXT),
            isa.alu(isa.ALU_ADD, (1, 1), (0, 0, 0), imm=1, deps=0),
            isa.store(1, isa.I8, 0, 0, [(16, 1, 1)], deps=isa.POP_PREV),
        ],
        buffers=2,
    )
    t = timing(program)
    # LOAD of 16 words: 8 + 64 / 16; ALU of one vector: 4 + 1; STORE of 16 bytes: 8 + 1
    assert t.busy == {"load": 0, "compute": 12 + 5, "store": 9}
    # the store waits for the load's token only (at 12), not for the ALU: a missing
    # token, which the run finds
    assert t.cycles == 21
    with pytest.raises(DeviceError) as raised:
        _run(device, program, np.arange(16, dtype=np.int8), 16)
    assert str(raised.value) == (
        "simnpu:0: fault: hazard: instruction 1 (ALU, compute) writes ACC[0..15] while "
        "instruction 2 (STORE, store) reads it: they overlapped (cycles [12, 17) and "
        "[12, 21)): a missing dependency token"
    )

    fixed = isa.program(
        [
            isa.load(isa.ACC, 0, 0, isa.I8, 0, [(16, 0, 0, 1, 1)]),
            isa.alu(isa.ALU_ADD, (1, 1), (0, 0, 0), imm=1, deps=isa.PUSH_NEXT),
            isa.store(1, isa.I8, 0, 0, [(16, 1, 1)], deps=isa.POP_PREV),
        ],
        buffers=2,
    )
    before = device.counters()
    out = _run(device, fixed, np.arange(16, dtype=np.int8), 16)
    assert list(out) == list(range(1, 17))
    after = device.counters()
    delta = {k: after[k] - before[k] for k in after}
    assert after["last_cycles"] == timing(fixed).cycles == 12 + 5 + 9
    assert delta == {
        "instructions": 3,
        "runs": 1,
        "load_cycles": 0,
        "gemm_cycles": 0,
        "alu_cycles": 5,
        "store_cycles": 9,
        "macs": 0,
        "compute_cycles": 17,
        "cycles": 26,
        "last_cycles": 26 - before["last_cycles"],
    }


# ------------------------------------------------------------------ hazards

_INP16 = [(16, 0, 0, 1, 1)]
_HAZARDS = {
    "read before write, ran early": (
        [
            # the next weights, far from what the GEMM reads: 4096 bytes, 264 cycles
            isa.load(isa.WGT, 256, isa.DATA_SLOT, isa.I8, 0, [(4096, 0, 0, 1, 1)]),
            isa.load(isa.INP, 0, 0, isa.I8, 0, _INP16),  # waits for the load module: 264
            isa.gemm([1], (0, 0), (0, 0), (0, 0)),  # no token: issues at 0
        ],
        "fault: hazard: instruction 1 (LOAD, load) writes INP[0..15] while instruction 2 "
        "(GEMM, compute) reads it: instruction 2 ran early (issued at cycle 0, instruction 1 "
        "at cycle 264): a missing dependency token",
    ),
    "write while an earlier read of another module is in flight": (
        [
            isa.load(isa.INP, 0, 0, isa.I8, 0, _INP16, deps=isa.PUSH_NEXT),  # [0, 9)
            isa.gemm([1], (0, 0), (0, 0), (0, 0), deps=isa.POP_PREV),  # [9, 14)
            isa.load(isa.INP, 0, 0, isa.I8, 16, _INP16),  # no POP_NEXT: [9, 18)
        ],
        "fault: hazard: instruction 1 (GEMM, compute) reads INP[0..15] while instruction 2 "
        "(LOAD, load) writes it: they overlapped (cycles [9, 14) and [9, 18)): a missing "
        "dependency token",
    ),
    "write after read, ran early": (
        [
            isa.load(isa.INP, 0, 0, isa.I8, 0, _INP16, deps=isa.PUSH_NEXT),  # [0, 9)
            isa.gemm([64], (0, 16), (0, 0), (0, 0), reset=True),  # compute busy: [0, 68)
            isa.gemm([1], (0, 0), (0, 0), (0, 0), deps=isa.POP_PREV),  # [68, 73)
            isa.load(isa.INP, 0, 0, isa.I8, 16, _INP16),  # no POP_NEXT: [9, 18)
        ],
        "fault: hazard: instruction 2 (GEMM, compute) reads INP[0..15] while instruction 3 "
        "(LOAD, load) writes it: instruction 3 ran early (issued at cycle 9, instruction 2 "
        "at cycle 68): a missing dependency token",
    ),
    "read while the write is in flight": (
        [
            isa.load(isa.INP, 0, 0, isa.I8, 0, _INP16),  # no PUSH_NEXT: [0, 9)
            isa.gemm([1], (0, 0), (0, 0), (0, 0)),  # [0, 5)
        ],
        "fault: hazard: instruction 0 (LOAD, load) writes INP[0..15] while instruction 1 "
        "(GEMM, compute) reads it: they overlapped (cycles [0, 9) and [0, 5)): a missing "
        "dependency token",
    ),
    "weights read once per row (a stride of 0) while loaded": (
        [
            isa.load(isa.WGT, 0, isa.DATA_SLOT, isa.I8, 0, [(256, 0, 0, 1, 1)]),  # [0, 24)
            isa.gemm([4], (0, 16), (0, 16), (0, 0)),  # the tile for each of 4 rows: [0, 8)
        ],
        "fault: hazard: instruction 0 (LOAD, load) writes WGT[0..255] while instruction 1 "
        "(GEMM, compute) reads it: they overlapped (cycles [0, 24) and [0, 8)): a missing "
        "dependency token",
    ),
    "store reads accumulators compute still writes": (
        [
            isa.gemm([4], (0, 16), (0, 0), (0, 0), reset=True),  # ACC[0..63]: [0, 8)
            isa.store(0, isa.I32, 0, 16, [(16, 1, 1)]),  # ACC[16..31]: [0, 12)
        ],
        "fault: hazard: instruction 0 (GEMM, compute) writes ACC[16..31] while instruction 1 "
        "(STORE, store) reads it: they overlapped (cycles [0, 8) and [0, 12)): a missing "
        "dependency token",
    ),
}


@pytest.mark.parametrize("case", list(_HAZARDS))
def test_a_missing_token_is_a_hazard_fault_naming_the_pair(device, case):
    instructions, message = _HAZARDS[case]
    program = isa.program(instructions, buffers=1, data=bytes(4096))
    loaded = device.load(DeviceProgram(program))
    buffer = device.allocate(4096)
    with pytest.raises(DeviceError) as raised:
        device.execute(loaded, [buffer]).wait(WAIT)
    assert str(raised.value) == f"simnpu:0: {message}"
    # the same instructions in order (version 1, without their tokens) are a correct program
    in_order = [i[:1] + b"\0" + i[2:] for i in instructions]
    device.execute(
        device.load(DeviceProgram(isa.program(in_order, 1, bytes(4096), version=1))), [buffer]
    ).wait(WAIT)


def test_with_its_tokens_the_program_that_overwrote_inputs_runs(device):
    program = isa.program(
        [
            isa.load(isa.INP, 0, 0, isa.I8, 0, _INP16, deps=isa.PUSH_NEXT),
            isa.gemm([1], (0, 0), (0, 0), (0, 0), deps=isa.POP_PREV | isa.PUSH_PREV),
            isa.load(isa.INP, 0, 0, isa.I8, 16, _INP16, deps=isa.POP_NEXT),
        ],
        buffers=1,
    )
    assert timing(program, trace=True).intervals == (
        ("load", 0, 9),
        ("compute", 9, 14),
        ("load", 14, 23),
    )
    device.execute(device.load(DeviceProgram(program)), [device.allocate(32)]).wait(WAIT)
    assert device.counters()["last_cycles"] == 23


# ------------------------------------------------------------------ deadlocks and bad tokens


@pytest.mark.parametrize(
    ("instructions", "message"),
    [
        (
            [
                isa.gemm([1], (0, 0), (0, 0), (0, 0), reset=True),
                isa.store(0, isa.I8, 0, 0, [(16, 1, 1)], deps=isa.POP_PREV),
            ],
            "fault: deadlock: the store module waits at instruction 1 (STORE) for a token "
            "from compute that is never pushed",
        ),
        (
            [  # each waits for the other
                isa.load(isa.INP, 0, 0, isa.I8, 0, _INP16, deps=isa.POP_NEXT | isa.PUSH_NEXT),
                isa.gemm([1], (0, 0), (0, 0), (0, 0), deps=isa.POP_PREV | isa.PUSH_PREV),
            ],
            "fault: deadlock: the load module waits at instruction 0 (LOAD) for a token "
            "from compute that is never pushed",
        ),
    ],
)
def test_a_deadlock_is_a_fault_naming_the_module_instruction_and_queue(
    device, instructions, message
):
    program = isa.program(instructions, buffers=1)
    with pytest.raises(DeviceError) as raised:
        timing(program)
    assert str(raised.value) == message
    loaded = device.load(DeviceProgram(program))  # a deadlock is a fault of a run
    before = device.counters()
    with pytest.raises(DeviceError) as raised:
        device.execute(loaded, [device.allocate(64)]).wait(WAIT)
    assert str(raised.value) == f"simnpu:0: {message}"
    after = device.counters()
    assert after["runs"] == before["runs"] and after["cycles"] == before["cycles"]


def test_tokens_left_in_their_queues_are_fine():
    program = isa.program(
        [isa.load(isa.INP, 0, 0, isa.I8, 0, _INP16, deps=isa.PUSH_NEXT)] * 3, buffers=1
    )
    assert timing(program).cycles == 3 * 9


def _with_deps(instruction: bytes, deps: int, version: int = 2) -> bytes:
    return isa.program([instruction[:1] + bytes([deps]) + instruction[2:]], 1, version=version)


_LOAD = isa.load(isa.INP, 0, 0, isa.I8, 0, _INP16)
_STORE = isa.store(0, isa.I8, 0, 0, [(16, 1, 1)])
_GEMM = isa.gemm([1], (0, 0), (0, 0), (0, 0))


@pytest.mark.parametrize(
    ("program", "message"),
    [
        (
            _with_deps(_LOAD, isa.POP_PREV),
            "instruction 0 (LOAD) pops a token from a module before load; the load module is "
            "the first (flags 0x01)",
        ),
        (
            _with_deps(_LOAD, isa.PUSH_PREV | isa.PUSH_NEXT),
            "instruction 0 (LOAD) pushes a token to a module before load; the load module is "
            "the first (flags 0x0c)",
        ),
        (
            _with_deps(_STORE, isa.POP_NEXT),
            "instruction 0 (STORE) pops a token from a module after store; the store module is "
            "the last (flags 0x02)",
        ),
        (
            _with_deps(_STORE, isa.PUSH_NEXT),
            "instruction 0 (STORE) pushes a token to a module after store; the store module is "
            "the last (flags 0x08)",
        ),
        (
            _with_deps(_GEMM, 0x10),
            "instruction 0 (GEMM) sets dependency flags 0x10; only pop_prev, pop_next, "
            "push_prev, push_next (0x0f) exist",
        ),
        (
            _with_deps(_GEMM, isa.POP_PREV, version=1),
            "instruction 0 (GEMM) sets dependency flags 0x01; version 1 executes in order "
            "and takes none",
        ),
        (
            isa.program([_GEMM], 1)[:4] + b"\x03\x00" + isa.program([_GEMM], 1)[6:],
            "format version 3; this runtime reads versions 1 to 2",
        ),
    ],
)
def test_bad_dependency_flags_are_rejected_at_load(device, program, message):
    for check in (lambda: timing(program), lambda: device.load(DeviceProgram(program))):
        with pytest.raises(DeviceError) as raised:
            check()
        assert str(raised.value).endswith(f"program rejected: {message}")


def test_a_load_into_acc_belongs_to_compute_and_takes_its_tokens():
    acc_load = isa.load(isa.ACC, 0, 0, isa.I8, 0, _INP16, deps=isa.POP_PREV | isa.PUSH_PREV)
    assert isa.module_of(acc_load) == "compute"
    program = isa.program([_LOAD[:1] + bytes([isa.PUSH_NEXT]) + _LOAD[2:], acc_load], 1)
    t = timing(program, trace=True)
    assert t.intervals == (("load", 0, 9), ("compute", 9, 9 + 8 + 4))


# ------------------------------------------------------------------ the encoding and the API


def test_the_encoders_write_deps_and_name_the_module():
    assert (isa.POP_PREV, isa.POP_NEXT, isa.PUSH_PREV, isa.PUSH_NEXT) == (1, 2, 4, 8)
    assert isa.DEP_FLAGS == {"pop_prev": 1, "pop_next": 2, "push_prev": 4, "push_next": 8}
    encoded = {
        "load": isa.load(isa.WGT, 0, 0, isa.I8, 0, _INP16, deps=9),
        "compute": isa.alu(isa.ALU_MAX, (1, 1), (0, 0, 0), imm=0, deps=6),
        "store": isa.store(0, isa.I8, 0, 0, [(1, 1, 1)], deps=5),
    }
    for module, instruction in encoded.items():
        assert isa.module_of(instruction) == module
    assert [i[1] for i in encoded.values()] == [9, 6, 5]
    assert isa.gemm([1], (0, 0), (0, 0), (0, 0), deps=isa.PUSH_NEXT)[1] == 8
    assert isa.module_of(_GEMM) == "compute"
    with pytest.raises(ValueError, match="deps 0x10"):
        isa.gemm([1], (0, 0), (0, 0), (0, 0), deps=16)
    with pytest.raises(ValueError, match="not a simnpu instruction"):
        isa.module_of(b"\x09" * 64)
    assert isa.VERSION == 2
    assert isa.program([], 0)[4:6] == b"\x02\x00"
    assert isa.program([], 0, version=1)[4:6] == b"\x01\x00"
    with pytest.raises(ValueError, match="format version 3"):
        isa.program([], 0, version=3)


def test_timing_of_an_empty_program_and_of_bytes_that_are_no_program():
    assert timing(isa.program([], 0), trace=True) == Timing(
        0, {"load": 0, "compute": 0, "store": 0}, {"load": 0, "compute": 0, "store": 0}
    )
    with pytest.raises(DeviceError, match=r"^program rejected: 3 bytes, shorter"):
        timing(b"abc", trace=True)
    with pytest.raises(DeviceError, match="reaches INP"):
        timing(isa.program([_LOAD], 1), inp_bytes=8)
    with pytest.raises(DeviceError, match="inp_bytes=-1 is not a capacity"):
        timing(isa.program([_LOAD], 1), inp_bytes=-1)


def test_the_trace_is_cut_at_its_capacity():
    program, _ = _double_buffered(2)
    lib = native.library()
    out = native.TimingResult()
    trace = (native.Interval * 3)()
    error = ctypes.create_string_buffer(native.ERROR_BYTES)
    assert not lib.snpu_timing(
        program, len(program), 1 << 16, 1 << 16, 1 << 14, out, trace, 3, error, 512
    )
    assert out.trace_len == 3 and out.cycles == 376
    assert [(t.index, t.module, t.start, t.end) for t in trace] == [
        (0, 0, 0, 24),
        (1, 0, 24, 48),
        (2, 1, 48, 68),
    ]
    assert not lib.snpu_timing(
        program, len(program), 1 << 16, 1 << 16, 1 << 14, out, None, 0, error, 512
    )
    assert out.trace_len == 0


# ------------------------------------------------------------------ never a crash


def test_damaged_version_2_programs_are_rejected_or_run_never_crashing(device):
    """Random bytes over the double-buffered program's instructions (its tokens among
    them): rejected, or timed and run to the end or to a fault; a run that completes
    takes the cycles ``timing`` says."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    program, _ = _double_buffered(2)
    x = device.allocate(N * ROWS * 16)
    y = device.allocate(N * ROWS * 16 * 4)
    body = range(isa.HEADER_BYTES, isa.HEADER_BYTES + 5 * N * isa.INSTRUCTION_BYTES)
    deps_bytes = [isa.HEADER_BYTES + i * isa.INSTRUCTION_BYTES + 1 for i in range(5 * N)]

    @settings(
        max_examples=300,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        st.lists(
            st.tuples(st.sampled_from(list(body) + deps_bytes * 8), st.integers(0, 255)),
            max_size=4,
        )
    )
    def damaged(edits):
        data = bytearray(program)
        for at, value in edits:
            data[at] = value
        data = bytes(data)
        try:
            t = timing(data)
        except DeviceError as exc:
            assert str(exc).startswith(("program rejected: ", "fault: deadlock: "))
            t = None
        try:
            loaded = device.load(DeviceProgram(data))
        except DeviceError as exc:
            assert "program rejected" in str(exc)
            return
        try:
            device.execute(loaded, [x, y]).wait(WAIT)
            assert t is not None and device.counters()["last_cycles"] == t.cycles
        except DeviceError as exc:
            assert str(exc).startswith(
                ("simnpu:0: fault at instruction", "simnpu:0: fault: hazard: ")
            ) or (t is None and "fault: deadlock: " in str(exc))
        finally:
            device.unload(loaded)

    damaged()
