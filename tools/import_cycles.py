"""Find import cycles among the modules of a package, statically (by reading the sources with `ast`).

Usage, from the repository root:

    python tools/import_cycles.py                 # src/hf_specdec; exit 1 if any cycle
    python tools/import_cycles.py --deferred      # count deferred imports too (see below), to audit them
    python tools/import_cycles.py path/to/package

An edge A -> B means that importing module A runs an `import` of module B at module level: in the module's
body, in a class body or under a module-level `if`/`try`/`with`. Imports inside functions (and lambdas) and
under `if TYPE_CHECKING:` are deferred and do not count, unless `--deferred` is given. `from P import name`
is an edge to `P.name` when that is a module, else to `P` (the package's `__init__`). Only modules of the
package count; the implicit import of a module's parent packages does not (an `__init__` that re-exports its
modules would otherwise put every module on a cycle).

The same check runs between the package's subpackages (and top-level modules), each taken as one node with
every import of any of its modules (`package_graph`): no subpackage may import one that imports it back, directly
or around a circle, so the subpackages stack in layers, each importing only those below it (printed, lowest
first, when there is no cycle).

Prints every cycle found (one per strongly connected component, with the component's other members) and
exits with status 1 if there is any, 0 otherwise.
"""

from __future__ import annotations

import argparse
import ast
import itertools
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

DEFAULT_PACKAGE = Path("src") / "hf_specdec"


def module_names(package_dir: Path) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name, for its `__init__.py`)."""
    root = package_dir.name
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir).with_suffix("").parts
        if any(not part.isidentifier() for part in parts):
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join((root, *parts))] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _imports(node: ast.AST, deferred: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements that run when `node` runs (all of them with `deferred`)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) and not deferred:
            continue
        elif isinstance(child, ast.If) and _is_type_checking(child.test) and not deferred:
            for branch in child.orelse:
                yield from _imports_of_statement(branch, deferred)
        else:
            yield from _imports(child, deferred)


def _imports_of_statement(statement: ast.stmt, deferred: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(statement, ast.Import | ast.ImportFrom):
        yield statement
    else:
        yield from _imports(statement, deferred)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str | None:
    """The absolute name of a `from ... import` statement's module (relative imports resolved)."""
    if node.level == 0:
        return node.module
    parts = module.split(".") if is_package else module.split(".")[:-1]
    if node.level - 1 > len(parts):
        return None
    base = parts[: len(parts) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """`name` or its longest prefix that is a module of the package."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def import_graph(package_dir: Path, deferred: bool = False) -> dict[str, dict[str, int]]:
    """`graph[a][b]`: the line of the first import of module b by module a."""
    modules = module_names(package_dir)
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        edges: dict[str, int] = {}
        for node in _imports(tree, deferred):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [_known(alias.name, modules) for alias in node.names]
            else:
                source = _resolve(module, path.name == "__init__.py", node)
                if source is None:
                    continue
                for alias in node.names:
                    submodule = f"{source}.{alias.name}"
                    targets.append(submodule if submodule in modules else _known(source, modules))
            for target in targets:
                if target is not None and target != module:
                    edges.setdefault(target, node.lineno)
        graph[module] = edges
    return graph


def package_graph(graph: dict[str, dict[str, int]], root: str) -> dict[str, dict[str, str]]:
    """`graph` with every module replaced by its subpackage of the package `root` (`hf_specdec.generation.loop`
    -> `hf_specdec.generation`; a top-level module stays itself): an edge where any module of one imports any
    module of the other, with one such import (`"module line N"`). The root's own `__init__` is left out, and so
    are imports of it: it re-exports the public names of every layer, for users (and the commands that take
    names from it, as users do)."""
    result: dict[str, dict[str, str]] = {}
    for module, edges in graph.items():
        if module == root:
            continue
        source = _subpackage(module, root)
        targets = result.setdefault(source, {})
        for target, line in edges.items():
            if target != root and (package := _subpackage(target, root)) != source:
                targets.setdefault(package, f"{module} line {line}")
    return result


def _subpackage(module: str, root: str) -> str:
    return ".".join(module.split(".")[: len(root.split(".")) + 1])


def layers(graph: Mapping[str, Mapping[str, object]]) -> list[list[str]]:
    """The nodes of an acyclic `graph` by layer, lowest first: each imports only nodes of layers below it."""
    level: dict[str, int] = {}

    def depth(node: str) -> int:
        if node not in level:
            level[node] = 1 + max((depth(target) for target in graph.get(node, {})), default=-1)
        return level[node]

    for node in graph:
        depth(node)
    return [sorted(n for n in level if level[n] == k) for k in range(max(level.values(), default=-1) + 1)]


def strongly_connected(graph: Mapping[str, Mapping[str, object]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module, each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, {})):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def shortest_cycle(graph: Mapping[str, Mapping[str, object]], component: list[str]) -> list[str]:
    """A shortest cycle through the component's first module, as a list of modules ending where it starts."""
    members = set(component)
    start = component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node]):
                if target not in members:
                    continue
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if target not in previous:
                    previous[target] = node
                    following.append(target)
        frontier = following
    raise AssertionError("a strongly connected component always has a cycle")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", nargs="?", type=Path, default=DEFAULT_PACKAGE, help="the package's folder")
    parser.add_argument(
        "--deferred", action="store_true", help="count imports inside functions and under TYPE_CHECKING too"
    )
    args = parser.parse_args(argv)
    if not (args.package / "__init__.py").is_file():
        parser.error(f"{args.package} is not a package folder (no __init__.py)")
    graph = import_graph(args.package, deferred=args.deferred)
    kind = "imports (deferred ones included)" if args.deferred else "module-level imports"
    modules = report(graph, "modules", kind)
    packages = package_graph(graph, args.package.name)
    subpackages = report(packages, "subpackages", kind)
    if not subpackages:
        for number, layer in enumerate(layers(packages)):
            print(f"layer {number}: {', '.join(name.rsplit('.', 1)[1] for name in layer)}")
    return 1 if modules or subpackages else 0


def report(graph: Mapping[str, Mapping[str, int | str]], nodes: str, kind: str) -> int:
    """Print the cycles of `graph` (whose nodes are `nodes`); the number of cycles."""
    components = strongly_connected(graph)
    for component in components:
        cycle = shortest_cycle(graph, component)
        steps = " -> ".join(f"{a} ({_where(graph[a][b])})" for a, b in itertools.pairwise(cycle))
        print(f"cycle: {steps} -> {cycle[-1]}")
        others = [m for m in component if m not in cycle]
        if others:
            print(f"  also on cycles with them: {', '.join(others)}")
    if components:
        print(f"{len(components)} import cycle(s) among {len(graph)} {nodes} ({kind}).")
        return len(components)
    print(f"no import cycles among {len(graph)} {nodes} ({kind}).")
    return 0


def _where(edge: int | str) -> str:
    return f"line {edge}" if isinstance(edge, int) else edge


if __name__ == "__main__":
    raise SystemExit(main())
