#!/usr/bin/env python3
"""Import cycles in aiptrain, module by module (grimp's graph, imports inside functions and
under TYPE_CHECKING included): each strongly connected group of two or more modules, and each
pair that imports both ways. `.importlinter`'s acyclic_siblings contract (`make lint`) keeps
siblings acyclic; this also counts a package and its own modules (issue 36 measured both).
Exit status 1 when there is a cycle."""

from __future__ import annotations

import sys

import grimp


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of two or more modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in edges[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(10_000)
    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


def main() -> int:
    graph = grimp.build_graph("aiptrain", cache_dir=None)
    edges = {module: set(graph.find_modules_directly_imported_by(module)) for module in graph.modules}
    groups = cycles(edges)
    pairs = sorted({tuple(sorted((a, b))) for a in edges for b in edges[a] if a in edges.get(b, ())})
    print(f"{len(groups)} import cycle(s), {len(pairs)} pair(s) importing each other")
    for group in groups:
        print("  cycle:", " ".join(group))
    for a, b in pairs:
        print(f"  pair: {a} <-> {b}")
    return 1 if groups else 0


if __name__ == "__main__":
    sys.exit(main())
