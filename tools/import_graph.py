"""The package's import graph: its circles, the imports that run from a lower layer to a higher
one, and the files ``Elmo.load``'s first argument passes through.

    python tools/import_graph.py            # static graph (ast: every import, function-level too)
    python tools/import_graph.py --trace FOLDER ...   # also follow Elmo.load(FOLDER) through the calls
    python tools/import_graph.py --check    # exit 1 on a circle or more than one upward import (CI)

Layers, lowest first (a module's layer is that of the longest prefix listed in LAYERS):
core utilities < model < data < training engine < formats < hub < resolver < embedding <
training application < entry points.  ``elmo_jax`` itself (``__init__``) is core: everything may
import ``elmo_jax.__version__``; its lazy ``Elmo`` / ``read_embeddings`` is the one import that
runs up.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from pathlib import Path

PACKAGE = "elmo_jax"
MAX_UPWARD = 1  # elmo_jax's lazy Elmo / read_embeddings
LAYERS = (
    (
        "core",
        (
            "elmo_jax",
            "elmo_jax._moved",
            "elmo_jax.version",
            "elmo_jax.errors",
            "elmo_jax.atomic",
            "elmo_jax.textio",
            "elmo_jax.storage_echoes",
            "elmo_jax.chars",
            "elmo_jax.config",
            "elmo_jax.lookahead",
            "elmo_jax.plots",
            "elmo_jax.embedding.devices",
            "elmo_jax.train.distributed",
            "elmo_jax.train.stop",
        ),
    ),
    ("model", ("elmo_jax.model",)),
    ("data", ("elmo_jax.data",)),
    ("train engine", ("elmo_jax.train",)),
    # the modules' old paths (before the reshape) first, then the new ones
    (
        "formats",
        (
            "elmo_jax.weights",
            "elmo_jax.torch_pickle",
            "elmo_jax.manylangs",
            "elmo_jax.workdir_model",
            "elmo_jax.train.export",
            "elmo_jax.formats",
        ),
    ),
    ("hub", ("elmo_jax.hub",)),
    # elmo_jax.hub itself (its __init__) keeps the old module's names, resolve_model among them
    ("resolver", ("elmo_jax.resolve", "elmo_jax.hub.__init__")),
    (
        "embedding",
        (
            "elmo_jax.embedder",
            "elmo_jax.embed_file",
            "elmo_jax.embed_input",
            "elmo_jax.embed_layouts",
            "elmo_jax.embed_state",
            "elmo_jax.embeddings_reader",
            "elmo_jax.embedding",
        ),
    ),
    (
        "train app",
        (
            "elmo_jax.train.loop",
            "elmo_jax.train.init_from",
            "elmo_jax.train.report",
            "elmo_jax.train.compile_check",
            "elmo_jax.probes",
        ),
    ),
    ("entry points", ("elmo_jax.cli", "elmo_jax.nnx", "elmo_jax.finetune", "elmo_jax.run_plots")),
)


_PACKAGES: set[str] = set()  # modules that are a package's __init__


def layer_of(module: str) -> int:
    best, level = -1, None
    name = module + ".__init__" if module in _PACKAGES else module
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (name == p or (module.startswith(p + ".") or module == p) and not p.endswith(".__init__")) and len(
                p
            ) > best:
                best, level = len(p), i
    if level is None:
        raise SystemExit(f"{module}: in no layer; add it to LAYERS")
    return level


def modules(root: Path) -> dict[str, Path]:
    out = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
            _PACKAGES.add(".".join(parts))
        out[".".join(parts)] = path
    return out


def imports(path: Path, name: str, known: dict) -> list[tuple[str, int, bool]]:
    """(imported module, line, whether inside a function) for each intra-package import."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_pkg = path.name == "__init__.py"
    found = []

    def visit(node, in_def):
        for child in ast.iter_child_nodes(node):
            deeper = in_def or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for a in child.names:
                    if a.name.split(".")[0] == PACKAGE:
                        found.append((_known_prefix(a.name, known), child.lineno, in_def))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                    pkg = pkg[: len(pkg) - (child.level - 1)]
                    base = ".".join(pkg + ([base] if base else []))
                if base.split(".")[0] != PACKAGE:
                    continue
                for a in child.names:
                    sub = f"{base}.{a.name}"
                    found.append((sub if sub in known else _known_prefix(base, known), child.lineno, in_def))
            visit(child, deeper)

    visit(tree, False)
    return found


def _known_prefix(name: str, known: dict) -> str:
    while name not in known and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def graph(root: Path) -> dict[str, list[tuple[str, int, bool]]]:
    known = modules(root)
    return {m: [e for e in imports(p, m, known) if e[0] != m] for m, p in known.items()}


def circles(edges: dict) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w, _, _ in edges.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in edges:
        if v not in index:
            strong(v)
    return out


def upward(edges: dict) -> list[tuple[str, str, int, bool]]:
    ups = {}
    for m, es in edges.items():
        for t, line, lazy in es:
            if layer_of(t) > layer_of(m):
                ups.setdefault((m, t), (line, lazy))
    return [(m, t, line, lazy) for (m, t), (line, lazy) in sorted(ups.items())]


def trace_load(root: Path, spec: str) -> tuple[list[str], int, int, dict]:
    """Where ``Elmo.load(spec)``'s argument goes: the package's functions called with ``spec``
    among their arguments (or a path that such a call returned), followed through calls and
    returns.  Returns the files in the order execution is in them while it carries the
    argument (repeats collapsed), how many of those steps go from a lower layer to a higher
    one (a return to a caller above counts: it is where the argument goes back up), and the
    number of entries per file; and how many calls hand it from a lower layer to a higher one."""
    import importlib

    sys.path.insert(0, str(root))
    elmo_jax = importlib.import_module(PACKAGE)
    known = modules(root)
    by_file = {str(p.resolve()): m for m, p in known.items()}
    carried = {os.fspath(spec)}
    seq: list[str] = []
    handed_up = [0]  # calls that pass it from a lower layer's function to a higher one's
    frames: list = []  # per frame: its module if it carries the argument, else None

    def carries(frame) -> bool:
        code = frame.f_code
        for n in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]:
            v = frame.f_locals.get(n)
            if isinstance(v, (str, os.PathLike)) and os.fspath(v) in carried:
                return True
        return False

    def now_in(mod) -> None:
        if mod is not None and (not seq or seq[-1] != mod):
            seq.append(mod)

    def prof(frame, event, arg):
        if event == "call":
            mod = by_file.get(str(Path(frame.f_code.co_filename).resolve()))
            hit = mod is not None and carries(frame)
            if hit:
                caller = next((m for m in reversed(frames) if m is not None), None)
                handed_up[0] += caller is not None and layer_of(mod) > layer_of(caller)
                now_in(mod)
            frames.append(mod if hit else None)
        elif event == "return" and frames:
            was = frames.pop()
            if was is not None:
                for v in arg if isinstance(arg, tuple) else (arg,):
                    if isinstance(v, (str, os.PathLike)):
                        carried.add(os.fspath(v))
                now_in(next((m for m in reversed(frames) if m is not None), None))

    sys.setprofile(prof)
    try:
        elmo_jax.Elmo.load(spec)
    finally:
        sys.setprofile(None)
    ups = sum(layer_of(b) > layer_of(a) for a, b in zip(seq, seq[1:]))
    visits: dict[str, int] = {}
    for m in seq:
        visits[m] = visits.get(m, 0) + 1
    return seq, ups, handed_up[0], visits


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[1]))
    ap.add_argument("--trace", nargs="*", metavar="MODEL", help="folders to load with Elmo.load and follow")
    ap.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if the graph has a circle or more than MAX_UPWARD imports that run up a layer",
    )
    args = ap.parse_args(argv)
    root = Path(args.root)
    edges = graph(root)
    n_edges = sum(len({t for t, _, _ in es}) for es in edges.values())
    print(f"modules: {len(edges)}, intra-package import edges: {n_edges}")
    lines = {m: sum(1 for _ in p.open(encoding="utf-8")) for m, p in modules(root).items()}
    big = sorted(((n, m) for m, n in lines.items() if n > 500), reverse=True)
    print(f"modules over 500 lines: {len(big)}" + "".join(f"\n  {m}: {n}" for n, m in big))
    cs = circles(edges)
    print(f"circles (strongly connected components): {len(cs)}")
    for c in cs:
        print(f"  {len(c)} modules: {', '.join(c)}")
    ups = upward(edges)
    print(f"imports from a lower layer to a higher one: {len(ups)}")
    for m, t, line, lazy in ups:
        print(
            f"  {m}:{line} -> {t} ({LAYERS[layer_of(m)][0]} -> {LAYERS[layer_of(t)][0]}"
            f"{', in a function' if lazy else ''})"
        )
    if args.check and (cs or len(ups) > MAX_UPWARD):
        raise SystemExit(
            f"import graph: {len(cs)} circle(s), {len(ups)} upward import(s) (at most {MAX_UPWARD}); "
            f"import from a lower layer only, or move the code (LAYERS in {Path(__file__).name})"
        )
    for spec in args.trace or ():
        seq, n_up, n_handed, visits = trace_load(root, spec)
        print(
            f"Elmo.load({spec!r}): through {len(visits)} files, {len(seq)} entries, {n_up} steps back up a layer "
            f"(returns included), {n_handed} calls hand it up; "
            f"entries per file: " + ", ".join(f"{m} {n}" for m, n in sorted(visits.items(), key=lambda kv: -kv[1]))
        )
        print("  " + " > ".join(m.removeprefix(PACKAGE + ".") for m in seq))


if __name__ == "__main__":
    main()
