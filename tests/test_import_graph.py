"""The product code's import graph (#96): no import circles, counting the imports inside functions too
(a function-level import hides a circle from Python until the function runs, not from the design), and
an import inside a function only where it keeps a heavy or optional dependency off the importing
module's load, or where a `# deferred: <why>` comment on its line or the line above says why.

Product code: every .py file under the repository root outside tests/, research/ (the probes and their
own tests), hidden folders (.venv, .git) and the output/build folders below.

The tests' own graph: no module under tests/ imports a test module (`tests/test_*.py`) other than itself;
what two test modules share lives in a helper module (tests/helpers.py, tests/synthetic_runs.py, ...)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOT_PRODUCT = {"tests", "research", "results", "outputs", "multirun", "build", "dist", "checkpoints"}

# Packages (and the submodules of one, dotted) whose import costs a tenth of a second or more on the
# 2-core CPU box (`python -X importtime`: torch 1.3 s, and after it torch._dynamo 1.6 s and
# torch._inductor 1.5 s (torch.compile's machinery), accelerate 1.5 s, datasets 1.0 s, transformers
# 0.8 s with torch, matplotlib.pyplot 0.7 s, wandb 0.6 s, nltk 0.4 s, pandas 0.3 s, gguf 0.2 s, hydra's
# compose 0.14 s, safetensors.torch 1.2 s as it loads torch, huggingface_hub's download 0.06 s plus its
# HTTP stack), or that are optional (absent from a plain install): flash_attn, kvpress, vllm, triton,
# ifbench, lm_eval. Not on it: omegaconf (0.07 s), tqdm (0.03 s), torch.nn.attention.flex_attention
# (8 ms after torch) and the standard library: import those at the top of the module.
HEAVY = {
    "accelerate",
    "datasets",
    "flash_attn",
    "gguf",
    "huggingface_hub",
    "hydra",
    "ifbench",
    "kvpress",
    "lm_eval",
    "matplotlib",
    "matplotlib.pyplot",
    "nltk",
    "pandas",
    "pyarrow",
    "safetensors",
    "submitit",
    "torch",
    "torch._dynamo",
    "torch._inductor",
    "transformers",
    "triton",
    "vllm",
    "wandb",
}


def heavy(name: str) -> set[str]:
    """The entries of HEAVY that importing `name` loads: `torch._dynamo.config` -> torch, torch._dynamo."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & HEAVY


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    line: int
    targets: tuple[str, ...]  # the modules it names, dotted (first-party resolved to a file's module)
    deferred: bool  # inside a function
    reason: bool  # a `# deferred:` comment on its line, the line above, or atop its run of imports


def product_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every product module."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(p.startswith(".") or p in NOT_PRODUCT or p.endswith(".egg-info") for p in rel.parts[:-1]):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _names(node: ast.Import | ast.ImportFrom, module: str, path: Path, mods: dict[str, Path]) -> list[str]:
    """The modules an import statement loads: `from a import b` names `a.b` when that is a module."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:  # relative: from the importing module's package
        pkg = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        pkg = pkg[: len(pkg) - (node.level - 1)]
        base = ".".join(pkg + ([node.module] if node.module else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]


def _first_party(name: str, mods: dict[str, Path]) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(module: str, path: Path, mods: dict[str, Path]) -> list[Import]:
    """Every import statement the module runs (not those under `if TYPE_CHECKING:`, which never run)."""
    lines = path.read_text().splitlines()
    comment = lambda i: "# deferred:" in lines[i - 1] if 0 < i <= len(lines) else False  # noqa: E731
    out: list[Import] = []

    def visit(body: list[ast.stmt], in_function: bool) -> None:
        reason = False  # a run of consecutive imports shares the comment atop it
        for stmt in body:
            if isinstance(stmt, ast.Import | ast.ImportFrom):
                reason = comment(stmt.lineno) or comment(stmt.lineno - 1) or reason
                found = (_first_party(n, mods) or n for n in _names(stmt, module, path, mods))
                names = tuple(dict.fromkeys(found))
                out.append(Import(module, stmt.lineno, names, in_function, reason))
                continue
            reason = False
            if isinstance(stmt, ast.If) and _is_type_checking(stmt.test):
                visit(stmt.orelse, in_function)
                continue
            func = isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef)
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                for child in getattr(stmt, field, []):
                    if isinstance(child, ast.stmt):
                        visit([child], in_function or func)
                    elif hasattr(child, "body"):  # except handlers, match cases
                        visit(child.body, in_function or func)

    visit(ast.parse(path.read_text()).body, False)
    return out


def graph(mods: dict[str, Path]) -> tuple[dict[str, set[str]], list[Import]]:
    """First-party module -> the first-party modules it imports (top-level and in functions)."""
    edges: dict[str, set[str]] = {m: set() for m in mods}
    every: list[Import] = []
    for module, path in mods.items():
        for imp in imports_of(module, path, mods):
            every.append(imp)
            edges[module] |= {t for t in imp.targets if t in mods and t != module}
    return edges, every


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One circle (a path back to its start) per strongly connected component of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm, iterative over a work list of (node, children)
        work = [(v, iter(sorted(edges[v])))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    components.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return [_circle(comp, edges) for comp in components]


def _circle(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    """A shortest path from the component's first module back to itself (breadth-first)."""
    start, members = component[0], set(component)
    came: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came[path[-1]])
                    return [start, *reversed(path[:-1]), start] if v != start else [start, start]
                if w not in came:
                    came[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no circle in {component}")


def heavy_on_load(module: str, edges_top: dict[str, set[str]], external: dict[str, set[str]]) -> set[str]:
    """The heavy packages loading `module` imports: through its top-level imports, transitively, and the
    `__init__` of every package above each module loaded."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        parents = [".".join(m.split(".")[:i]) for i in range(1, m.count(".") + 1)]
        todo += [p for p in parents if p in edges_top] + sorted(edges_top[m])
    return {name for m in seen for name in external[m]}


def unjustified(mods: dict[str, Path], root: Path = ROOT) -> list[str]:
    """The function-level imports that neither name a heavy package, nor load one the importing module does
    not already load, nor carry a `# deferred:` comment."""
    _, every = graph(mods)
    edges_top: dict[str, set[str]] = {m: set() for m in mods}
    external: dict[str, set[str]] = {m: set() for m in mods}
    for imp in every:
        if not imp.deferred:
            edges_top[imp.module] |= {t for t in imp.targets if t in mods and t != imp.module}
            external[imp.module] |= {h for t in imp.targets if t not in mods for h in heavy(t)}
    out = []
    for imp in every:
        if not imp.deferred or imp.reason:
            continue
        own = heavy_on_load(imp.module, edges_top, external)
        spared = set()
        for t in imp.targets:
            spared |= (heavy_on_load(t, edges_top, external) if t in mods else heavy(t)) - own
        if not spared:
            rel = mods[imp.module].relative_to(root)
            out.append(f"{rel}:{imp.line} imports {', '.join(imp.targets)} in a function")
    return out


def imports_of_test_modules(root: Path = ROOT) -> list[str]:
    """The imports (top-level or in a function) by which a module under tests/ loads a test module
    (`test_*.py`) other than itself: importing one runs its module-level setup and ties the two files'
    edits together, so what test modules share belongs in a helper module."""
    folder = root / "tests"
    mods = {
        ".".join(("tests", *p.relative_to(folder).with_suffix("").parts)).removesuffix(".__init__"): p
        for p in sorted(folder.rglob("*.py"))
    }
    out = []
    for module, path in mods.items():
        for imp in imports_of(module, path, mods):
            bad = [t for t in imp.targets if t in mods and t != module and mods[t].name.startswith("test_")]
            if bad:
                out.append(f"{path.relative_to(root)}:{imp.line} imports {', '.join(bad)}")
    return out


def test_product_modules_found() -> None:
    mods = product_files()
    for name in ("run", "core.engine", "analysis.paper", "benchmarks.block_cost", "training.longspec.train"):
        assert name in mods
    assert not [m for m in mods if m.split(".")[0] in NOT_PRODUCT]


def test_no_import_circles() -> None:
    edges, _ = graph(product_files())
    found = cycles(edges)
    assert not found, "import circles (top-level and function-level imports):\n" + "\n".join(
        " -> ".join(c) for c in found
    )


def test_function_level_imports_spare_a_heavy_dependency() -> None:
    bad = unjustified(product_files())
    assert not bad, (
        "function-level imports that spare the module no heavy dependency: import them at the top, or say "
        "why not in a `# deferred: <why>` comment on the line or the line above:\n" + "\n".join(bad)
    )


def test_checker_sees_circles_and_needless_deferrals(tmp_path: Path) -> None:
    """The checks fail where they should: a circle through a function-level import, a standard-library
    import inside a function; and pass a deferred heavy import and a commented one."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("import json\n\nfrom pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    import pkg.a\n    import os\n")
    (pkg / "c.py").write_text("def g():\n    import torch\n    # deferred: a test's reason\n    import sys\n")
    (pkg / "d.py").write_text("def h():\n    from pkg import e\n")
    (pkg / "e.py").write_text("import matplotlib.pyplot\n")
    mods = product_files(tmp_path)
    edges, _ = graph(mods)
    assert cycles(edges) == [["pkg.a", "pkg.b", "pkg.a"]]
    assert unjustified(mods, tmp_path) == [
        f"{Path('pkg/b.py')}:2 imports pkg.a in a function",
        f"{Path('pkg/b.py')}:3 imports os in a function",
    ]


def test_type_checking_imports_do_not_count(tmp_path: Path) -> None:
    """An import under `if TYPE_CHECKING:` (`typing.TYPE_CHECKING` too) never runs: it makes no edge, so
    no circle, and is no function-level import; its `else:` branch runs and counts. The same import
    outside the block makes the circle."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text(
        "import typing\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from pkg import a\n"
        "if typing.TYPE_CHECKING:\n    import pkg.a\nelse:\n    import pkg.c\n"
        "def f():\n    if TYPE_CHECKING:\n        import pkg.a\n"
    )
    (pkg / "c.py").write_text("")
    mods = product_files(tmp_path)
    edges, every = graph(mods)
    assert edges["pkg.b"] == {"pkg.c"} and cycles(edges) == []
    assert [imp.line for imp in every if imp.module == "pkg.b"] == [1, 2, 9]
    assert unjustified(mods, tmp_path) == []
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\n\nfrom pkg import a\n")
    edges, _ = graph(product_files(tmp_path))
    assert cycles(edges) == [["pkg.a", "pkg.b", "pkg.a"]]


def test_no_test_module_imports_another() -> None:
    bad = imports_of_test_modules()
    assert not bad, (
        "test modules imported by other modules under tests/: move what they share into a helper module "
        "(tests/helpers.py or a themed one such as tests/synthetic_runs.py):\n" + "\n".join(bad)
    )


def test_checker_sees_a_test_module_imported(tmp_path: Path) -> None:
    """Every form of import of another test module is found, in a function too; a helper module and a
    test module's own name are not."""
    tests = tmp_path / "tests"
    (tests / "sub").mkdir(parents=True)
    (tests / "__init__.py").write_text("")
    (tests / "helpers.py").write_text("X = 1\n")
    (tests / "test_b.py").write_text("Y = 2\n")
    (tests / "test_a.py").write_text(
        "from tests.helpers import X\nfrom tests.test_b import Y\n"
        "def f():\n    import tests.test_b\n    from tests import test_b\n    from tests import test_a\n"
    )
    (tests / "sub" / "cases.py").write_text("from tests.test_b import Y\n")
    assert imports_of_test_modules(tmp_path) == [
        f"{Path('tests/sub/cases.py')}:1 imports tests.test_b",
        f"{Path('tests/test_a.py')}:2 imports tests.test_b",
        f"{Path('tests/test_a.py')}:4 imports tests.test_b",
        f"{Path('tests/test_a.py')}:5 imports tests.test_b",
    ]
