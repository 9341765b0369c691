"""Backend options: what a plugin lets its users set for its accelerator.

As ONNX Runtime's provider options and ExecuTorch's compile specs: a plugin
declares the options of an accelerator (``Accelerator(..., options=(Option(...),
...))``), the user sets them (``[tool.umahub.options.<accelerator>]`` in
``pyproject.toml``, ``--option ACC.KEY=VALUE`` on the command line, the
``options`` key of ``Hub(config=...)``), and the hooks read them
(``context.options``: every declared option, the user's value or the default).

An option's type is its default's: ``bool``, ``int``, ``float`` or ``str``. A
value is checked against it (:meth:`Option.check`; an ``int`` is taken where a
``float`` is expected), and a value written on the command line is parsed by
it (:meth:`Option.parse`: ``true``/``false``, ``1``/``0``, ``yes``/``no``,
``on``/``off`` for a ``bool``). ``-`` and ``_`` are the same in an option's
name, as in the keys of ``[tool.umahub]``: ``tile_rows`` sets ``tile-rows``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from umahub.config import toml_key
from umahub.errors import did_you_mean

__all__ = ["Option", "OptionValue", "changed", "checked_options", "format_value"]

#: What an option's value may be: its default's type.
OptionValue = bool | int | float | str

_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")
_TYPES: tuple[type, ...] = (bool, int, float, str)
#: What each type is called where a value of it is expected.
_EXPECTED = {
    bool: "true or false",
    int: "a whole number",
    float: "a number",
    str: "a string",
}
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def format_value(value: Any) -> str:
    """A value as TOML writes it (``true``, ``16``, ``"fast"``): how it is shown to users."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def _given(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


def _suggested(default: Any, kind: type, choices: tuple[Any, ...]) -> str:
    """What to write instead of ``default``: itself as a value of ``kind`` when that is a
    choice (``"16"`` -> ``default=16``), else one of the choices."""
    try:
        value = kind(default) if kind is not bool else None
    except (TypeError, ValueError):
        value = None
    if value is not None and value in choices:
        return f"default={value!r}"
    return f"the default as one of {', '.join(repr(c) for c in choices)}"


def _a(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


@dataclass(frozen=True)
class Option:
    """One option of an accelerator, declared by its plugin.

    Args:
        name: the key the user writes (``"double-buffering"``, ``"tile_rows"``):
            a lower-case letter, then lower-case letters, digits, ``-`` and
            ``_``. ``-`` and ``_`` are the same when the user's key is matched.
        default: the value when the user sets none; its type (``bool``,
            ``int``, ``float`` or ``str``) is the option's.
        help: one line shown by ``umahub plugins``.
        choices: the values allowed, of the option's type, the default among
            them; None: any value of the type.

    Raises:
        ValueError: a malformed name, a default of another type, choices that
            are empty, of another type or without the default.
    """

    name: str
    default: OptionValue
    help: str = ""
    choices: tuple[OptionValue, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(
                f"Option name {self.name!r} must start with a lower-case letter and hold only "
                "lower-case letters, digits, '-' and '_' (users write it as a key of "
                "[tool.umahub.options.<accelerator>])"
            )
        if type(self.default) not in _TYPES:
            raise ValueError(
                f"Option {self.name!r}: default must be a bool, int, float or str (the option's "
                f"type is its default's), got {_given(self.default)}"
            )
        if not isinstance(self.help, str):
            raise ValueError(f"Option {self.name!r}: help must be a string, got {self.help!r}")
        if self.choices is None:
            return
        if isinstance(self.choices, str) or not isinstance(self.choices, Iterable):
            raise ValueError(
                f"Option {self.name!r}: choices must be a sequence of values, got "
                f"{_given(self.choices)}"
            )
        choices = tuple(dict.fromkeys(self.choices))
        object.__setattr__(self, "choices", choices)
        if not choices:
            raise ValueError(
                f"Option {self.name!r}: choices is empty; list the values allowed, or leave "
                "it out (None: any value)"
            )
        kinds = {type(c) for c in choices}
        if len(kinds) == 1 and not self._of_type(choices[0]):
            # every choice agrees and the default does not: the default is the likely mistake
            (kind,) = kinds
            raise ValueError(
                f"Option {self.name!r}: the default {_given(self.default)} is not of the "
                f"choices' type {kind.__name__}; the option's type is its default's: write "
                f"{_suggested(self.default, kind, choices)}"
            )
        for choice in choices:
            if not self._of_type(choice):
                raise ValueError(
                    f"Option {self.name!r}: choices holds {_given(choice)}, not "
                    f"{_a(self.type.__name__)} like the default {self.default!r}"
                )
        if self.default not in choices:
            raise ValueError(
                f"Option {self.name!r}: the default {self.default!r} is not one of the choices "
                f"{', '.join(repr(c) for c in choices)}"
            )

    @property
    def type(self) -> type:
        """The option's type: its default's (``bool``, ``int``, ``float`` or ``str``)."""
        return type(self.default)

    def _of_type(self, value: Any) -> bool:
        if self.type is float:  # an int is a number too, but a bool is not
            return isinstance(value, (int, float)) and not isinstance(value, bool)
        return type(value) is self.type

    def check(self, value: Any) -> OptionValue:
        """``value`` (from TOML or Python) as the option's type, or ValueError saying why not."""
        if not self._of_type(value):
            raise ValueError(f"expected {_EXPECTED[self.type]}, got {_given(value)}")
        return self._chosen(float(value) if self.type is float else value)

    def parse(self, text: str) -> OptionValue:
        """``text`` (from the command line) read as the option's type, or ValueError why not."""
        value: OptionValue
        try:
            if self.type is bool:
                word = text.strip().lower()
                if word not in _TRUE + _FALSE:
                    raise ValueError
                value = word in _TRUE
            else:
                value = self.type(text)
        except ValueError:
            wanted = _EXPECTED[self.type] + (
                " (or 1/0, yes/no, on/off)" if self.type is bool else ""
            )
            raise ValueError(f"expected {wanted}, got {text!r}") from None
        return self._chosen(value)

    def _chosen(self, value: OptionValue) -> OptionValue:
        if self.choices is not None and value not in self.choices:
            near = did_you_mean(str(value), [str(c) for c in self.choices])
            raise ValueError(
                f"expected one of {', '.join(repr(c) for c in self.choices)}, got {value!r}{near}"
            )
        return value


def checked_options(accelerator: str, options: Any) -> tuple[Option, ...]:
    """``Accelerator(options=...)`` as a tuple, each an :class:`Option`, names unique
    (``-`` and ``_`` the same); ValueError naming the accelerator otherwise."""
    if isinstance(options, (str, Option)) or not isinstance(options, Iterable):
        raise ValueError(
            f"Accelerator {accelerator!r}: options must be a sequence of umahub.plugin.Option, "
            f"got {options!r}"
        )
    options = tuple(options)
    seen: dict[str, str] = {}
    for option in options:
        if not isinstance(option, Option):
            raise ValueError(
                f"Accelerator {accelerator!r}: options holds {option!r}, not a umahub.plugin.Option"
            )
        first = seen.get(toml_key(option.name))
        if first is not None:
            same = "twice" if first == option.name else f"as {first!r} and {option.name!r}"
            raise ValueError(
                f"Accelerator {accelerator!r}: option {option.name!r} is declared {same} "
                "('-' and '_' are the same in a name); give each option one name"
            )
        seen[toml_key(option.name)] = option.name
    return options


def changed(options: Iterable[Option], values: Mapping[str, Any]) -> dict[str, Any]:
    """The ``values`` that differ from their option's default, in declaration order."""
    return {o.name: values[o.name] for o in options if values.get(o.name, o.default) != o.default}
