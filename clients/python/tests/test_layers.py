"""The package's layers (README, "Layers"), held by reading its import graph: every module
imports only from its own layer or below, nothing imports in a cycle, no import hides inside a
function, nothing loads an adapter by name, and importing the package loads no framework."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import idempotency_ledger

PACKAGE = Path(idempotency_ledger.__file__).resolve().parent
NAME = "idempotency_ledger"

#: The layers, bottom first: a module may import from its own layer and the ones below.
LAYERS: list[tuple[str, set[str]]] = [
    ("model and errors", {"model", "errors"}),
    ("codec and keys", {"codec", "keys", "_jcs"}),
    ("the ledger", {"_proto", "_proto.ledger_pb2", "_proto.ledger_pb2_grpc", "_wire", "_trace",
                    "_confirm", "_failures", "_core", "_run_once", "_calls", "_blocking", "_aio",
                    "client"}),
    ("tools", {"_frameworks", "_views", "_registry", "_prepare", "tools", "reconciler"}),
    ("adapters", {"pydantic_ai", "openai_agents", "langchain", "mcp"}),
]
#: The package's face imports the layers it exports (never an adapter); the test server
#: imports nothing of the package.
FACADE = {"__init__": 3, "testing": -1}


def layer_of(module: str) -> int:
    for index, (_, modules) in enumerate(LAYERS):
        if module in modules:
            return index
    if module in FACADE:
        return FACADE[module]
    raise AssertionError(f"{module} is in no layer: add it to LAYERS and to the README")


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE).with_suffix("")
        name = ".".join(relative.parts)
        found[name.removesuffix(".__init__") if name != "__init__" else name] = path
    return found


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(module: str, path: Path) -> tuple[list[tuple[str, int, bool]], list[int]]:
    """(the package's modules `module` imports, with the line and whether only for typing;
    the lines of imports that are not at module level)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module.rpartition(".")[0] if path.name != "__init__.py" else module
    found: list[tuple[str, int, bool]] = []
    nested: list[int] = []

    def visit(node: ast.AST, depth: int, typing_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = depth + isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                               ast.ClassDef, ast.Lambda))
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                if depth:
                    nested.append(child.lineno)
                for target in _targets(child, package):
                    found.append((target, child.lineno, typing_only))
            visit(child, inner, typing_only or _type_checking(child))

    visit(tree, 0, False)
    return found, nested


def _targets(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    names: list[str] = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            parent = package.split(".") if package and package != "__init__" else []
            parent = parent[: len(parent) - (node.level - 1)] if node.level > 1 else parent
            base = ".".join([NAME, *parent, *([base] if base else [])])
        names = [base] + [f"{base}.{a.name}" for a in node.names]
    inside = []
    for name in names:
        if name == NAME or name.startswith(NAME + "."):
            target = name.removeprefix(NAME).lstrip(".")
            if target and target.split(".")[0] in {m.split(".")[0] for m in modules()}:
                inside.append(_module_of(target))
    return sorted(set(inside))


def _module_of(target: str) -> str:
    known = modules()
    while target not in known and "." in target:
        target = target.rpartition(".")[0]
    return target


GRAPH = {name: imports(name, path) for name, path in modules().items()}


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_each_module_imports_only_from_its_layer_or_below(module: str) -> None:
    mine = layer_of(module)
    for target, line, _ in GRAPH[module][0]:
        if target == module:
            continue
        assert mine >= 0, f"{module}:{line} imports {target}: it must import nothing of ours"
        assert layer_of(target) <= mine, (
            f"{module}:{line} ({LAYERS[mine][0]}) imports {target} "
            f"({LAYERS[layer_of(target)][0]}), a layer above it")


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_no_import_hides_inside_a_function(module: str) -> None:
    assert GRAPH[module][1] == [], f"{module}: imports inside functions at lines {GRAPH[module][1]}"


def test_nothing_imports_in_a_cycle() -> None:
    edges = {m: {t for t, _, _ in found if t != m} for m, (found, _) in GRAPH.items()}
    state: dict[str, int] = {}

    def walk(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                raise AssertionError(f"import cycle: {' -> '.join([*trail, node, nxt])}")
            if nxt not in state:
                walk(nxt, [*trail, node])
        state[node] = 2

    for module in sorted(edges):
        if module not in state:
            walk(module, [])


def test_no_module_loads_another_by_name() -> None:
    # importlib only where the reconciler's console entry point loads the user's tools module.
    users = [m for m, path in modules().items() if "importlib" in path.read_text()
             and m != "reconciler"]
    assert users == []


def test_the_layers_are_the_readmes() -> None:
    readme = (PACKAGE.parents[1] / "README.md") if (PACKAGE.parents[1] / "README.md").is_file() \
        else Path(__file__).resolve().parents[1] / "README.md"
    text = readme.read_text()
    for _, names in LAYERS:
        for name in names:
            if "." not in name:
                assert f"`{name}`" in text, f"README's layers do not name {name}"


def test_importing_the_package_loads_no_adapter_and_no_framework() -> None:
    code = ("import sys, idempotency_ledger, idempotency_ledger.reconciler\n"
            "loaded = [m for m in ('idempotency_ledger.pydantic_ai', "
            "'idempotency_ledger.openai_agents', 'idempotency_ledger.langchain', "
            "'idempotency_ledger.mcp', 'pydantic_ai', 'agents', 'langchain', 'langgraph', "
            "'fastmcp') if m in sys.modules]\n"
            "assert not loaded, loaded\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
