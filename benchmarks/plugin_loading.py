"""Discovery and dispatch cost: 20 installed trivial plugins, umahub vs plain pluggy.

Targets (issue 2): discovering and loading 20 plugins costs under 30 ms beyond
importing their modules; umahub's per-hook ordering adds at most 2 us per hook
call over plain pluggy. Results: ``results/plugin_loading.json``.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import textwrap
import timeit
from pathlib import Path

from _common import write

PLUGINS = 20

PLUGIN = textwrap.dedent("""
    import umahub
    UMAHUB_API = 1

    @umahub.hookimpl
    def umahub_accelerators():
        return [umahub.Accelerator("acc{i}")]

    @umahub.hookimpl
    def umahub_schedule(accelerator, schedule):
        return None
""")


def install(site: Path) -> list[str]:
    """Lay out 20 distributions with an entry point each, as pip would."""
    names = []
    for i in range(PLUGINS):
        name = f"bench_plugin_{i:02d}"
        info = site / f"{name}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[umahub.plugins]\np{i:02d} = {name}\n")
        (site / f"{name}.py").write_text(PLUGIN.format(i=i))
        names.append(name)
    return names


def in_fresh_process(site: Path, code: str, runs: int = 7) -> float:
    """Median seconds that ``code`` reports, each run in a new interpreter."""
    times = []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={
                "PYTHONPATH": str(site),
                "PATH": "/usr/bin:/bin",
                "UMAHUB_CONFIG": str(site / "umahub.toml"),
            },
        )
        times.append(float(out.stdout.strip().splitlines()[-1]))
    return statistics.median(times)


def dispatch(site: Path, names: list[str]) -> dict[str, float]:
    """Per-call time of umahub_schedule with 20 implementations: umahub vs plain pluggy."""
    sys.path.insert(0, str(site))
    import importlib

    import pluggy

    import umahub
    from umahub.plugin import hookspecs

    modules = [importlib.import_module(n) for n in names]
    hub = umahub.Hub(autoload=False, plugins=modules)
    plain = pluggy.PluginManager("umahub")
    plain.add_hookspecs(hookspecs)
    for module in reversed(modules):
        plain.register(module)
    acc = hub.accelerators[0]
    loops = 20000
    ours = (
        min(
            timeit.repeat(
                lambda: hub.hook.umahub_schedule(accelerator=acc, schedule=None, context=None),
                number=loops,
                repeat=5,
            )
        )
        / loops
    )
    theirs = (
        min(
            timeit.repeat(
                lambda: plain.hook.umahub_schedule(accelerator=acc, schedule=None, context=None),
                number=loops,
                repeat=5,
            )
        )
        / loops
    )
    return {
        "umahub_us": ours * 1e6,
        "pluggy_us": theirs * 1e6,
        "overhead_us": (ours - theirs) * 1e6,
        "implementations": len(modules),
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp)
        names = install(site)
        # Only the 20: other plugins installed here must not be in the measurement.
        listed = ", ".join(f'"p{i:02d}"' for i in range(PLUGINS))
        (site / "umahub.toml").write_text(f"plugins = [{listed}]\n")
        imports = ";".join(f"import {n}" for n in names)
        base = "import time, umahub, umahub.hub.hub; "
        hub_s = in_fresh_process(
            site,
            base + "t=time.perf_counter(); h=umahub.Hub(); "
            "assert len(h.plugins) >= 20; print(time.perf_counter()-t)",
        )
        import_s = in_fresh_process(
            site, base + f"t=time.perf_counter(); {imports}; print(time.perf_counter()-t)"
        )
        calls = dispatch(site, names)
    result = {
        "plugins": PLUGINS,
        "hub_seconds": hub_s,
        "imports_seconds": import_s,
        "discovery_overhead_ms": (hub_s - import_s) * 1e3,
        "target_discovery_overhead_ms": 30,
        "hook_call": calls,
        "target_hook_overhead_us": 2,
    }
    path = write("plugin_loading", result)
    print(
        f"Hub() with {PLUGINS} plugins: {hub_s * 1e3:.1f} ms; their imports alone: "
        f"{import_s * 1e3:.1f} ms; discovery overhead {result['discovery_overhead_ms']:.1f} ms "
        "(target < 30 ms)"
    )
    print(
        f"umahub_schedule with {calls['implementations']} implementations: umahub "
        f"{calls['umahub_us']:.2f} us, plain pluggy {calls['pluggy_us']:.2f} us, overhead "
        f"{calls['overhead_us']:.2f} us per call (target <= 2 us)"
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
