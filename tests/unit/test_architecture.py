"""The architecture's rules, checked on every change (the contracts are in pyproject.toml).

- Imports only go down: benchmarks, quantize_serve.cli, flows, tasks, then the package's concepts from the
  release down to core (import-linter's layers contract): the benchmarks import the product, never the
  reverse.
- Nothing below tasks imports Prefect, but for the one import named in the contract.
- The boots' tasks are one room per job (the boot lifecycle, the capacity rows, compile ahead, the base
  reference, the serving profile) and import none of each other (an independence contract).
- No import loop among the project's modules, and no import of a project module inside a function
  (such an import hides a loop instead of removing it), but for those named in ALLOWED_LATE.
- A benchmark borrows from another only through the shared modules (SHARED), never from another script; a
  module that is no script and that one script alone imports is that script's own part.
- One definition per constant in the product: a module-level constant with the same name and value is
  defined once.
- No module over MAX_LINES lines, benchmarks included.
"""

from __future__ import annotations

import ast
import functools
import gc
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from tests.conftest import ROOT

PRODUCT = ("quantize_serve", "flows", "tasks")
PACKAGES = (*PRODUCT, "benchmarks")
# `quantize-serve run` and `rollback` import their flow (and so Prefect, ~3 s) only when they run one:
# `validate`, `plan`, `releases` and a refused rollback answer in a fraction of a second. The CLI is
# the top layer, so these imports go down. A benchmark imports a flow (Prefect) where it runs it, after
# it has set the Prefect home and the Hub it runs against: benchmarks are the layer above, so these go down.
# Likewise the accuracy gate's lm-eval model (gates/accuracy/scoring.py subclasses lm-eval's, which loads
# torch): `validate` and `plan` read the gate's settings without it.
ALLOWED_LATE = {
    ("quantize_serve.cli", "flows.pipeline"),
    ("quantize_serve.cli", "flows.rollback"),
    ("quantize_serve.gates.accuracy.run", "quantize_serve.gates.accuracy.scoring"),
}
# What a benchmark imports inside a function: the flows (Prefect, ~2 s) only where a run needs them, and the
# quantization stage in harness.py, whose importers call driver_env() before the product's imports
LATE_TARGETS_OF_BENCHMARKS = {
    "flows.pipeline",
    "flows.rollback",
    "quantize_serve.quantize.run",
    "quantize_serve.validate.preflight",
}
SHARED = {
    "benchmarks",
    "benchmarks.evidence",
    "benchmarks.harness",
    "benchmarks.manual",
    "benchmarks.production_stack",
}
# 600 lines as the code was written before `ruff format`; the formatter's layout (one argument a line
# once a call wraps) adds about a fifth to the same code (36,800 -> 45,450 lines), so 700.
MAX_LINES = 700


def modules(packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    found = {}
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


@functools.cache
def parse(path: Path) -> ast.Module:
    """ast.parse with the garbage collector held off (each file once). On CPython 3.11.7 (this
    project's), a finalizer that the collector runs in the middle of the AST's construction (seen: an
    lm-eval progress bar left open by an earlier test, printing as it was collected) fails the parse
    with "SystemError: AST constructor recursion depth mismatch" (CPython gh-106905)."""
    gc.disable()
    try:
        return ast.parse(path.read_text())
    finally:
        gc.enable()


def project_imports(path: Path, name: str, known: dict[str, Path]) -> list[tuple[str, bool]]:
    """(imported project module, imported inside a function) for every import in the file."""
    tree = parse(path)
    late = {
        id(n)
        for f in ast.walk(tree)
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
        for n in ast.walk(f)
        if isinstance(n, (ast.Import, ast.ImportFrom))
    }
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        else:
            continue
        for target in targets:
            if target in known and target != name:
                out.append((target, id(node) in late))
                break
    return out


def late_allowed(name: str, target: str) -> bool:
    if (name, target) in ALLOWED_LATE:
        return True
    return name.startswith("benchmarks.") and target in LATE_TARGETS_OF_BENCHMARKS


def test_import_layers_and_prefect_contracts_are_kept() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "5 kept, 0 broken" in done.stdout


def test_no_import_loop_and_no_project_import_inside_a_function() -> None:
    known = modules()
    graph: dict[str, set[str]] = {}
    late = []
    for name, path in known.items():
        edges = project_imports(path, name, known)
        graph[name] = {target for target, _ in edges}
        late += [(name, target) for target, inside in edges if inside and not late_allowed(name, target)]
    assert not late, f"imports of project modules inside functions: {late}"

    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    loops = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                loops.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not loops, f"import loops: {loops}"


def test_a_benchmark_borrows_only_from_the_shared_modules() -> None:
    """What the scripts share lives in benchmarks/harness.py (evidence.py: what they read from a vLLM log
    and write as a result; manual.py: the release's steps by hand; production_stack.py: the local Hub and
    deployment the release drivers run on); a
    script that imported another would make it a library again (h200.py once served six others). A module
    that is no script (no ``__main__``) and that one script alone imports is that script's own part
    (release_time_manual.py: h200_release_time.py's manual run)."""
    known = modules()
    imports = {
        (name, target)
        for name, path in known.items()
        if name.startswith("benchmarks.")
        for target, _ in project_imports(path, name, known)
        if target.startswith("benchmarks") and target not in SHARED
    }
    importers = defaultdict(set)
    for name, target in imports:
        importers[target].add(name)
    borrowed = {
        (name, target)
        for name, target in imports
        if "__main__" in known[target].read_text() or len(importers[target]) > 1
    }
    assert not borrowed, (
        f"benchmarks importing other benchmark scripts (move what they share to harness.py): {borrowed}"
    )


def test_each_constant_is_defined_once() -> None:
    definitions = defaultdict(list)
    for name, path in modules(PRODUCT).items():
        for node in parse(path).body:
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                constant = node.targets[0].id
                if constant.isupper() and len(constant) > 1:
                    definitions[(constant, ast.dump(node.value))].append(name)
    twice = {key[0]: where for key, where in definitions.items() if len(where) > 1}
    assert not twice, f"constants defined in several modules: {twice}"


def test_no_module_is_over_the_size_limit() -> None:
    long = {
        name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"
