"""``umahub new-plugin NAME``: a plugin package that works as it is written.

The package (``<DIR>/<NAME>``, ``DIR`` the current directory by default)
declares one accelerator and claims one operator, ReLU on float32; every
other hook is a stub stating its contract and returning None, which leaves
umahub's default in place. Its tests compile a model against plain TVM and run
umahub's conformance kit; its ``tox.ini`` has umahub's matrix of Python and
apache-tvm versions. With ``--device``, the accelerator has a device of its
own and a second package, ``<DIR>/<NAME>-runtime``, is its runtime: a device
simulated in Python (memory of its own, one instruction).

The texts are in :mod:`umahub.cli.scaffold_templates`. Nothing here imports TVM.
"""

from __future__ import annotations

import keyword
import re
import sys
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from string import Template

from umahub.cli import scaffold_templates as templates
from umahub.errors import UmahubError

__all__ = ["Scaffold", "plan", "write"]

#: A distribution name as ``new-plugin`` takes it: lower case, words joined by ``-`` or ``_``.
_DIST = re.compile(r"^[a-z][a-z0-9]*([-_][a-z0-9]+)*$")
#: ``umahub.plugin.Accelerator``'s rule for a name.
_ACCELERATOR = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class Scaffold:
    """What ``new-plugin`` writes: the names, and the packages' directories."""

    dist: str  # the distribution, "my-accel"
    module: str  # its Python package and plugin name, "my_accel"
    accelerator: str  # "my_accel"
    directory: Path  # the compiler plugin's package
    device: bool = False
    runtime_directory: Path | None = None  # with device: the runtime's package

    @property
    def runtime_dist(self) -> str:
        return f"{self.dist}-runtime"

    @property
    def runtime_module(self) -> str:
        return f"{self.module}_runtime"

    def names(self) -> dict[str, str]:
        """What the templates' ``$`` names stand for."""
        extra = f"    -e {{toxinidir}}/../{self.runtime_dist}\n" if self.device else ""
        return {
            "dist": self.dist,
            "module": self.module,
            "acc": self.accelerator,
            "runtime_dist": self.runtime_dist,
            "runtime_module": self.runtime_module,
            "extra_deps": extra,
        }


def _check_module(module: str, dist: str) -> None:
    """Refuse a package name Python cannot import, or one that would shadow another."""
    if not module.isidentifier() or keyword.iskeyword(module):
        raise UmahubError(
            f"new-plugin {dist}: its Python package would be {module!r}, which is not a "
            "Python name; choose a name of letters, digits and '-' that starts with a letter"
        )
    if module in sys.stdlib_module_names or find_spec(module) is not None:
        raise UmahubError(
            f"new-plugin {dist}: a module {module!r} is already importable here, and the "
            f"plugin's package would shadow it (or be shadowed); choose another name, "
            f"e.g. {dist}-accel"
        )


def plan(
    name: str, directory: str | None = None, accelerator: str | None = None, device: bool = False
) -> Scaffold:
    """Check the names and the directories; what :func:`write` will write.

    Raises:
        UmahubError: a name that is not a distribution name, a package that is
            not a Python name or shadows an importable module, an accelerator name
            ``Accelerator`` refuses, or a directory that exists and is not empty.
    """
    if not _DIST.match(name):
        raise UmahubError(
            f"new-plugin {name}: not a package name umahub can use; give lower-case letters "
            "and digits, words joined by '-', starting with a letter (e.g. my-accel)"
        )
    dist = name.replace("_", "-")
    module = dist.replace("-", "_")
    _check_module(module, dist)
    rule = (
        "an accelerator's name starts with a lower-case letter and holds only lower-case "
        "letters, digits and '_'"
    )
    if accelerator is None:
        accelerator = module.removeprefix("umahub_")
        said = f"the accelerator's name would be {accelerator!r}"
        bad, reserved = f"{said}, but {rule}", f"{said}, which is reserved for the host"
        fix = "give another with --accelerator NAME"
    else:
        said = f"--accelerator {accelerator}"
        bad, reserved = f"{said}: {rule}", f"{said}: 'host' is reserved for the host"
        fix = "choose another"
    if not _ACCELERATOR.match(accelerator):
        raise UmahubError(f"new-plugin {name}: {bad}; {fix}")
    if accelerator == "host":
        raise UmahubError(f"new-plugin {name}: {reserved}; {fix}")
    parent = Path(directory) if directory is not None else Path(".")
    if parent.exists() and not parent.is_dir():
        raise UmahubError(f"new-plugin --dir {directory}: is not a directory")
    scaffold = Scaffold(
        dist,
        module,
        accelerator,
        parent / dist,
        device,
        parent / f"{dist}-runtime" if device else None,
    )
    if device:
        _check_module(scaffold.runtime_module, scaffold.runtime_dist)
    for target in (scaffold.directory, scaffold.runtime_directory):
        if target is None:
            continue
        if target.exists() and not target.is_dir():
            raise UmahubError(f"new-plugin {name}: {target} is a file; choose another --dir")
        if target.is_dir() and any(target.iterdir()):
            raise UmahubError(
                f"new-plugin {name}: {target} exists and is not empty; choose another --dir "
                "or name, or remove it"
            )
    return scaffold


def _render(files: dict[str, str], names: dict[str, str], root: Path) -> list[Path]:
    written = []
    for path, text in files.items():
        target = root / Template(path).substitute(names)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(Template(text).substitute(names), encoding="utf-8")
        written.append(target)
    return written


def write(scaffold: Scaffold) -> list[Path]:
    """Write the package(s) :func:`plan` checked; the files written."""
    names = scaffold.names()
    files = templates.DEVICE_FILES if scaffold.device else templates.HOST_FILES
    written = _render(files, names, scaffold.directory)
    if scaffold.runtime_directory is not None:
        written += _render(templates.RUNTIME_FILES, names, scaffold.runtime_directory)
    return written


def _local(path: Path) -> str:
    """``path`` as pip takes a local project (``./my-accel``: ``my-accel`` is a name to it)."""
    text = str(path)
    return text if path.is_absolute() or text.startswith(".") else f"./{text}"


def next_steps(scaffold: Scaffold) -> str:
    """What to do with the package(s): the lines ``new-plugin`` prints after writing."""
    here = scaffold.directory
    what = f"the plugin {scaffold.module} (accelerator {scaffold.accelerator}) in {here}"
    install = f'pip install -e "{_local(here)}[test]"'
    guide = f"'Writing a plugin', {templates.DOCS}/plugins/writing.md"
    if scaffold.runtime_directory is not None:
        what = (
            f"the plugin {scaffold.module} (accelerator {scaffold.accelerator}, a device of its "
            f"own) in {here}, and its runtime {scaffold.runtime_module} in "
            f"{scaffold.runtime_directory}"
        )
        install = f'pip install -e {_local(scaffold.runtime_directory)} -e "{_local(here)}[test]"'
        guide = f"'A device of its own', {templates.DOCS}/plugins/device.md"
    return (
        f"wrote {what}\n"
        f"next: {install}\n"
        f"      umahub plugins     (lists it)\n"
        f"      cd {here} && pytest   (its tests, umahub's conformance kit among them)\n"
        f"      then make it yours: src/{scaffold.module}/__init__.py, with the guide\n"
        f"      {guide}\n"
    ).rstrip("\n")
