"""Count import cycles among SluiceMQ's modules, type-only and function-local imports included.

    python tools/import_cycles.py            # prints each cycle (a strongly connected component)
    python tools/import_cycles.py --layers   # also checks the layering rules below

Exit status 1 when there is a cycle (or a layer rule broken with --layers). A cycle is a set of
modules that reach each other through imports, however they are imported: ``if TYPE_CHECKING``
imports count, because a cycle of types is a cycle of concepts a reader must hold at once.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "sluicemq"

# Lower layers never import upper ones: a module of a layer may import its own layer and the
# layers listed for it (plus config, errors and the package root, which every layer may use).
COMMON = {"buffers", "config", "errors", "tls", ""}
LAYERS: dict[str, set[str]] = {
    "protocol": set(),
    "streaming": {"protocol"},
    "storage": set(),
    "core": {"protocol", "storage", "streaming"},
    "transport": {"protocol", "core"},
    "client": {"protocol", "streaming"},
    "admin": {"protocol", "storage", "core", "client", "standby"},
    "spark": {"client", "protocol", "streaming"},
    "app": {"protocol", "storage", "core", "transport", "admin", "standby"},
    "standby": {"storage"},
    "cli": {"client", "protocol", "streaming", "storage", "core", "admin", "app", "standby",
            "spark"},
}


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        rel = path.relative_to(SRC).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every sluicemq module ``name`` imports, wherever the import statement is."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # ``from pkg import sub`` depends on the submodule; ``from mod import name`` on mod
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name and t.startswith(PACKAGE):
                found.add(t)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            node, it = work[-1]
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        m = stack.pop()
                        on.discard(m)
                        comp.append(m)
                        if m == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_breaks(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for mod, deps in sorted(graph.items()):
        own = layer(mod)
        allowed = LAYERS.get(own)
        if allowed is None:
            continue
        for dep in sorted(deps):
            other = layer(dep)
            if other not in (own, *allowed, *COMMON):
                out.append(f"{mod} imports {dep} ({own} may not import {other})")
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", action="store_true", help="check the layering rules too")
    opts = ap.parse_args(argv)
    g = graph()
    found = cycles(g)
    for comp in found:
        print(f"cycle of {len(comp)}: {' '.join(m.removeprefix(PACKAGE + '.') for m in comp)}")
    breaks = layer_breaks(g) if opts.layers else []
    for b in breaks:
        print("layer:", b)
    print(f"{len(g)} modules, {len(found)} import cycles"
          + (f", {len(breaks)} layer breaks" if opts.layers else ""))
    return 1 if found or breaks else 0


if __name__ == "__main__":
    sys.exit(main())
