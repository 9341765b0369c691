"""The :class:`Hub`: the loaded plugins, their accelerators, and the door to compiling."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import pluggy

from umahub.config import Config, load_config
from umahub.errors import (
    ConfigError,
    PluginLoadError,
    PluginOutputError,
    UmahubError,
    UmahubWarning,
    did_you_mean,
    warn,
)
from umahub.hub.contract import checked_accelerators
from umahub.hub.dispatch import HOOK_NAMES, PluginManager
from umahub.hub.loading import PluginInfo, find, load, select
from umahub.plugin.accelerator import Accelerator
from umahub.plugin.options import changed

if TYPE_CHECKING:
    import tvm

    from umahub.report.report import Report
    from umahub.runtime.compiled import Compiled
    from umahub.runtime.generation import CompiledDecoder

__all__ = ["Hub", "UmahubWarning"]  # UmahubWarning lives in umahub.errors


class Hub:
    """Installed plugins, loaded and ordered as ``[tool.umahub]`` says.

    Args:
        config: keys of ``[tool.umahub]`` that override the file's (see
            :mod:`umahub.config`); ``{"options": {"npu": {"tile-rows": 16}}}``
            sets backend options one by one over the file's.
        autoload: load the plugins installed under the entry-point group
            ``umahub.plugins`` (``UMAHUB_DISABLE_PLUGIN_AUTOLOAD=1`` also turns
            this off).
        plugins: modules or objects to use as plugins as well.
        strict: a plugin that fails to load is an error instead of being
            skipped with a warning (default: the config's ``strict``).
        project_config: read ``[tool.umahub]`` from the project (or
            ``UMAHUB_CONFIG``); False uses ``config`` alone, e.g. in a test kit
            that must not depend on the project it runs in.

    Raises:
        ConfigError: an unknown key or name in the configuration, a backend
            option no plugin declares or of the wrong type.
        PluginConflictError: two plugins share a plugin name (a plugin that
            declares an accelerator another plugin declared is skipped, and
            shows as failed with that reason).
        PluginLoadError: in strict mode, the first plugin that failed to load.
    """

    def __init__(
        self,
        config: Mapping[str, Any] | None = None,
        autoload: bool = True,
        plugins: Sequence[Any] = (),
        *,
        strict: bool | None = None,
        project_config: bool = True,
    ):
        cfg = load_config(config) if project_config else Config().merged(config)
        if strict is not None:
            cfg = replace(cfg, strict=strict)
        self.config: Config = cfg
        found = find(autoload, plugins)
        cfg.check_plugin_names(
            [c.name for c in found],
            HOOK_NAMES,
            (c.dist.name for c in found if c.dist is not None),
        )
        self._pm = PluginManager()
        infos: list[PluginInfo] = []
        impls: dict[str, dict[str, Any]] = {}
        owners: dict[str, tuple[PluginInfo, Accelerator]] = {}
        for candidate in select(found, cfg):
            info, hooks = self._load_one(candidate, owners)
            infos.append(info)
            if info.loaded:
                impls[info.name] = hooks
        failures = [i for i in infos if not i.loaded]
        if failures and cfg.strict:
            first = failures[0]
            raise PluginLoadError(first.name, first.distribution, first.error or "")
        for info in failures:
            warn(f"skipped {_who(info)}: {info.error}")
        self.plugins: list[PluginInfo] = infos
        loaded = [i for i in infos if i.loaded]
        self._accelerators = {name: acc for name, (_, acc) in owners.items()}
        self._owner = {name: info.name for name, (info, _) in owners.items()}
        try:
            cfg.check_accelerator_names(
                {name: acc.instances for name, acc in self._accelerators.items()}
            )
            self._options = {
                name: MappingProxyType(values)
                for name, values in cfg.resolve_options(
                    {name: acc.options for name, acc in self._accelerators.items()}
                ).items()
            }
        except ConfigError as exc:
            if not failures:
                raise
            failed = "; ".join(f"{_who(i)}: {i.error}" for i in failures)
            raise ConfigError(
                f"{exc}; a plugin that failed to load may declare it: {failed}"
            ) from exc
        self._pm.register_ordered(loaded, impls, cfg.hook_order)
        self._registration = (loaded, impls)
        self._traced: PluginManager | None = None

    def _load_one(
        self, candidate, owners: dict[str, tuple[PluginInfo, Accelerator]]
    ) -> tuple[PluginInfo, dict[str, Any]]:
        info = load(candidate)
        if not info.loaded:
            return info, {}
        try:
            hooks = self._pm.implementations(info)
        except (ValueError, pluggy.PluginValidationError) as exc:
            return info.failed(str(exc), exc), {}
        info = replace(info, hooks=tuple(h for h in HOOK_NAMES if h in hooks))
        declared: list[Accelerator] = []
        if "umahub_accelerators" in hooks:
            try:
                result = hooks["umahub_accelerators"][0]()
            except Exception as exc:  # a plugin's own code failing is the plugin's error
                return info.failed(
                    f"umahub_accelerators failed: {type(exc).__name__}: {exc}", exc
                ), {}
            try:
                declared = checked_accelerators(result)
            except PluginOutputError as exc:
                return info.failed(str(exc), exc), {}
        for acc in declared:
            if acc.name in owners:  # the first declaration stands; this plugin is skipped
                other = owners[acc.name][0]
                return info.failed(
                    f"declares accelerator '{acc.name}', which {_who(other)} already declares; "
                    f"uninstall one, or disable one: [tool.umahub] disable = "
                    f'["{info.name}"]'
                ), {}
        info = replace(info, accelerators=tuple(a.name for a in declared))
        for acc in declared:
            owners[acc.name] = (info, acc)
        return info, hooks

    # ------------------------------------------------------------------ queries

    @property
    def accelerators(self) -> list[Accelerator]:
        """Every accelerator, those named by ``priority`` first, in that order."""
        order = list(self.config.priority or ())
        rest = [n for n in self._accelerators if n not in order]
        return [self._accelerators[n] for n in order + rest]

    @property
    def claimants(self) -> list[Accelerator]:
        """The accelerators that claim operators, in claiming order.

        With ``priority`` set, only the accelerators it names; else all of
        them in plugin order.
        """
        if self.config.priority is None:
            return list(self._accelerators.values())
        return [self._accelerators[n] for n in self.config.priority]

    def accelerator(self, name: str) -> Accelerator:
        """The accelerator called ``name``; a :class:`KeyError` suggests the closest one."""
        try:
            return self._accelerators[name]
        except KeyError:
            raise KeyError(
                f"no accelerator '{name}'{did_you_mean(name, self._accelerators)}; "
                f"installed: {', '.join(self._accelerators) or 'none'}"
            ) from None

    def owner(self, accelerator: str) -> str:
        """The name of the plugin that declared ``accelerator``."""
        return self._owner[accelerator]

    def options_of(self, accelerator: str) -> Mapping[str, Any]:
        """The backend options of ``accelerator`` in effect, read-only: every option its
        plugin declares, with the user's value (``[tool.umahub.options.<name>]``,
        ``config=``, ``--option``) or the default. Hooks see it as ``context.options``."""
        return self._options[accelerator]

    def changed_options(self) -> dict[str, dict[str, Any]]:
        """The options set to other values than their defaults, per accelerator (an
        accelerator with none left out): what the report shows."""
        found = {
            name: changed(acc.options, self._options[name])
            for name, acc in self._accelerators.items()
        }
        return {name: values for name, values in found.items() if values}

    @property
    def hook(self) -> Any:
        """pluggy's hook relay: ``hub.hook.umahub_patterns(accelerator=acc)``."""
        return self._pm.hook

    @property
    def traced_hook(self) -> Any:
        """The same hooks, each call logged for the report (what the pipeline uses)."""
        if self._traced is None:
            self._traced = PluginManager()
            self._traced.register_ordered(*self._registration, self.config.hook_order, traced=True)
        return self._traced.hook

    def call_order(self, hook: str) -> list[str]:
        """The plugins whose implementation of ``hook`` runs, in running order."""
        return self._pm.call_order(hook)

    # ------------------------------------------------------------------ compiling

    def compile(self, mod: tvm.IRModule | Any, *, model: str = "", **options: Any) -> Compiled:
        """Compile a model through the plugins' hooks.

        ``mod`` is a Relax module with a ``main``, a
        ``torch.export.ExportedProgram`` or an ``onnx.ModelProto`` (imported
        by :func:`umahub.frontends.to_relax`, weights as constants, operators
        named after the source model's nodes and layers, so that pins can
        name them). ``model`` names it in the report and its picture (a zoo
        name, a file name). See :func:`umahub.compiler.pipeline.compile` for the options.

        Raises:
            UmahubError: ``mod`` is none of these, or could not be imported.
        """
        from umahub.compiler.pipeline import compile as compile_module
        from umahub.frontends import to_relax

        compiled = compile_module(self, to_relax(mod), **options)
        compiled.report.model = model
        return compiled

    def compile_decoder(
        self, model: Any, *, max_context: int = 128, name: str = "", **options: Any
    ) -> CompiledDecoder:
        """Compile a language model into a prefill and a decode step, with a KV cache.

        ``model`` is a ``transformers`` causal language model (GPT-2, Llama,
        Qwen2, ...) or the :class:`umahub.frontends.decoders.DecoderPrograms`
        of :func:`~umahub.frontends.decoders.export_decoder`. It is exported
        with a static cache of ``max_context`` positions, as ExecuTorch does;
        each of the two functions is compiled as :meth:`compile` would
        (``options`` are its options, given to both), the prefill with a
        symbolic number of tokens bounded by ``max_context``
        (``tir_var_upper_bound``), so that accelerators take its operators within
        that bound. ``generate(ids, max_new_tokens=...)`` on the result decodes
        greedily (see :mod:`umahub.runtime.generation`).

        Raises:
            UmahubError: PyTorch or ``transformers`` missing, the model cannot
                be exported or imported (the message says why).
        """
        from umahub.frontends import to_relax
        from umahub.frontends.decoders import (
            DecoderPrograms,
            bound_to_context,
            export_decoder,
            state_of,
        )
        from umahub.runtime.generation import CompiledDecoder, DecoderReport

        programs = model if isinstance(model, DecoderPrograms) else None
        if programs is None:
            programs = export_decoder(model, max_context=max_context)
            name = name or type(model).__name__
        prefill_mod, decode_mod = to_relax(programs.prefill), to_relax(programs.decode)
        # the prompt's length is at most the context: accelerators take the prefill's
        # operators within that bound (see umahub.plugin.memory.upper_bound)
        prefill_mod = bound_to_context(prefill_mod, programs.max_context)
        state = state_of(prefill_mod)
        if state_of(decode_mod) != state:
            raise UmahubError(
                f"the prefill's cache {state} and the decode step's {state_of(decode_mod)} "
                "differ: export both from one model (export_decoder)"
            )
        prefill = self.compile(prefill_mod, model=f"{name} prefill".strip(), **options)
        decode = self.compile(decode_mod, model=f"{name} decode".strip(), **options)
        return CompiledDecoder(
            prefill,
            decode,
            state,
            programs.state,
            programs.max_context,
            DecoderReport(prefill.report, decode.report),
        )

    def explain(self, mod: tvm.IRModule | Any, *, model: str = "", **options: Any) -> Report:
        """Plan placement, copies and memory for ``mod`` without building it.

        ``mod`` and ``model`` are what :meth:`compile` takes.
        """
        from umahub.compiler.pipeline import explain
        from umahub.frontends import to_relax

        report = explain(self, to_relax(mod), **options)
        report.model = model
        return report

    def tune(
        self,
        mod: tvm.IRModule | Any,
        *,
        database: str | None = None,
        trials: int = 64,
        rpc: str | None = None,
        key: str | None = None,
        progress: Any = None,
    ) -> Any:
        """Tune the host kernels of ``mod``'s compile with TVM's MetaSchedule, and the
        partitions whose plugin offers a search space (``umahub_tuning_space``).

        Candidates are measured with the schedule the compile gives each
        kernel otherwise, on this machine or, with ``rpc="HOST:PORT"`` and
        ``key``, on every free board of ``key`` at that tracker; each
        kernel's verdict goes into ``database`` (a directory; None: the
        config's ``tuning-database``), which :meth:`compile` then uses where
        the tuned kernel measured faster. ``trials``: candidates measured in
        all. Returns a :class:`umahub.tuning.TuningResult`.

        Raises:
            umahub.tuning.TuningError: no database, an unreachable tracker, a
                key with no free board.
        """
        from umahub.frontends import to_relax
        from umahub.tuning.tune import check_database, tune

        path = check_database(database or self.config.tuning_database)
        return tune(
            self, to_relax(mod), database=path, trials=trials, rpc=rpc, key=key, progress=progress
        )

    def relax_pipeline(
        self, *, placement: Mapping[str, str] | None = None, then: Any = "default"
    ) -> Any:
        """This hub's plugins as a Relax pipeline for ``tvm.compile``.

        ``tvm.compile(mod, target="llvm", relax_pipeline=hub.relax_pipeline())``
        places, lowers and codegens ``mod`` as :meth:`compile` does, then runs
        ``then`` (TVM's default Relax pipeline; a pipeline name or any pass);
        the returned pass then gives the report and a runnable
        :class:`umahub.Compiled` (see :mod:`umahub.compiler.relax_pipeline`).
        """
        from umahub.compiler.relax_pipeline import RelaxPipeline

        return RelaxPipeline(self, placement, then=then)

    def __repr__(self) -> str:
        loaded = [p.name for p in self.plugins if p.loaded]
        return f"<umahub.Hub plugins={loaded} accelerators={[a.name for a in self.accelerators]}>"


def _who(info: PluginInfo) -> str:
    if info.distribution:
        return f"plugin '{info.name}' (distribution {info.distribution} {info.version})"
    return f"plugin '{info.name}' ({info.origin})"
