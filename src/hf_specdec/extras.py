"""Optional dependencies, checked before long work starts.

The package's extras (`[project.optional-dependencies]` of `pyproject.toml`) install what some features need:
`[models]` gguf (converting the zoo's models), `[bench]` matplotlib and gguf (`hf-specdec bench`), `[plot]`
matplotlib (plots alone), `[train]` datasets and peft (training heads, heads with base adapters). A feature calls
[`require`] first, before any model loads or any data is read, so that a missing package is named at once, with the
command that installs it, instead of failing on an import deep inside hours of work.
"""

from __future__ import annotations

import importlib.util

EXTRAS: dict[str, tuple[str, ...]] = {
    "models": ("gguf",),
    "bench": ("matplotlib", "gguf"),
    "plot": ("matplotlib",),
    "train": ("datasets", "peft"),
}
"""The modules (as imported) each extra provides that the library checks for."""


class MissingExtraError(ModuleNotFoundError):
    """An optional dependency is not installed; the message names it and the extra that installs it."""


def install_command(extra: str) -> str:
    """The command that installs `extra` into an editable install of the library, e.g. `pip install -e ".[train]"`."""
    return f'pip install -e ".[{extra}]"'


def is_installed(module: str) -> bool:
    """Whether `module` (a top-level name, e.g. `"datasets"`) can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # loaded already, without a spec: present
        return True
    except ImportError:
        return False


def missing(*modules: str) -> list[str]:
    """The modules among `modules` that cannot be imported, in the order given."""
    return [module for module in modules if not is_installed(module)]


def require(extra: str, *modules: str, purpose: str) -> None:
    """Raise a [`MissingExtraError`] naming the missing modules and the extra that installs them.

    Args:
        extra (`str`): the extra that installs the modules, a key of `EXTRAS`, e.g. `"train"`.
        *modules (`str`): the modules to check, as imported, e.g. `"datasets", "peft"`; none: every module of
            `EXTRAS[extra]`.
        purpose (`str`): what needs them, to start the message, e.g. `"Training heads"`.

    Raises:
        `ValueError`: for an extra the package does not have, or a module it does not install.
        `MissingExtraError`: when one of the modules is not installed.
    """
    if extra not in EXTRAS:
        raise ValueError(f"Unknown extra {extra!r}; the package's extras are {', '.join(EXTRAS)}.")
    if unknown := [module for module in modules if module not in EXTRAS[extra]]:
        raise ValueError(f"The [{extra}] extra does not install {', '.join(unknown)}: it installs {EXTRAS[extra]}.")
    absent = missing(*(modules or EXTRAS[extra]))
    if absent:
        names = " and ".join(absent)
        verb = "is" if len(absent) == 1 else "are"
        raise MissingExtraError(
            f"{purpose} needs {names}, which {verb} not installed: install the [{extra}] extra with "
            f"{install_command(extra)}",
            name=absent[0],
        )
