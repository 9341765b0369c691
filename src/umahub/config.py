"""``[tool.umahub]``: where it is read from, what each key means, how it is checked.

The configuration is found, in this order:

1. the file named by the environment variable ``UMAHUB_CONFIG`` (a
   ``pyproject.toml`` with a ``[tool.umahub]`` table, or a TOML file whose top
   level holds the keys);
2. the nearest ``pyproject.toml`` with a ``[tool.umahub]`` table, from the working
   directory upward; a broken one on the way is skipped unless it mentions
   ``tool.umahub`` (see :mod:`umahub.config_files`).

A ``config=`` mapping given to :class:`umahub.Hub` overrides the file key by key
(``options`` option by option). Keys are written as in TOML (``hook-order``);
``hook_order`` is accepted too (:func:`toml_key`).

Names that only exist once plugins are loaded (plugins, accelerators, hooks,
backend options) are checked by :meth:`Config.check_plugin_names`,
:meth:`Config.check_accelerator_names` and :meth:`Config.resolve_options`,
which the hub calls while loading.

What is valid but almost surely a mistake is warned about (an
:class:`~umahub.errors.UmahubWarning` naming the key, what is wrong and what
to do): a name listed twice, an empty ``plugins`` or ``priority`` list, a pin
selector with a ``[`` that is never closed (so it is no glob), two pins that
name the same op (``"nn.relu"`` and ``"relax.nn.relu"``).

Why this module is long: every key, its meaning, its parser and its messages
are here, one table of them (``_PARSERS``), so that a key is added in one place.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from umahub.config_files import find_config_file, read_toml
from umahub.errors import ConfigError, did_you_mean, warn

__all__ = [
    "Config",
    "OptionText",
    "Pin",
    "accelerator_of",
    "find_config_file",
    "glob_problem",
    "load_config",
    "parse_option",
    "parse_pin",
    "toml_key",
]

HOST = "host"
ON_ERROR = ("fallback", "error")
SCOPE_POLICIES = ("io", "outputs")
EXECUTORS = ("auto", "vm", "concurrent")


@dataclass(frozen=True)
class Pin:
    """Where a pin sends operators: the host, an accelerator, or one of its instances."""

    accelerator: str  # "host" for the host
    instance: int | None = None

    def __str__(self) -> str:
        return self.accelerator if self.instance is None else f"{self.accelerator}:{self.instance}"


def toml_key(name: str) -> str:
    """A key as TOML writes it: ``hook_order`` -> ``hook-order`` (``-`` and ``_`` are the same)."""
    return name.replace("_", "-")


class OptionText(str):
    """A backend option's value as written on the command line (``--option ACC.KEY=VALUE``).

    It is read by the type the option declares (:meth:`umahub.plugin.Option.parse`)
    when the hub checks it, where a value from TOML or Python must already be
    of that type.
    """


def parse_option(text: str) -> tuple[str, str, OptionText]:
    """``"ACC.KEY=VALUE"`` (``--option``) as (accelerator, option, value as text).

    Raises:
        ConfigError: ``text`` is not of that form.
    """
    assignment, sep, value = text.partition("=")
    accelerator, dot, key = assignment.strip().partition(".")
    if not (sep and dot and accelerator and key):
        raise ConfigError(
            f"--option {text}: expected ACC.KEY=VALUE, an accelerator's option and its value "
            "(e.g. --option npu.tile-rows=16)"
        )
    return accelerator, toml_key(key), OptionText(value)


def accelerator_of(device: str) -> str:
    """The accelerator a device instance belongs to: ``"npu:0"`` -> ``"npu"``; ``"host"`` stays."""
    return device.partition(":")[0]


def parse_pin(value: str, key: str = "placement") -> Pin:
    """Parse ``"host"``, ``"accel"`` or ``"accel:1"`` into a :class:`Pin`."""
    if not isinstance(value, str) or not value:
        raise ConfigError(
            f"[tool.umahub] {key}: expected 'accelerator', 'accelerator:N' or 'host', got {value!r}"
        )
    name, sep, index = value.partition(":")
    if not sep:
        return Pin(name)
    if name == HOST or not index.isdigit():
        raise ConfigError(
            f"[tool.umahub] {key}: {value!r} is not 'accelerator', 'accelerator:N' or 'host'"
        )
    return Pin(name, int(index))


@dataclass(frozen=True)
class Config:
    """The validated contents of ``[tool.umahub]``.

    Attributes:
        plugins: allowlist and order of plugins (entry-point names); None = all.
        disable: plugins never loaded.
        priority: accelerators in the order in which they claim operators; an
            accelerator not named claims nothing. None = all, in plugin order.
            ``priority = "auto"`` in the file sets ``placement_auto`` instead.
        placement_auto: placement by cost (``priority = "auto"``): every
            accelerator is considered for every group its patterns take, and
            the assignment with the lowest estimated latency wins (see
            :mod:`umahub.auto`).
        auto_finalists: how many other starting points (claiming orders, an
            accelerator alone, the host alone) placement by cost measures its
            choice against, best estimated first; 0: the estimate decides
            (see :mod:`umahub.auto.finalists`).
        hook_order: per hook name, the order of the plugins' implementations.
        lowering_order: order in which partitions are lowered, by accelerator
            name (``"host"`` included). None = host first, then priority order.
        placement: pins, from an op name, a pattern name or a node name (glob
            allowed) to a :class:`Pin`.
        on_error: ``"fallback"`` (a failing plugin's partition goes back to the
            host) or ``"error"`` (the compile stops).
        scope_policy: ``"io"`` (a partition's inputs and outputs live in the
            accelerator's memory scope) or ``"outputs"`` (only its outputs).
        strict: a plugin that fails to load stops the hub instead of being skipped.
        verify: after the build, run every partition on the model's own values
            and compare it with the host's lowering of the same operators; a
            partition that differs is a plugin failure (see :mod:`umahub.compiler.stages.verify`).
        verify_tolerance: the largest error ``verify`` accepts, relative to the
            largest magnitude of the host's output (at least 1).
        hook_timeout: seconds the hooks of one partition (or one accelerator's
            ``umahub_patterns``) may take; past it, a plugin failure. 0: no limit.
        executor: how ``run`` runs a compiled model: ``"vm"`` (TVM's Relax VM,
            one step after the other), ``"concurrent"`` (a worker per device,
            see :mod:`umahub.runtime.executor`) or ``"auto"`` (concurrent when the
            model runs on more than one device).
        profile: after the build, run the model on random inputs with both
            executors and put the measured timeline in the report.
        target: the LLVM target the host part and LLVM partitions are built
            for (``"llvm -mtriple=aarch64-linux-gnu"``, or a table of TVM's
            dict form); None: this machine (see :mod:`umahub.targets`).
        cc: the C compiler of C partitions and the export
            (``"aarch64-linux-gnu-gcc"``); None: TVM's default.
        tuning_database: the directory ``umahub tune`` wrote (in a configuration
            file, relative to the file's directory; given as ``config=`` or on
            the command line, to the working directory): a kernel it tuned
            faster than its schedule is compiled with the tuned schedule (see
            :mod:`umahub.tuning`); None: no tuning.
        options: backend options, per accelerator: ``[tool.umahub.options.npu]``
            then ``tile-rows = 16``. Each must be an option the accelerator's
            plugin declares (``umahub plugins`` lists them), of its type; the
            hooks read them as ``context.options``. ``config=`` and ``--option
            npu.tile-rows=16`` set options one by one over the file's.
        source: where the configuration came from, for messages.
    """

    plugins: tuple[str, ...] | None = None
    disable: tuple[str, ...] = ()
    priority: tuple[str, ...] | None = None
    placement_auto: bool = False
    auto_finalists: int = 6
    hook_order: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    lowering_order: tuple[str, ...] | None = None
    placement: Mapping[str, Pin] = field(default_factory=dict)
    on_error: str = "fallback"
    scope_policy: str = "io"
    strict: bool = False
    verify: bool = False
    verify_tolerance: float = 1e-4
    hook_timeout: float = 600.0
    executor: str = "auto"
    profile: bool = False
    target: str | Mapping[str, Any] | None = None
    cc: str | None = None
    tuning_database: str | None = None
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    source: str = "<defaults>"

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str = "<config>") -> Config:
        """Validate a ``[tool.umahub]``-shaped mapping; raise :class:`ConfigError` on bad input."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"{source}: [tool.umahub] must be a table, got {type(data).__name__}")
        values: dict[str, Any] = {}
        for raw_key, value in data.items():
            key = toml_key(str(raw_key))
            parse = _PARSERS.get(key)
            if parse is None:
                raise ConfigError(
                    f"{source}: unknown key '{raw_key}' in [tool.umahub]"
                    f"{did_you_mean(key, _PARSERS)}; known keys: {', '.join(sorted(_PARSERS))}"
                )
            values[key.replace("-", "_")] = parse(value, f"{source}: [tool.umahub] {key}")
        if values.get("priority") == AUTO:
            values["priority"] = None
            values["placement_auto"] = True
        return cls(source=source, **values)

    def merged(self, overrides: Mapping[str, Any] | None, source: str = "config=") -> Config:
        """Return this config with the keys of ``overrides`` replacing its own."""
        if not overrides:
            return self
        other = Config.from_mapping(overrides, source)
        given = {toml_key(str(k)).replace("-", "_") for k in overrides}
        if "priority" in given:
            given.add("placement_auto")
        changes = {f.name: getattr(other, f.name) for f in fields(self) if f.name in given}
        if "options" in given:  # option by option, over the file's
            options = {name: dict(values) for name, values in self.options.items()}
            for name, values in other.options.items():
                options.setdefault(name, {}).update(values)
            changes["options"] = options
        return Config(
            **{
                **{f.name: getattr(self, f.name) for f in fields(self)},
                **changes,
                "source": f"{self.source} + {source}",
            }
        )

    def check_plugin_names(
        self, plugins: Iterable[str], hooks: Iterable[str], distributions: Iterable[str] = ()
    ) -> None:
        """Check the plugin and hook names the config uses against those found.

        ``disable`` may also name a distribution (``"umahub-dsp"``), to choose
        between two distributions of one plugin name; ``distributions`` is
        read only when ``disable`` names something that is no plugin.
        """
        plugins, hooks = set(plugins), set(hooks)
        for name in self.plugins or ():
            _known(name, plugins, "[tool.umahub] plugins", "plugin", self.source)
        unknown = [name for name in self.disable if name not in plugins]
        if unknown:
            dists = set(distributions)
            for name in unknown:
                if name not in dists:
                    _known(
                        name,
                        plugins,
                        "[tool.umahub] disable",
                        "plugin or distribution",
                        self.source,
                    )
        for hook, order in self.hook_order.items():
            _known(hook, hooks, "[tool.umahub.hook-order]", "hook", self.source)
            for name in order:
                _known(name, plugins, f"[tool.umahub.hook-order] {hook}", "plugin", self.source)

    def check_accelerator_names(self, accelerators: Mapping[str, int]) -> None:
        """Check the accelerator names (and pinned instances) against those loaded.

        Args:
            accelerators: accelerator name -> number of instances.
        """
        for name in self.priority or ():
            _known(name, accelerators, "[tool.umahub] priority", "accelerator", self.source)
        for name in self.lowering_order or ():
            if name != HOST:
                _known(
                    name,
                    [*accelerators, HOST],
                    "[tool.umahub] lowering-order",
                    "accelerator",
                    self.source,
                )
        for selector, pin in self.placement.items():
            if pin.accelerator == HOST:
                continue
            where = f"[tool.umahub.placement] {selector!r}"
            _known(pin.accelerator, [*accelerators, HOST], where, "accelerator", self.source)
            count = accelerators[pin.accelerator]
            if pin.instance is not None and pin.instance >= count:
                raise ConfigError(
                    f"{self.source}: {where} = '{pin}': accelerator '{pin.accelerator}' has "
                    f"{count} instance(s), numbered 0..{count - 1}"
                )

    def resolve_options(self, declared: Mapping[str, Sequence[Any]]) -> dict[str, dict[str, Any]]:
        """Every declared backend option's value, per accelerator: the user's, else the default.

        Args:
            declared: accelerator name -> the options its plugin declares
                (:class:`umahub.plugin.Option`), for every accelerator loaded.

        Returns:
            accelerator name -> option name (as declared) -> value, every
            accelerator and every option of it included.

        Raises:
            ConfigError: an accelerator no plugin declares, an option it does
                not declare, a value of another type or outside the choices.
        """
        resolved = {name: {o.name: o.default for o in opts} for name, opts in declared.items()}
        for name, values in self.options.items():
            if name not in declared:
                # named where the user wrote it: the file's table, else the first --option
                key, value = next(iter(values.items()), ("", None))
                text = isinstance(value, OptionText)
                where = self._option_where(name, key, value) if text else self._option_where(name)
                raise ConfigError(f"{where}: {_unknown(name, declared, 'accelerator')}")
            by_key = {toml_key(o.name): o for o in declared[name]}
            for key, value in values.items():
                text = isinstance(value, OptionText)
                where = self._option_where(name, key, value)
                option = by_key.get(key)
                if option is None:
                    listing = ", ".join(o.name for o in declared[name])
                    raise ConfigError(
                        f"{where}: accelerator '{name}' has no option '{key}'"
                        f"{did_you_mean(key, by_key)}; "
                        + (f"its options: {listing}" if listing else "it declares none")
                    )
                try:
                    resolved[name][option.name] = (
                        option.parse(value) if text else option.check(value)
                    )
                except ValueError as exc:
                    raise ConfigError(f"{where}: {exc}") from None
        return resolved

    def _option_where(self, accelerator: str, key: str = "", value: Any = None) -> str:
        """Where a backend option was set, for messages: ``--option`` or the file's table."""
        if isinstance(value, OptionText):
            return f"--option {accelerator}.{key}={value}"
        return f"{self.source}: [tool.umahub.options.{accelerator}]" + (f" {key}" if key else "")


def _unknown(name: str, known, what: str) -> str:
    """``unknown accelerator 'x' (did you mean 'y'?); known accelerators: ...``"""
    listing = ", ".join(sorted(known)) or "none"
    return f"unknown {what} '{name}'{did_you_mean(name, known)}; known {what}s: {listing}"


def _known(name: str, known, where: str, what: str, source: str) -> None:
    if name not in known:
        raise ConfigError(f"{source}: {where}: {_unknown(name, known, what)}")


def _type_name(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


def _toml(value: Any) -> str:
    """``value`` as TOML writes it, for a message quoting the user's line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def _str_list(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: expected a list of strings, got {_type_name(value)}")
    for name in dict.fromkeys(value):
        count = value.count(name)
        if count > 1:
            warn(
                f"{where}: '{name}' is listed {count} times; only its first place counts, "
                "remove the repeats"
            )
    return tuple(value)


def _not_empty(empty_means: str, instead: str):
    """A list of names that warns when it is empty: ``empty_means`` what then happens."""

    def parse(value: Any, where: str) -> tuple[str, ...]:
        names = _str_list(value, where)
        if not names:
            warn(f"{where} is empty, so {empty_means}; {instead}")
        return names

    return parse


#: ``priority = "auto"``: placement by cost.
AUTO = "auto"


def _priority(value: Any, where: str) -> tuple[str, ...] | str:
    """A list of accelerators in claiming order, or ``"auto"`` (placement by cost)."""
    if value == AUTO:
        return AUTO
    if isinstance(value, str):
        raise ConfigError(
            f'{where}: expected a list of accelerators or "auto" (placement by cost), got '
            f"{value!r}{did_you_mean(value, (AUTO,))}"
        )
    return _not_empty(
        "no accelerator claims operators (only pins place them)",
        "list the accelerators that should claim, or remove the key to let all of them claim",
    )(value, where)


def _choice(options: tuple[str, ...]):
    def parse(value: Any, where: str) -> str:
        if value not in options:
            raise ConfigError(
                f"{where}: expected one of {', '.join(repr(o) for o in options)}, got "
                f"{value!r}{did_you_mean(str(value), options)}"
            )
        return value

    return parse


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true or false, got {_type_name(value)}")
    return value


def _positive(allow_zero: bool):
    def parse(value: Any, where: str) -> float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok or value < 0 or (value == 0 and not allow_zero) or value != value:
            wanted = "a number >= 0 (0: no limit)" if allow_zero else "a number > 0"
            raise ConfigError(f"{where}: expected {wanted}, got {_type_name(value)}")
        return float(value)

    return parse


def _count(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{where}: expected a whole number >= 0, got {_type_name(value)}")
    return value


def _target(value: Any, where: str) -> str | dict[str, Any]:
    from umahub.targets import TargetError, parse_target

    try:
        parse_target(value, where)  # the form only; TVM checks it when a compile starts
    except TargetError as exc:
        raise ConfigError(str(exc)) from None
    return value if isinstance(value, str) else dict(value)


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: expected a non-empty string, got {_type_name(value)}")
    return value


def _hook_order(value: Any, where: str) -> dict[str, tuple[str, ...]]:
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{where}: expected a table of hook name = [plugins], got {_type_name(value)}"
        )
    return {str(k): _str_list(v, f"{where}.{k}") for k, v in value.items()}


def _options(value: Any, where: str) -> dict[str, dict[str, Any]]:
    """``[tool.umahub.options.<accelerator>]`` tables; their names and types are checked
    against the plugins' declarations by :meth:`Config.resolve_options`."""
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{where}: expected tables of option = value, one per accelerator "
            f"([tool.umahub.options.<accelerator>]), got {_type_name(value)}"
        )
    for name, table in value.items():
        if not isinstance(table, Mapping):
            raise ConfigError(
                f"{where}: {name} = {_toml(table)} is not a table: write the accelerator's "
                f"options under [tool.umahub.options.{name}], one option = value a line"
            )
    options: dict[str, dict[str, Any]] = {}
    for name, table in value.items():
        options[str(name)] = {}
        for key, v in table.items():
            if not isinstance(v, (bool, int, float, str)):
                raise ConfigError(
                    f"{where}.{name}.{key}: expected true or false, a number or a string, "
                    f"got {_type_name(v)}"
                )
            options[str(name)][toml_key(str(key))] = v
    return options


def _placement(value: Any, where: str) -> dict[str, Pin]:
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{where}: expected a table of selector = 'accelerator[:N]' | 'host', "
            f"got {_type_name(value)}"
        )
    pins = {str(k): parse_pin(v, f"{where} {k!r}") for k, v in value.items()}
    same_op: dict[str, str] = {}
    for selector in pins:
        problem = glob_problem(selector)
        if problem:
            warn(f"{where} {selector!r}: {problem}")
        op = selector.removeprefix("relax.")
        first = same_op.setdefault(op, selector)
        if first != selector:
            warn(
                f"{where}: {first!r} and {selector!r} name the same op; {first!r} -> "
                f"'{pins[first]}' wins (it is written first), remove {selector!r}"
            )
    return pins


def glob_problem(selector: str) -> str:
    """What is wrong with a pin selector as a glob ("" when nothing is).

    A ``[`` that no ``]`` closes is read by ``fnmatch`` as a plain ``[``:
    ``"fc[1"`` selects only an operator named ``fc[1``, never what was meant.
    """
    i = selector.find("[")
    while i >= 0:
        j = i + 1
        j += selector.startswith("!", j)
        j += selector.startswith("]", j)  # a ']' right after '[' is inside the set
        end = selector.find("]", j)
        if end < 0:
            return (
                f"the '[' at position {i} is never closed, so it is taken as a plain '[' "
                f"and the pin selects only names with a '[' in them; close it "
                f"({selector + ']'!r}), or write '[[]' for a plain '['"
            )
        i = selector.find("[", end + 1)
    return ""


_PARSERS = {
    "plugins": _not_empty(
        "no installed plugin is loaded (only those given as Hub(plugins=[...]))",
        "list the plugins to load, or remove the key to load all of them",
    ),
    "disable": _str_list,
    "priority": _priority,
    "auto-finalists": _count,
    "hook-order": _hook_order,
    "lowering-order": _str_list,
    "placement": _placement,
    "on-error": _choice(ON_ERROR),
    "scope-policy": _choice(SCOPE_POLICIES),
    "strict": _bool,
    "verify": _bool,
    "verify-tolerance": _positive(allow_zero=False),
    "hook-timeout": _positive(allow_zero=True),
    "executor": _choice(EXECUTORS),
    "profile": _bool,
    "target": _target,
    "cc": _string,
    "tuning-database": _string,
    "options": _options,
}


def load_config(overrides: Mapping[str, Any] | None = None, start: Path | None = None) -> Config:
    """Read the configuration file (see module docs) and apply ``overrides`` on top."""
    path = find_config_file(start)
    base = Config()
    if path is not None:
        data = read_toml(path)
        table = data.get("tool", {}).get("umahub", data if path.name != "pyproject.toml" else {})
        base = Config.from_mapping(table, str(path))
        if base.tuning_database and not Path(base.tuning_database).is_absolute():
            # the file's directory, wherever the compile runs from within the project
            database = str(path.parent.resolve() / base.tuning_database)
            base = replace(base, tuning_database=database)
    return base.merged(overrides)
