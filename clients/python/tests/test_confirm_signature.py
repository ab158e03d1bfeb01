"""The paired read's signature, checked when it is registered (issue 27, item 6; issue 35): a
``confirm`` is called with one argument, the :class:`UnknownAttempt`. A read written for
something else (the reference string, the attempt's number) would look up the wrong thing,
answer "not found", and let the tool act twice: it is refused, in every way a read is
registered (``ledger.tool(confirm=...)``, ``run_once``/``attempt``, ``LedgerTool``, the
``Reconciler``, each adapter's ``confirm={...}``), with a message naming the fix. A read that can
take the attempt, unannotated too, is accepted, and runs against the real server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Optional

import pytest
from pydantic_ai.toolsets import FunctionToolset
from scenario import CREDIT

from idempotency_ledger import (
    Confirmation,
    Ledger,
    LedgerTool,
    NotFound,
    Reconciler,
    UnknownAttempt,
    not_found,
)
from idempotency_ledger.langchain import LedgerMiddleware as LangChainMiddleware
from idempotency_ledger.mcp import LedgerMiddleware as McpMiddleware
from idempotency_ledger.pydantic_ai import LedgerToolset
from idempotency_ledger.testing import LedgerServer

#: What every refusal says to do.
FIX = ("confirm receives the attempt (UnknownAttempt: .key, .external_ref, .arguments, .number, "
       ".tool, .run_id); take it and read attempt.external_ref")


def find_by_reference(reference: str) -> Confirmation:
    """The mistake of issue 27: a read written to take the reference, called with the attempt,
    would look up the attempt object, find nothing, and let the tool act again."""
    return not_found()


def find_by_number(attempt: UnknownAttempt, number: int) -> Confirmation:
    return not_found()


def find_nothing() -> Confirmation:
    return not_found()


def find_by_keyword(*, attempt: UnknownAttempt) -> Confirmation:
    return not_found()


def find_by_attempt_number(number: "int") -> Confirmation:  # noqa: UP037 (a string annotation)
    return not_found()


def find_by_references(references: list[str]) -> Confirmation:
    return not_found()


def find_by_optional_reference(reference: str | None) -> Confirmation:
    return not_found()


def find_by_typing_optional(reference: Optional[str]) -> Confirmation:  # noqa: UP045
    return not_found()


def find_by_annotated(reference: Annotated[str, "the memo"]) -> Confirmation:
    return not_found()


def find_by_unresolved_text(references: list[Reference]) -> Confirmation:  # type: ignore[name-defined]  # noqa: F821
    # An annotation naming a class nobody can resolve: judged by its shape, a list.
    return not_found()


WRONG_READS: list[tuple[Any, str]] = [
    (find_by_reference, "takes 'reference' as str"),
    (find_by_number, "cannot be called with one argument"),
    (find_nothing, "cannot be called with one argument"),
    (find_by_keyword, "cannot be called with one argument"),
    (find_by_attempt_number, "takes 'number' as int"),
    (find_by_references, r"takes 'references' as list\[str\]"),
    (find_by_optional_reference, r"takes 'reference' as str \| None"),
    (find_by_typing_optional, r"takes 'reference' as typing.Optional\[str\]"),
    (find_by_annotated, "takes 'reference' as typing.Annotated"),
    (find_by_unresolved_text, r"takes 'references' as list\[Reference\]"),
    (lambda: not_found(), "cannot be called with one argument"),
    ("not a function", "must be a function of the attempt"),
]


class CallableRead:
    def __call__(self, attempt: UnknownAttempt) -> Confirmation:
        return not_found()


async def async_read(attempt: UnknownAttempt | None) -> Confirmation:
    return not_found()


def read_with_default(attempt: "UnknownAttempt", *, verbose: bool = False) -> Confirmation:
    return not_found()


def read_untyped(attempt):  # type: ignore[no-untyped-def]
    return not_found()


def read_anything(attempt: Any) -> Confirmation:
    return not_found()


def read_forward(attempt: Unresolvable) -> Confirmation:  # type: ignore[name-defined]  # noqa: F821
    # A class this module cannot resolve (defined elsewhere, under TYPE_CHECKING): accepted.
    return not_found()


RIGHT_READS = [lambda a: not_found(), CallableRead(), async_read, read_with_default,
               read_untyped, read_anything, read_forward, lambda *args: not_found(),
               lambda attempt, extra=None: not_found()]

#: Every way a read is registered, each given the read for the tool issue_credit.
REGISTRATIONS: dict[str, Callable[[Ledger, Any], Any]] = {
    "LedgerTool": lambda ledger, read: LedgerTool("issue_credit", read),
    "Reconciler": lambda ledger, read: Reconciler(ledger, {"issue_credit": read}),
    "pydantic-ai LedgerToolset": lambda ledger, read: LedgerToolset(
        FunctionToolset(), ledger, confirm={"issue_credit": read}),
    "LangChain LedgerMiddleware": lambda ledger, read: LangChainMiddleware(
        ledger, confirm={"issue_credit": read}),
    "MCP LedgerMiddleware": lambda ledger, read: McpMiddleware(
        ledger, confirm={"issue_credit": read}),
}


@pytest.mark.parametrize(("read", "why"), WRONG_READS,
                         ids=[getattr(r, "__name__", str(i)) for i, (r, _) in
                              enumerate(WRONG_READS)])
def test_a_read_that_cannot_take_the_attempt_is_refused_when_registered(
        server: LedgerServer, run_id: str, read: Any, why: str) -> None:
    with Ledger(server.address) as ledger:
        with pytest.raises(TypeError, match=f"the confirm of tool issue_credit.*{why}") as decorated:
            @ledger.tool(run_id=run_id, confirm=read)
            def issue_credit(customer: str) -> dict:
                raise AssertionError("never called")
        assert FIX in str(decorated.value)
        with pytest.raises(TypeError, match=why) as called:
            ledger.run_once(run_id, "issue_credit", CREDIT, lambda a: pytest.fail("acted"),
                            confirm=read)
        assert FIX in str(called.value)
        with pytest.raises(NotFound):  # refused before anything was claimed
            ledger.lookup(run_id=run_id, tool="issue_credit", arguments=CREDIT)
        for way, register in REGISTRATIONS.items():
            with pytest.raises(TypeError, match=why) as refused:
                register(ledger, read)
            assert FIX in str(refused.value), way


@pytest.mark.parametrize("read", RIGHT_READS, ids=[str(i) for i in range(len(RIGHT_READS))])
def test_a_read_that_takes_the_attempt_is_accepted(server: LedgerServer, run_id: str,
                                                   read: Any) -> None:
    with Ledger(server.address) as ledger:
        @ledger.tool(run_id=run_id, confirm=read)
        def issue_credit(customer: str) -> dict:
            return {"credit_id": "cr-1"}

        assert issue_credit("c-42") == {"credit_id": "cr-1"}
        assert ledger.run_once(f"{run_id}-2", "t", {}, lambda a: 1, confirm=read).value == 1
        for register in REGISTRATIONS.values():
            register(ledger, read)
