"""Shared fixtures: an isolated working directory and environment, fake installs, the
assembly of the libraries a test builds."""

from __future__ import annotations

import importlib
import textwrap
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Every test runs in an empty directory, with no umahub environment variables,
    and measures placement costs into a cache of its own (never the user's)."""
    for var in ("UMAHUB_CONFIG", "UMAHUB_PLUGINS", "UMAHUB_DISABLE_PLUGIN_AUTOLOAD"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("UMAHUB_CACHE_DIR", str(tmp_path / "umahub-cache"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def install(tmp_path, monkeypatch):
    """Install a distribution into a directory on sys.path, as pip would lay it out.

    ``install(dist, version, entry_points={name: "module"}, modules={name: source})``
    writes ``<dist>-<version>.dist-info`` with METADATA and entry_points.txt, so
    that discovery goes through importlib.metadata as for a pip install; ``group``
    is the entry points' group (``umahub.plugins``, or ``umahub.runtimes``).
    """
    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))

    def _install(
        dist: str,
        version: str,
        entry_points: dict[str, str],
        modules: dict[str, str],
        group: str = "umahub.plugins",
    ) -> Path:
        info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        lines = "".join(f"{k} = {v}\n" for k, v in entry_points.items())
        (info / "entry_points.txt").write_text(f"[{group}]\n{lines}")
        for name, source in modules.items():
            (site / f"{name}.py").write_text(textwrap.dedent(source))
        importlib.invalidate_caches()
        return site

    return _install


_REFERENCES: dict = {}


def host_reference(name: str, mod=None, inputs=None):
    """Outputs of the model compiled by plain ``tvm.compile`` on the host (cached by name)."""
    if name not in _REFERENCES:
        import tvm

        import umahub.models as zoo

        mod = mod if mod is not None else zoo.get(name)
        inputs = inputs if inputs is not None else zoo.inputs(name)
        vm = tvm.relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
        out = vm["main"](*[tvm.runtime.tensor(x) for x in inputs])
        _REFERENCES[name] = out.numpy() if hasattr(out, "numpy") else [o.numpy() for o in out]
    return _REFERENCES[name]


@pytest.fixture
def built_asm(monkeypatch):
    """The assembly of every library built while the test runs, in order."""
    import tvm

    sources: list[str] = []
    build = tvm.tirx.build

    def recording(*args, **kwargs):
        lib = build(*args, **kwargs)
        sources.append(lib.inspect_source("asm"))
        return lib

    monkeypatch.setattr(tvm.tirx, "build", recording)
    return sources
