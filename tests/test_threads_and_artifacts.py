"""Running from many threads, and exported libraries that were damaged on the way."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from graphs import chain, reference

import umahub
from umahub.errors import UmahubError

BUNDLED = {"plugins": ["npu", "vanilla", "dsp"]}
TOL = {"rtol": 1e-5, "atol": 1e-5}
SHAPE = (4, 16)


@pytest.fixture(scope="module")
def mod():
    # relu/add/relu/add/sigmoid: the DSP (C) and its second core take parts of it.
    return chain(shape=SHAPE)


@pytest.fixture(scope="module")
def cases(mod):
    rng = np.random.default_rng(42)
    xs = [rng.standard_normal(SHAPE).astype("float32") for _ in range(16)]
    return [(x, reference(mod, [x])) for x in xs]


@pytest.fixture(scope="module")
def compiled(mod):
    hub = umahub.Hub(config=BUNDLED, project_config=False)
    return hub.compile(mod, placement={"n0": "dsp_cpu:0", "n2": "dsp_cpu:1"})


@pytest.fixture(scope="module")
def library(compiled, tmp_path_factory):
    return compiled.export_library(tmp_path_factory.mktemp("lib") / "model.so")


def _hammer(run, cases, threads=8, calls=50):
    """``calls`` runs per thread, each thread cycling over the cases from its own offset."""
    wrong: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def work(t: int) -> None:
        start.wait()
        try:
            for i in range(calls):
                k = (t * 7 + i) % len(cases)
                x, want = cases[k]
                if not np.allclose(run(x), want, **TOL):
                    wrong.append((t, k))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return wrong, errors


def test_one_compiled_model_from_eight_threads(compiled, cases):
    assert {o.device for o in compiled.report.placement} >= {"dsp_cpu:0", "dsp_cpu:1"}
    wrong, errors = _hammer(compiled.run, cases)
    assert errors == [] and wrong == []


def test_one_loaded_library_from_eight_threads(library, cases):
    loaded = umahub.load(library)
    wrong, errors = _hammer(loaded.run, cases)
    assert errors == [] and wrong == []


def test_the_first_runs_of_a_fresh_model_from_several_threads(mod, cases):
    fresh = umahub.Hub(config=BUNDLED, project_config=False).compile(mod)
    wrong, errors = _hammer(fresh.run, cases, threads=8, calls=3)
    assert errors == [] and wrong == []


def test_calls_on_one_thread_write_their_inputs_into_one_tensor(compiled, cases):
    """The VM's inputs are copied into the tensors of the thread's last call (no
    memory allocated per call), and every call still reads its own inputs."""
    runner = compiled._executors.runner
    kept = set()
    for x, want in cases[:4]:
        np.testing.assert_allclose(compiled.run(x, executor="vm"), want, **TOL)
        ((view, tensor),) = runner._local.inputs
        np.testing.assert_array_equal(view, x)
        kept.add(id(tensor))
    assert len(kept) == 1


# ------------------------------------------------------------------ damaged artifacts


def test_an_inference_leaves_nothing_for_the_cycle_collector(compiled, library, cases):
    """Inputs in and results out create no reference cycles (TVM's own conversions
    through ctypes left two objects in one per call, and a small model's runs
    paid for the collections)."""
    import gc

    x, want = cases[0]
    runs = [compiled.run, umahub.load(library).run]
    for run in runs:  # the first runs make what later runs reuse
        run(x)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        outputs = [run(x) for run in runs for _ in range(5)]
        gc.collect()
        left = list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert left == []
    for out in outputs:
        np.testing.assert_allclose(out, want, **TOL)


@pytest.mark.parametrize(
    "array",
    [
        np.arange(12, dtype="float16").reshape(3, 4),
        np.array([True, False, True]),
        np.arange(24, dtype="int64").reshape(2, 3, 4).transpose(2, 0, 1),  # not contiguous
        np.array(2.5, dtype="float32"),  # 0-d
    ],
    ids=["float16", "bool", "transposed_int64", "0-d"],
)
def test_arrays_go_to_the_host_and_back_unchanged(array):
    import tvm

    from umahub.runtime.running import host_tensor, to_numpy

    tensor = host_tensor(array, tvm.cpu(0))
    assert tuple(tensor.shape) == array.shape
    back = to_numpy(tensor)
    assert back.dtype == array.dtype
    np.testing.assert_array_equal(back, array)
    back[...] = 0  # a copy: the tensor keeps its values
    np.testing.assert_array_equal(to_numpy(tensor), array)


def _damage(source: Path, target: Path, how: str) -> Path:
    data = bytearray(source.read_bytes())
    length = int.from_bytes(data[-19:-11], "little")
    trailer_start = len(data) - 19 - length
    if how == "truncated":
        data = data[: len(data) // 2]
    elif how == "truncated-in-the-trailer":
        data = data[:-5]
    elif how == "bytes-changed":
        middle = trailer_start // 2
        data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    elif how == "one-byte-changed":
        data[trailer_start // 3] ^= 0x01
    elif how == "trailer-changed":
        data[trailer_start : trailer_start + 5] = b"junk!"
    elif how == "trailer-length-changed":
        data[-19:-11] = (length * 1000).to_bytes(8, "little")
    elif how == "checksum-changed":
        text = data[trailer_start : len(data) - 19].decode()
        digest = text.split('"sha256": "')[1][:64]
        data[trailer_start : len(data) - 19] = text.replace(digest, "0" * 64).encode()
    elif how == "empty":
        data = bytearray()
    target.write_bytes(bytes(data))
    return target


NOT_OURS = (
    "was not written by umahub (no umahub metadata at its end; a library cut short loses it too)"
)
DAMAGE = {
    "truncated": NOT_OURS,
    "truncated-in-the-trailer": NOT_OURS,
    "bytes-changed": "is damaged (its bytes differ from those written at export)",
    "one-byte-changed": "is damaged (its bytes differ from those written at export)",
    "trailer-changed": "is damaged (its trailer is not umahub's)",
    "trailer-length-changed": "is damaged (its trailer is cut)",
    "checksum-changed": "is damaged (its bytes differ from those written at export)",
    "empty": NOT_OURS,
}


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_a_damaged_library_is_refused_in_a_fresh_process(library, tmp_path, how):
    damaged = _damage(library, tmp_path / f"{how}.so", how)
    done = subprocess.run(
        [sys.executable, "-m", "umahub", "run", str(damaged)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2, done.stderr  # the CLI's error status, never a signal
    assert "Traceback" not in done.stderr
    assert f"{damaged} {DAMAGE[how]}" in done.stderr


def test_a_damaged_library_raises_a_clear_error(library, tmp_path):
    damaged = _damage(library, tmp_path / "bad.so", "bytes-changed")
    with pytest.raises(UmahubError) as info:
        umahub.load(damaged)
    assert str(info.value) == (
        f"{damaged} is damaged (its bytes differ from those written at export); export it "
        "again with Compiled.export_library or `umahub compile`"
    )


def test_an_intact_library_still_loads_and_runs(library, cases):
    x, want = cases[0]
    np.testing.assert_allclose(umahub.load(library).run(x), want, **TOL)
