"""Every ```python block of the docs (docs/*.md, the repository's README.md and this client's
README.md) is checked as written, in the test venv: it compiles (top-level ``await`` allowed, as
in an asyncio REPL), every import imports and every name it imports exists, and every other name
it uses is defined in the block, a builtin, or one of the few context names below: the objects an
app already has where the snippet goes. A reader who copies a block gets no NameError for a
missing import. (test_readme_snippets.py runs the README's blocks that can run on their own.)"""

from __future__ import annotations

import ast
import builtins
import importlib
import re
import symtable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DOCUMENTS = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md",
             REPO / "clients" / "python" / "README.md"]

#: The names a block of any document may use without defining them, and why each is the
#: reader's own: the objects an app already has where a snippet goes.
CONTEXT: dict[str, str] = {
    "ledger": "the agent's client, Ledger(...) or AsyncLedger(...), made once per app as the "
              "client README's first block shows",
    "approver": "a client made with a person's approver token: the app's approve button",
    "run_id": "the run the app keys its calls by (a conversation turn, a job): its own choice",
    "model": "the framework's model, whichever the app uses (the tests drive offline ones)",
    "agent": "the app's agent in the framework the block is about, made as that framework "
             "makes one",
    "args": "a tool call's arguments as the model sent them",
    "payments": "the app's payments API: the side effect the snippets make happen once",
    "find_credit": "the paired read of issue_credit, as the client README's paired-read block "
                   "writes it",
}
#: The names one document's blocks may use besides, where its earlier blocks or its prose made
#: them.
CONTEXT_BY_DOCUMENT: dict[str, dict[str, str]] = {
    "clients/python/README.md": {
        "issue_credit": "the tool function the decorator block writes",
        "send_reply": "a second tool function, as issue_credit",
        "issue_refund": "the gated tool, written in each framework as docs/approvals.md shows",
        "issue": "the action the paired-read block settles: the app's call of its payments API",
        "send_reply_async": "the coroutine action of the asyncio block, the app's own",
        "async_ledger": "an AsyncLedger(...), as the asyncio block makes one",
    },
    "docs/approvals.md": {
        "post_to_chat": "the app's own notification of a request, wherever it tells people",
    },
}


def context_of(document: Path) -> dict[str, str]:
    return {**CONTEXT, **CONTEXT_BY_DOCUMENT.get(str(document.relative_to(REPO)), {})}


_FENCE = re.compile(r"^(?P<indent>[ ]*)```python[ \t]*\n(?P<code>.*?)^(?P=indent)```[ \t]*$",
                    re.S | re.M)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line, code) of every ```python block of a Markdown text, its indentation removed."""
    blocks = []
    for match in _FENCE.finditer(text):
        indent = len(match["indent"])
        code = "".join(line[indent:] for line in match["code"].splitlines(keepends=True))
        blocks.append((text.count("\n", 0, match.start()) + 2, code))
    return blocks


def problems(code: str, where: str, context: dict[str, str] = CONTEXT) -> list[str]:
    """What is wrong with a block as written: its syntax, an import that fails or a name it
    imports that does not exist, a name used that nothing defines."""
    try:
        tree = compile(code, where, "exec", ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        compile(tree, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except SyntaxError as e:
        return [f"{where}: does not compile: {e}"]
    found = [f"{where}: {p}" for node in ast.walk(tree)
             if isinstance(node, (ast.Import, ast.ImportFrom)) for p in _import_problems(node)]
    known = set(dir(builtins)) | set(context)
    found += [f"{where}: {name!r} is used but not defined or imported (a context name? declare "
              "it in CONTEXT with why)" for name in sorted(free_names(code, where) - known)]
    return found


def _import_problems(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [p for alias in node.names if (p := _importable(alias.name))]
    if node.level or node.module is None:
        return [f"line {node.lineno}: a relative import, which no reader's module can make"]
    if (failed := _importable(node.module)) is not None:
        return [failed]
    module = importlib.import_module(node.module)
    return [f"line {node.lineno}: {node.module} has no {alias.name!r}" for alias in node.names
            if alias.name != "*" and not hasattr(module, alias.name)
            and _importable(f"{node.module}.{alias.name}") is not None]


def _importable(module: str) -> str | None:
    try:
        importlib.import_module(module)
    except Exception as e:
        return f"import {module} fails: {e!r}"
    return None


def free_names(code: str, where: str) -> set[str]:
    """The names the block reads that no statement of it binds, in any of its scopes."""
    top = symtable.symtable(code, where, "exec")
    bound = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    free = {s.get_name() for s in top.get_symbols() if s.is_referenced()} - bound

    def visit(table: symtable.SymbolTable) -> None:
        for child in table.get_children():
            free.update(s.get_name() for s in child.get_symbols()
                        if s.is_global() and s.is_referenced() and s.get_name() not in bound)
            visit(child)

    visit(top)
    return free


BLOCKS = [(document, line, code) for document in DOCUMENTS
          for line, code in python_blocks(document.read_text(encoding="utf-8"))]


@pytest.mark.parametrize(("document", "line", "code"), BLOCKS,
                         ids=[f"{d.relative_to(REPO)}:{line}" for d, line, _ in BLOCKS])
def test_every_python_block_of_the_docs_compiles_and_resolves_its_names(
        document: Path, line: int, code: str) -> None:
    where = f"{document.relative_to(REPO)}, the block at line {line}"
    assert problems(code, where, context_of(document)) == []


def test_the_docs_have_python_blocks_in_each_place_named() -> None:
    places = {document for document, _, _ in BLOCKS}
    assert {REPO / "README.md", REPO / "clients" / "python" / "README.md",
            REPO / "docs" / "approvals.md"} <= places


def test_every_context_name_is_one_a_block_uses() -> None:
    # The list stays as small as the docs need: a name nothing uses any more is taken out.
    used: dict[str, set[str]] = {}
    for document, line, code in BLOCKS:
        for name in free_names(code, f"{document}:{line}"):
            used.setdefault(name, set()).add(str(document.relative_to(REPO)))
    assert [name for name in CONTEXT if name not in used] == []
    for document, names in CONTEXT_BY_DOCUMENT.items():
        assert [name for name in names if document not in used.get(name, set())] == [], document


# --- the checker itself fails where a reader would -----------------------------------------------

MISSING_IMPORT = '''
Some prose.

```python
from idempotency_ledger import Ledger

asked = ledger.claim(run_id, "issue_refund", {"order": "o-1", "amount": 250})
assert asked.outcome == Outcome.AWAITING_APPROVAL
```
'''


def test_the_checker_fails_a_block_that_uses_a_name_it_does_not_import() -> None:
    ((line, code),) = python_blocks(MISSING_IMPORT)
    assert line == 5
    assert problems(code, "the block") == [
        "the block: 'Outcome' is used but not defined or imported (a context name? declare it "
        "in CONTEXT with why)"]
    fixed = code.replace("import Ledger", "import Ledger, Outcome")
    assert problems(fixed, "the block") == []


def test_the_checker_fails_an_import_that_does_not_import_or_names_nothing() -> None:
    assert problems("from idempotency_ledger import run_twice\n", "b") == [
        "b: line 1: idempotency_ledger has no 'run_twice'"]
    (failed,) = problems("import idempotency_ledger.crewai\n", "b")
    assert failed.startswith("b: import idempotency_ledger.crewai fails: ModuleNotFoundError")
    (syntax,) = problems("def f(:\n", "b")
    assert syntax.startswith("b: does not compile")


def test_names_bound_anywhere_in_the_block_and_context_names_resolve() -> None:
    code = ("import json\n"
            "async for entry in ledger.list_entries():\n"
            "    print(json.dumps([e for e in entry.arguments_json]))\n"
            "def read(attempt):\n"
            "    return found(attempt.external_ref)\n"
            "class Session:\n"
            "    run_id: str = run_id\n"
            "result = await ledger.run_once(run_id, 't', {}, lambda attempt: read(attempt))\n")
    assert problems(code, "b") == [
        "b: 'found' is used but not defined or imported (a context name? declare it in CONTEXT "
        "with why)"]
    assert problems(code, "b", {**CONTEXT, "found": "for this test"}) == []
