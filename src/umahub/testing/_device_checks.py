"""The conformance checks of an accelerator with a device of its own (``Accelerator(runtime=
...)``): its runtime's transfers, its programs, and a library that runs with the runtime
alone. :class:`umahub.testing.ConformanceSuite` inherits them; they are not collected
for an accelerator whose code runs on the host.
"""

from __future__ import annotations

from typing import Any

import pytest

from umahub.testing._checking import compare_and_record, compiled_or_skip, fail_if
from umahub.testing._options import session_of
from umahub.testing._session import ConformanceSession

__all__ = ["DEVICE_CHECKS", "DeviceChecks"]

#: The names of the checks, which the suite parametrizes by device accelerators only.
DEVICE_CHECKS = frozenset(
    {"test_device_transfers", "test_device_programs", "test_runs_with_the_runtime_alone"}
)


def _device_or_skip(session: ConformanceSession, accelerator: str) -> Any:
    """The accelerator, when it has a device of its own; else the check is skipped."""
    acc = session.hub(accelerator).accelerator(accelerator)
    if not acc.has_device:
        pytest.skip(f"{accelerator} runs on the host (no runtime of its own)")
    return acc


def _instance(acc: Any) -> Any:
    """Instance 0 of the accelerator's device, as umahub holds it in this process."""
    from umahub.runtime.devices import instance, runtime_named

    return instance(runtime_named(acc.runtime, acc.package), 0, acc.name)


def _plugin_modules(plugin: str) -> list[str]:
    """The top-level modules of the plugin's entry point (what a board does not install)."""
    from importlib.metadata import entry_points

    return sorted(
        {
            ep.module.split(".")[0]
            for ep in entry_points(group="umahub.plugins")
            if ep.name == plugin
        }
    )


class DeviceChecks:
    """The checks of a device of its own, parametrized as the suite's others."""

    def test_device_transfers(self, request: pytest.FixtureRequest, accelerator: str) -> None:
        """Its runtime moves bytes to and from the device exactly (sizes from 1 byte to
        1 MiB), refuses a host pointer into device memory, and refuses a damaged
        program with a ``DeviceError`` (skipped for an accelerator without a device)."""
        import numpy as np

        from umahub.plugin.device import DeviceError, DeviceProgram

        session = session_of(request.config)
        acc = _device_or_skip(session, accelerator)
        unit = _instance(acc)
        device, problems = unit.device, []
        rng = np.random.default_rng(0)
        with unit.lock:
            for size in (1, 3, 4101, 1 << 20):
                data = rng.integers(0, 256, size, dtype=np.uint8)
                back = np.zeros(size, dtype=np.uint8)
                buffer = device.allocate(size)
                try:
                    device.write(buffer, data.data).wait(60)
                    device.read(buffer, back.data).wait(60)
                    if not np.array_equal(data, back):
                        problems.append(f"{size} bytes written came back changed")
                    try:
                        device.host_pointer(buffer)
                        problems.append("host_pointer() gave a host address into device memory")
                    except DeviceError:
                        pass
                finally:
                    device.free(buffer)
            try:
                device.load(DeviceProgram(b"\xde\xad" * 8, {}))
                problems.append("it loaded 16 bytes of garbage as a program")
            except DeviceError:
                pass
        fail_if("; ".join(problems))

    def test_device_programs(
        self, request: pytest.FixtureRequest, accelerator: str, model: str
    ) -> None:
        """Every partition it takes is a program its runtime loads and runs (the outputs
        are :meth:`test_matches_host`'s), and a run given one buffer too few fails with a
        ``DeviceError``, never a crash or a run on memory it was not given."""
        from umahub.plugin.device import DeviceError

        session = session_of(request.config)
        acc = _device_or_skip(session, accelerator)
        compiled = compiled_or_skip(session, accelerator, model)
        calls = [c for c in compiled.device_calls if c.accelerator == accelerator]
        without = [p.symbol for p in compiled.report.partitions if not p.fallback and not p.program]
        fail_if(without and f"partitions without a device program: {', '.join(without)}")
        if not calls:
            pytest.skip(f"{accelerator} took nothing of {model}")
        unit, call = _instance(acc), calls[0]
        device = unit.device
        with unit.lock:
            program = device.load(call.program)
            buffers = [device.allocate(16) for _ in call.inputs]  # its outputs left out
            try:
                device.execute(program, buffers).wait(60)
                refused = False
            except DeviceError:
                refused = True
            finally:
                for b in buffers:
                    device.free(b)
        fail_if(
            not refused
            and f"{call.symbol}'s program ran on {len(buffers)} buffer(s), its inputs' count "
            "without its outputs, and no DeviceError said so"
        )

    def test_runs_with_the_runtime_alone(
        self, request: pytest.FixtureRequest, accelerator: str, model: str, tmp_path: Any
    ) -> None:
        """The exported library runs in a new process where the compiler plugin cannot be
        imported and no plugin is loaded: the runtime package alone, as on a board."""
        import os
        import subprocess
        import sys

        import numpy as np

        import umahub.models as zoo

        session = session_of(request.config)
        _device_or_skip(session, accelerator)
        compiled = compiled_or_skip(session, accelerator, model)
        path = compiled.export_library(tmp_path / f"{model}.so")
        inputs = zoo.inputs(model)
        np.savez(tmp_path / "inputs.npz", *inputs)
        blocked = _plugin_modules(session.target(accelerator).plugin)
        script = (
            "import sys\n"
            f"for name in {blocked!r}: sys.modules[name] = None\n"
            "import numpy as np, umahub\n"
            f"arrays = np.load({str(tmp_path / 'inputs.npz')!r})\n"
            f"out = umahub.load({str(path)!r}).run(*[arrays[k] for k in arrays.files])\n"
            "out = out if isinstance(out, (list, tuple)) else [out]\n"
            f"np.savez({str(tmp_path / 'outputs.npz')!r}, *out)\n"
        )
        env = dict(
            os.environ, UMAHUB_DISABLE_PLUGIN_AUTOLOAD="1", PYTHONPATH=os.pathsep.join(sys.path)
        )
        done = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False
        )
        fail_if(
            done.returncode != 0
            and f"the library did not run without {', '.join(blocked)}: "
            f"{(done.stderr.strip().splitlines() or ['(no message)'])[-1]}"
        )
        saved = np.load(tmp_path / "outputs.npz")
        outputs = [saved[k] for k in saved.files]
        outputs = outputs[0] if len(outputs) == 1 else outputs
        fail_if(compare_and_record(session, accelerator, model, outputs, "runtime-only output"))
