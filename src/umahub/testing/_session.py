"""What one pytest session of the conformance kit knows: names resolved, hubs, caches, results.

One :class:`ConformanceSession` lives in ``config.stash`` from
``pytest_configure`` on. Making it costs nothing; umahub's plugin loading,
TVM and the model zoo are imported the first time a method needs them.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from umahub.testing._report import Recorder

__all__ = [
    "DEFAULT_EXAMPLES",
    "DEFAULT_MODELS",
    "QUANTIZED_OPS",
    "ConformanceSession",
    "Target",
    "UsageProblem",
]

#: Models checked when ``--umahub-conformance-models`` is not given (and, for an
#: accelerator that claims quantized operators, their int8 variants).
DEFAULT_MODELS = ("mlp", "cnn")
#: Operators whose mention in an accelerator's patterns means it claims quantized operators.
QUANTIZED_OPS = frozenset({"relax.quantize", "relax.dequantize"})
#: Random graphs per accelerator when ``--umahub-conformance-examples`` is not given.
DEFAULT_EXAMPLES = 8


class UsageProblem(Exception):
    """A name given to the kit (option or marker) that does not resolve; the message says why."""


@dataclass(frozen=True)
class Target:
    """An accelerator under test, and the plugin that declares it."""

    accelerator: str
    plugin: str
    instances: int
    codegen: str


def isolated_config(plugin: str, accelerator: str, **overrides: Any) -> dict[str, Any]:
    """The ``config=`` of a hub where only ``accelerator`` claims and failures stop the compile.

    Every key that could let the project's own ``[tool.umahub]`` change what is
    tested (an allowlist, pins, hook and lowering orders) is overridden.
    """
    config: dict[str, Any] = {
        "plugins": [plugin],
        "disable": [],
        "priority": [accelerator],
        "hook-order": {},
        "lowering-order": ["host", accelerator],
        "placement": {},
        "on-error": "error",
    }
    config.update(overrides)
    return config


class ConformanceSession:
    """The kit's state for one pytest session.

    Args:
        names: what ``--umahub-conformance`` names (plugins or accelerators),
            empty when the option is not given.
        models: the zoo models to check (``"all"`` allowed), as given.
        examples: random graphs per accelerator (and of the cross check).
        report_path: where the JSON report goes; None = do not write one.
        cross: also check the named accelerators together
            (``--umahub-conformance-cross``).
        rpc: ``(tracker, key)`` of a board farm (``--umahub-rpc``,
            ``--umahub-rpc-key``): the numeric checks run there.
    """

    def __init__(
        self,
        names: Sequence[str],
        models: Sequence[str],
        examples: int,
        report_path: Path | None,
        cross: bool = False,
        rpc: tuple[str, str] | None = None,
    ):
        self.names = tuple(names)
        self.requested_models = tuple(models)
        self.examples = examples
        self.report_path = report_path
        self.cross = cross
        self.rpc = rpc
        self._board: Any = None
        self._exports: Any = None
        self.recorder = Recorder()
        self._targets: dict[str, Target] | None = None
        self._plugins: dict[str, tuple[str, ...]] = {}
        self._failed: dict[str, str] = {}
        self._hubs: dict[str, Any] = {}
        self._cross_hubs: dict[tuple[tuple[str, ...], tuple[str, ...]], Any] = {}
        self._compiled: dict[tuple[str, str, int | None], Any] = {}
        self._explained: dict[tuple[str, str], Any] = {}
        self._references: dict[str, Any] = {}
        self._steps: dict[str, Any] = {}
        self._quantizes: dict[str, bool] = {}

    # ------------------------------------------------------------------ names

    def _discover(self) -> dict[str, Target]:
        """Load every installed plugin once, to learn the accelerators and their owners."""
        if self._targets is None:
            import umahub
            from umahub.errors import UmahubError
            from umahub.hub.loading import find

            names = sorted({c.name for c in find()})
            config = {
                "plugins": names,
                "disable": [],
                "priority": [],
                "hook-order": {},
                "lowering-order": ["host"],
                "placement": {},
            }
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # a broken plugin is reported if named
                    hub = umahub.Hub(config=config, strict=False, project_config=False)
            except UmahubError as exc:
                raise UsageProblem(f"cannot load the installed umahub plugins: {exc}") from exc
            self._targets = {}
            for info in hub.plugins:
                if not info.loaded:
                    self._failed[info.name] = info.error or "failed to load"
                    continue
                self._plugins[info.name] = tuple(info.accelerators)
                for name in info.accelerators:
                    acc = hub.accelerator(name)
                    self._targets[name] = Target(name, info.name, acc.instances, acc.codegen)
        return self._targets

    def resolve(self, names: Iterable[str], where: str = "--umahub-conformance") -> list[Target]:
        """The accelerators that ``names`` mean: a plugin name means all its accelerators.

        Raises:
            UsageProblem: an unknown name (with the closest known one and the
                full list), a plugin that failed to load, or one that declares
                no accelerator.
        """
        from umahub.errors import did_you_mean

        targets = self._discover()
        found: list[Target] = []
        for name in names:
            if name in targets:
                chosen = [targets[name]]
            elif name in self._plugins:
                chosen = [targets[a] for a in self._plugins[name]]
                if not chosen:
                    raise UsageProblem(f"{where}={name}: plugin '{name}' declares no accelerator")
            elif name in self._failed:
                raise UsageProblem(
                    f"{where}={name}: plugin '{name}' did not load: {self._failed[name]}"
                )
            else:
                known = [*self._plugins, *self._failed, *targets]
                raise UsageProblem(
                    f"{where}={name}: no umahub plugin or accelerator is named "
                    f"'{name}'{did_you_mean(name, known)}; plugins: "
                    f"{', '.join(sorted(self._plugins)) or 'none'}; accelerators: "
                    f"{', '.join(sorted(targets)) or 'none'}"
                )
            found += [t for t in chosen if t not in found]
        return found

    @property
    def targets(self) -> list[Target]:
        """The accelerators ``--umahub-conformance`` names (empty when it is not given)."""
        return self.resolve(self.names) if self.names else []

    def models(
        self, requested: Sequence[str] | None = None, where: str = "--umahub-conformance-models"
    ) -> list[str]:
        """The zoo models to check: ``requested`` (or the option's), ``"all"`` expanded.

        Raises:
            UsageProblem: a model the zoo does not know.
        """
        import umahub.models as zoo
        from umahub.errors import did_you_mean

        wanted = tuple(requested if requested is not None else self.requested_models)
        known = zoo.names()
        if "all" in wanted:
            return known
        for name in wanted:
            if name not in known:
                raise UsageProblem(
                    f"{where}: unknown model '{name}'{did_you_mean(name, known)}; "
                    f"the zoo has: {', '.join(known)} (or 'all')"
                )
        return list(dict.fromkeys(wanted))

    def models_for(self, accelerator: str, models: Sequence[str]) -> list[str]:
        """``models``, each followed by its int8 variant when ``accelerator`` claims quantized
        operators (its patterns mention ``R.quantize`` or ``R.dequantize``)."""
        if not self.claims_quantized(accelerator):
            return list(models)
        import umahub.models as zoo
        from umahub.models.int8 import SUFFIX

        known = zoo.names()
        pairs = [(m, f"{m}{SUFFIX}") for m in models]
        return list(dict.fromkeys(n for pair in pairs for n in pair if n in known))

    def claims_quantized(self, accelerator: str) -> bool:
        """Whether the accelerator's patterns mention an operator of :data:`QUANTIZED_OPS`."""
        if accelerator not in self._quantizes:
            from umahub.testing._graphs import accelerator_ops

            try:
                ops = accelerator_ops(self.hub(accelerator), accelerator)
            except Exception:  # the partition check reports a hook that fails
                ops = set()
            self._quantizes[accelerator] = bool(ops & QUANTIZED_OPS)
        return self._quantizes[accelerator]

    # ------------------------------------------------------------------ hubs and caches

    def target(self, accelerator: str) -> Target:
        """The :class:`Target` of an accelerator name (a plugin name is refused here)."""
        targets = self._discover()
        if accelerator not in targets:
            self.resolve([accelerator], "accelerator")  # raises with the suggestions
            raise UsageProblem(
                f"'{accelerator}' is a plugin: name one of its accelerators "
                f"({', '.join(self._plugins.get(accelerator, ()))})"
            )
        return targets[accelerator]

    def hub(self, accelerator: str, config: Mapping[str, Any] | None = None) -> Any:
        """A hub where only ``accelerator`` claims, on-error "error" (cached without ``config``)."""
        import umahub

        target = self.target(accelerator)
        if config:
            return umahub.Hub(
                config=isolated_config(target.plugin, accelerator, **config),
                strict=True,
                project_config=False,
            )
        if accelerator not in self._hubs:
            self._hubs[accelerator] = umahub.Hub(
                config=isolated_config(target.plugin, accelerator),
                strict=True,
                project_config=False,
            )
        return self._hubs[accelerator]

    def cross_hub(self, plugins: Sequence[str], priority: Sequence[str]) -> Any:
        """A hub of these plugins where ``priority``'s accelerators claim in that order (cached).

        Only pins the check passes place operators; see
        :func:`cross_config` for ``on-error``.
        """
        import umahub

        key = (tuple(sorted(set(plugins))), tuple(priority))
        if key not in self._cross_hubs:
            self._cross_hubs[key] = umahub.Hub(
                config=cross_config(key[0], priority), strict=True, project_config=False
            )
        return self._cross_hubs[key]

    def explained(self, accelerator: str, model: str) -> Any:
        """``hub.explain`` of a zoo model (cached)."""
        key = (accelerator, model)
        if key not in self._explained:
            import umahub.models as zoo

            self._explained[key] = self.hub(accelerator).explain(zoo.get(model))
        return self._explained[key]

    def compiled(self, accelerator: str, model: str, instance: int | None = None) -> Any:
        """The model compiled with the accelerator's hub (cached; a failure is cached too).

        With ``instance``, every operator the accelerator takes is pinned to that
        instance (by pattern name, the pins ``hub.compile(placement=...)`` takes).
        """
        key = (accelerator, model, instance)
        if key not in self._compiled:
            import umahub.models as zoo

            placement = None
            if instance is not None:
                placement = {
                    p: f"{accelerator}:{instance}" for p in self.patterns_used(accelerator, model)
                }
            try:
                self._compiled[key] = self.hub(accelerator).compile(
                    zoo.get(model), placement=placement
                )
            except Exception as exc:
                self._compiled[key] = exc
        value = self._compiled[key]
        if isinstance(value, Exception):
            raise value
        return value

    def patterns_used(self, accelerator: str, model: str) -> list[str]:
        """The names of the accelerator's patterns that claimed operators of ``model``."""
        report = self.explained(accelerator, model)
        return sorted(
            {
                o.pattern
                for o in report.placement
                if o.pattern and o.device.split(":")[0] == accelerator
            }
        )

    def run(self, compiled: Any, inputs: Sequence[Any]) -> Any:
        """Run a compiled model here, or exported on a board of the farm (``--umahub-rpc``)."""
        if self.rpc is None:
            return compiled.run(*inputs)
        import tempfile

        if self._exports is None:
            self._exports = tempfile.TemporaryDirectory(prefix="umahub-kit-")
        path = Path(self._exports.name) / f"model{id(compiled)}.so"
        if not path.exists():
            compiled.export_library(path)
        return self.run_library(path, inputs)

    def run_library(self, path: Any, inputs: Sequence[Any]) -> Any:
        """Run an exported library here, or on a board of the farm (``--umahub-rpc``)."""
        if self.rpc is None:
            import umahub

            return umahub.load(path).run(*inputs)
        from umahub.boards.rpc import connect

        if self._board is None:
            self._board = connect(tracker=self.rpc[0], key=self.rpc[1])
        return self._board.load(path).run(*inputs)

    def reference(self, model: str) -> Any:
        """Outputs of plain ``tvm.compile(target="llvm")`` on ``zoo.inputs(model)`` (cached)."""
        if model not in self._references:
            import umahub.models as zoo

            self._references[model] = host_outputs(zoo.get(model), zoo.inputs(model))
        return self._references[model]

    def steps(self, model: str) -> list[Any]:
        """The quantization step of each output of a zoo model, None for a float one (cached)."""
        if model not in self._steps:
            import umahub.models as zoo
            from umahub.testing._compare import output_steps

            self._steps[model] = output_steps(zoo.get(model))
        return self._steps[model]


def host_outputs(mod: Any, inputs: Sequence[Any]) -> Any:
    """Run ``mod`` compiled by plain TVM for the host: numpy out (a list for several outputs)."""
    import tvm

    vm = tvm.relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(x) for x in inputs])
    return _numpy(out)


def _numpy(value: Any) -> Any:
    if hasattr(value, "numpy"):
        return value.numpy()
    return [_numpy(v) for v in value]


def cross_config(plugins: Sequence[str], priority: Sequence[str]) -> dict[str, Any]:
    """The ``config=`` of the cross check's hub: these plugins, this priority, no project pins.

    ``on-error`` is ``"fallback"`` so that a pin that cannot be honoured is a
    warning; :func:`umahub.testing._cross.check_placed_graph` fails on every other warning (a
    partition fell back to the host), where ``"error"`` would have stopped.
    """
    return {
        "plugins": list(dict.fromkeys(plugins)),
        "disable": [],
        "priority": list(priority),
        "hook-order": {},
        "lowering-order": ["host", *priority],
        "placement": {},
        "on-error": "fallback",
    }
