"""Sphinx glue for umahub's documentation: pages generated from the code and the results.

Directives:

``.. umahub-config-keys::``
    The table of every ``[tool.umahub]`` key, from :mod:`umahub.config`: the
    keys of its parser table, each key's default from :class:`umahub.config.Config`
    and its meaning from that class's docstring. A key without a description
    there, or with a parser this module cannot name, fails the build.
``.. umahub-cli::``
    ``umahub --help`` and each command's ``--help``, from the argument parser.
``.. umahub-benchmarks::``
    Every results file as a section (:mod:`benchmarks_page`).
``.. umahub-source-tree::``
    ``src/umahub`` as a tree: each package with its docstring's first line.
``.. umahub-layers::``
    The layer rules ``tests/test_architecture.py`` checks, from its tables.

Checks and links:

* every name of ``umahub.plugin.__all__`` must be documented as
  ``umahub.plugin.<name>`` (the plugin API page cannot fall behind the package);
* a reference to an object by another of its names (``umahub.Accelerator``,
  ``umahub.host.prepack.pack_weight``) links to where that very object is
  documented (``umahub.plugin.Accelerator``, ``umahub.plugin.pack_weight``).
"""

from __future__ import annotations

import dataclasses
import importlib
import io
import os
import re
import textwrap
from contextlib import redirect_stdout
from typing import Any

import benchmarks_page
from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------ [tool.umahub] keys


def _parser_kind(parse: Any) -> tuple[str, tuple[str, ...]]:
    """What a key of ``[tool.umahub]`` takes, from its parser in ``umahub.config._PARSERS``.

    Returns the kind in words and, for a choice, its options. Raises KeyError for
    a parser this table does not know (a new kind of key: describe it here).
    """
    kinds = {
        "_str_list": "list of strings",
        "_not_empty.<locals>.parse": "list of strings",
        "_priority": 'list of accelerators, or "auto"',
        "_count": "whole number >= 0",
        "_hook_order": "table: hook name = list of plugins",
        "_placement": 'table: selector = "accelerator", "accelerator:N" or "host"',
        "_choice.<locals>.parse": "one of",
        "_bool": "true or false",
        "_positive.<locals>.parse": "number",
        "_target": "string (an LLVM target) or table (TVM's dict form)",
        "_string": "string",
        "_options": "tables: [tool.umahub.options.<accelerator>], option = value",
    }
    kind = kinds[parse.__qualname__]
    cells = [c.cell_contents for c in parse.__closure__ or ()]
    options = next((c for c in cells if isinstance(c, tuple)), ())
    if parse.__qualname__ == "_positive.<locals>.parse":
        kind = "number >= 0 (0: no limit)" if True in cells else "number > 0"
    return kind, options


def _attribute_docs(cls: type) -> dict[str, str]:
    """The ``Attributes:`` section of a Google-style class docstring, per attribute."""
    import inspect

    doc = inspect.cleandoc(cls.__doc__ or "").split("Attributes:", 1)[-1]
    found: dict[str, list[str]] = {}
    current = None
    for line in doc.splitlines():
        m = re.match(r"^    (\w+): (.*)$", line)
        if m:
            current = m.group(1)
            found[current] = [m.group(2)]
        elif current and line.startswith("        "):
            found[current].append(line.strip())
        elif line.strip() and not line.startswith(" "):
            current = None
    return {k: " ".join(v) for k, v in found.items()}


def _for_toml(text: str) -> str:
    """A ``Config`` attribute's description as a TOML key's: Python's None is a key left out."""
    text = re.sub(r"\bNone(?: =|:)", "left out:", text)
    return re.sub(r"(^|\. )left out:", r"\1Left out:", text)


def _priority_meaning(priority: str, auto: str) -> str:
    """``priority``'s description with ``"auto"``, which ``Config`` keeps as ``placement_auto``."""
    priority = re.sub(
        r"\s*``priority = \"auto\"`` in the file sets ``placement_auto`` instead\.", "", priority
    )
    auto = re.sub(r"^placement by cost \(``priority = \"auto\"``\): ", "", auto)
    return f'{priority} ``"auto"``: placement by cost; {auto}' if auto else priority


def _toml(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{}" if not value else str(value)
    return str(value)


def config_keys_rst() -> tuple[str, list[str]]:
    """The key table as reStructuredText, and the problems found (each a build warning)."""
    from umahub import config

    problems: list[str] = []
    docs = _attribute_docs(config.Config)
    defaults = {}
    for f in dataclasses.fields(config.Config):
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory()
    lines = [
        ".. list-table::",
        "   :header-rows: 1",
        "   :widths: 18 22 12 48",
        "",
        "   * - key",
        "     - value",
        "     - default",
        "     - meaning",
    ]
    for key, parse in config._PARSERS.items():
        attribute = key.replace("-", "_")
        try:
            kind, options = _parser_kind(parse)
        except KeyError:
            problems.append(
                f"[tool.umahub] {key}: its parser {parse.__qualname__} is not described in "
                "docs/_ext/umahub_docs.py (_parser_kind)"
            )
            kind, options = "?", ()
        if options:
            kind = f"{kind} " + ", ".join(f"``{_toml(o)}``" for o in options)
        meaning = docs.get(attribute)
        if not meaning:
            problems.append(
                f"[tool.umahub] {key}: no description of {attribute!r} in the Attributes of "
                "umahub.config.Config"
            )
            meaning = ""
        default = _toml(defaults.get(attribute))
        if key == "priority":
            meaning = _priority_meaning(meaning, docs.get("placement_auto", ""))
        meaning = _for_toml(meaning)
        if default in ("", "{}", "[]"):
            default_cell = "(none)" if default == "" else f"``{default}``"
        else:
            default_cell = f"``{default}``"
        anchor = f"config-{key}"
        lines += [
            f"   * - .. _{anchor}:",
            "",
            f"       ``{key}``",
            f"     - {kind}",
            f"     - {default_cell}",
            f"     - {meaning}",
        ]
    return "\n".join(lines) + "\n", problems


class ConfigKeys(SphinxDirective):
    """``.. umahub-config-keys::``: the table of every ``[tool.umahub]`` key."""

    def run(self) -> list[nodes.Node]:
        import umahub.config

        self.env.note_dependency(umahub.config.__file__)
        text, problems = config_keys_rst()
        for problem in problems:
            logger.warning(problem, location=self.get_location())
        return self.parse_text_to_nodes(text)


# ------------------------------------------------------------------ the command line


class CliHelp(SphinxDirective):
    """``.. umahub-cli::``: the help of ``umahub`` and of each of its commands."""

    def run(self) -> list[nodes.Node]:
        import argparse

        from umahub.cli import parser as cli

        self.env.note_dependency(cli.__file__)
        top = cli.build_parser()
        sections = [("umahub", top)]
        for action in top._actions:
            if isinstance(action, argparse._SubParsersAction):
                sections += [(f"umahub {n}", p) for n, p in action.choices.items()]
        lines: list[str] = []
        columns = os.environ.get("COLUMNS")
        os.environ["COLUMNS"] = "82"  # argparse wraps to the terminal: the page is one width
        try:
            for title, parser in sections:
                parser.prog = title
                buffer = io.StringIO()
                with redirect_stdout(buffer):
                    parser.print_help()
                lines += self._section(title, buffer.getvalue())
        finally:
            if columns is None:
                del os.environ["COLUMNS"]
            else:
                os.environ["COLUMNS"] = columns
        return self.parse_text_to_nodes("\n".join(lines), allow_section_headings=True)

    @staticmethod
    def _section(title: str, help_text: str) -> list[str]:
        return [
            f".. _cli-{title.replace(' ', '-')}:",
            "",
            f"``{title}``",
            "-" * (len(title) + 4),
            "",
            ".. code-block:: text",
            "",
            *["   " + line if line else "" for line in help_text.splitlines()],
            "",
        ]


# ------------------------------------------------------------------ the source tree

SRC = benchmarks_page.ROOT / "src" / "umahub"
ARCHITECTURE_TEST = benchmarks_page.ROOT / "tests" / "test_architecture.py"

#: The order in which the tree lists the subpackages: the plugin contract, the
#: hub, the compiler and what it uses, the runtime side, then the ends (the
#: command line, the conformance kit). A subpackage not named here comes last.
TREE_ORDER = (
    "plugin",
    "hub",
    "compiler",
    "host",
    "auto",
    "runtime",
    "boards",
    "report",
    "frontends",
    "models",
    "cli",
    "testing",
)


def _summary(path: Any) -> str:
    """The first line of a module's docstring, with reStructuredText roles made plain."""
    import ast

    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    line = doc.strip().splitlines()[0] if doc.strip() else ""
    line = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", line)
    return line.replace("``", "")


def source_tree() -> str:
    """``src/umahub`` drawn as a tree: packages with their summary and modules, then the
    top-level modules with theirs."""
    width = 24
    packages = sorted(p.name for p in SRC.iterdir() if (p / "__init__.py").is_file())
    ordered = [p for p in TREE_ORDER if p in packages] + [
        p for p in packages if p not in TREE_ORDER
    ]
    lines = ["src/umahub/"]

    def package(path: Any, depth: int) -> None:
        indent = "  " * depth
        summary = textwrap.wrap(_summary(path / "__init__.py"), 90 - width)
        lines.append(f"{indent}{path.name + '/':<{width - len(indent)}}{summary[0]}")
        lines.extend(" " * width + w for w in summary[1:])
        modules = sorted(
            p.stem for p in path.glob("*.py") if not p.stem.startswith("_")
        )  # a package's private modules are its own business
        if modules:
            wrapped = textwrap.wrap(" ".join(modules), 88 - width)
            lines.extend(" " * (width + 2) + w for w in wrapped)
        for sub in sorted(p for p in path.iterdir() if (p / "__init__.py").is_file()):
            package(sub, depth + 1)

    for name in ordered:
        package(SRC / name, 1)
    for path in sorted(SRC.glob("*.py")):
        summary = textwrap.wrap(_summary(path), 90 - width)
        lines.append(f"  {path.name:<{width - 2}}{summary[0] if summary else ''}")
        lines.extend(" " * width + w for w in summary[1:])
    return "\n".join(lines)


class SourceTree(SphinxDirective):
    """``.. umahub-source-tree::``: ``src/umahub`` as a tree, from the files."""

    def run(self) -> list[nodes.Node]:
        for path in SRC.rglob("__init__.py"):
            self.env.note_dependency(str(path))
        text = source_tree()
        block = nodes.literal_block(text, text)
        block["language"] = "text"
        return [block]


def _assigned(tree: Any, name: str) -> Any:
    import ast

    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return ast.literal_eval(node.value)
    raise KeyError(f"{ARCHITECTURE_TEST.name} assigns no {name}")


def layers_rst() -> str:
    """The layers table of ``tests/test_architecture.py`` (its ``LAYERS`` and ``FOUNDATION``)."""
    import ast

    tree = ast.parse(ARCHITECTURE_TEST.read_text())
    layers, foundation = _assigned(tree, "LAYERS"), _assigned(tree, "FOUNDATION")
    lines = [
        ".. list-table::",
        "   :header-rows: 1",
        "",
        "   * - layer",
        "     - may import, besides itself and the foundation",
    ]
    for layer, allowed in layers.items():
        lines += [
            f"   * - ``{layer}``",
            "     - " + (", ".join(f"``{a}``" for a in sorted(allowed)) or "nothing else"),
        ]
    lines += [
        "   * - the foundation",
        "     - " + ", ".join(f"``{m}``" for m in sorted(foundation)) + ": one another only",
    ]
    return "\n".join(lines) + "\n"


class Layers(SphinxDirective):
    """``.. umahub-layers::``: the layer rules the architecture test checks."""

    def run(self) -> list[nodes.Node]:
        self.env.note_dependency(str(ARCHITECTURE_TEST))
        return self.parse_text_to_nodes(layers_rst())


# ------------------------------------------------------------------ the benchmarks


class Benchmarks(SphinxDirective):
    """``.. umahub-benchmarks::``: a section per results file."""

    def run(self) -> list[nodes.Node]:
        self.env.note_dependency(benchmarks_page.__file__)
        for path in benchmarks_page.result_files():
            self.env.note_dependency(str(path))
        return self.parse_text_to_nodes(benchmarks_page.render(), allow_section_headings=True)


# ------------------------------------------------------------------ links and checks


def _object(dotted: str) -> Any:
    """The object a dotted name refers to, or None."""
    module, attrs = dotted, []
    while module:
        try:
            value: Any = importlib.import_module(module)
        except Exception:  # not a module: try one level up
            module, _, attr = module.rpartition(".")
            attrs.insert(0, attr)
            continue
        try:
            for attr in attrs:
                value = getattr(value, attr)
        except Exception:  # no such attribute (or it fails to resolve)
            return None
        return value
    return None


#: ``id(object) -> documented name``, made once per build (ids belong to this process, so
#: it is never kept in the environment that Sphinx pickles between builds).
_BY_IDENTITY: dict[int, str] = {}


def _documented_by_identity(env: Any) -> dict[int, str]:
    """``id(object) -> documented name`` for every documented umahub object."""
    if not _BY_IDENTITY:
        domain = env.get_domain("py")
        for name, obj in sorted(domain.objects.items()):
            if name.startswith("umahub.") and obj.objtype != "module":
                value = _object(name)
                if value is not None and not isinstance(value, (int, float, str, bool)):
                    _BY_IDENTITY.setdefault(id(value), name)
    return _BY_IDENTITY


def _forget_identities(app: Sphinx, *args: Any) -> None:
    _BY_IDENTITY.clear()


def _by_last_name(env: Any, name: str, kinds: list[str]) -> str | None:
    """The one documented umahub object of one of ``kinds`` whose name ends with
    ``.name``, or None."""
    found = [
        full
        for full, entry in env.get_domain("py").objects.items()
        if full.startswith("umahub.")
        and full.endswith("." + name)
        and "._" not in full
        and entry.objtype in kinds
    ]
    return found[0] if len(found) == 1 else None


def resolve_other_name(app: Sphinx, env: Any, node: Any, contnode: Any) -> Any:
    """Link a reference to the place its object is documented under another name.

    ``umahub.X`` that is the very object documented as ``umahub.plugin.X``
    links there; a name that is no object (``umahub.LoadedModel``, or a bare
    ``HookimplMarker`` in a docstring of another module) links to the one
    documented umahub object of that last name, if there is exactly one.
    """
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    module = node.get("py:module") or ""
    if not target.startswith("umahub.") and module.startswith("umahub"):
        target = f"{module}.{target}"
    if not target.startswith("umahub."):
        return None
    domain = env.get_domain("py")
    kinds = domain.objtypes_for_role(node["reftype"]) or []
    value = _object(target)
    documented = _documented_by_identity(env).get(id(value)) if value is not None else None
    if documented is None:  # no such object, or a number (no identity to go by)
        documented = _by_last_name(env, node.get("reftarget", "").rpartition(".")[2], kinds)
    if documented is None or documented == target:
        return None
    if domain.objects[documented].objtype not in kinds:
        return None  # a :mod: role must not land on an attribute of the same name
    return domain.resolve_xref(
        env, node["refdoc"], app.builder, node["reftype"], documented, node, contnode
    )


def check_plugin_api(app: Sphinx, env: Any) -> None:
    """Every name ``umahub.plugin`` exports, and every hook, is documented."""
    import umahub.plugin
    from umahub.plugin import hookspecs

    objects = env.get_domain("py").objects
    for name in umahub.plugin.__all__:
        if f"umahub.plugin.{name}" not in objects:
            logger.warning(
                f"umahub.plugin.{name} is exported by umahub.plugin but not documented: "
                "add it to docs/plugins/api.rst"
            )
    for name in dir(hookspecs):
        if name.startswith("umahub_") and f"umahub.plugin.hookspecs.{name}" not in objects:
            logger.warning(f"the hook {name} is not documented: add it to docs/plugins/hooks.rst")


# ------------------------------------------------------------------ docstrings


def _doc_comment(name: str, value: Any) -> list[str]:
    """The ``#:`` comment of the module-level name that holds ``value`` under the same
    name, in any loaded umahub module (a name re-exported by ``umahub.plugin`` keeps the
    comment written where it is defined)."""
    import sys

    from sphinx.pycode import ModuleAnalyzer

    attr = name.rpartition(".")[2]
    for module_name, module in sorted(sys.modules.items()):
        if not module_name.startswith("umahub") or module is None:
            continue
        if module.__dict__.get(attr, _MISSING) is not value and not (
            module_name == "umahub.plugin.compat" and attr in getattr(module, "__all__", ())
        ):
            continue
        try:
            docs = ModuleAnalyzer.for_module(module_name).find_attr_docs()
        except Exception:  # no source to read
            continue
        if ("", attr) in docs:
            return list(docs[("", attr)])
    return []


_MISSING = object()
LONG_REASON = "Why this module is long:"


def process_docstring(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    """Drop the note for code readers on why a module is long; give a re-exported
    constant the doc comment it has where it is defined (not the docstring of its type)."""
    for i, line in enumerate(lines):
        if line.startswith(LONG_REASON):
            end = next((j for j in range(i, len(lines)) if not lines[j].strip()), len(lines))
            del lines[i:end]
            break
    if what == "data" and name.startswith("umahub."):
        comment = _doc_comment(name, obj)
        if comment:
            lines[:] = comment


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("umahub-config-keys", ConfigKeys)
    app.add_directive("umahub-cli", CliHelp)
    app.add_directive("umahub-benchmarks", Benchmarks)
    app.add_directive("umahub-source-tree", SourceTree)
    app.add_directive("umahub-layers", Layers)
    app.connect("env-updated", _forget_identities)  # the documented objects may have changed
    app.connect("missing-reference", resolve_other_name)
    app.connect("env-check-consistency", check_plugin_api)
    app.connect("autodoc-process-docstring", process_docstring)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
