"""The reconciler: settles the unknown outcomes of the tools it is given, with each tool's paired
read (``confirm``), and of those tools only.

    reconciler = Reconciler(ledger, [issue_credit, send_reply]).start()   # beside the agent
    ...
    reconciler.stop()

or as a process of its own, loading your tools module (``idempotency-ledger-reconciler``)::

    idempotency-ledger-reconciler myapp.tools:TOOLS --target 127.0.0.1:50051

Each round asks the ledger (``Reconcile`` with ``tool=``, one tool at a time) for the entries of
that tool whose outcome nobody knows and that started at least ``older_than`` ago (the claimant
settles its own at once; this is for the crashes, the tools without a chance, and the reads that
could not tell), looks each one's arguments up, asks the tool's ``confirm``, and sends what it
found: found → ``SUCCEEDED`` with the result (repeats replay it); not found → ``FAILED``,
retryable (the next call acts); cannot tell → left ``UNKNOWN`` for the next round or a person
(``idempotency-ledger resolve``). Every finding is fenced by the attempt and the hold token its
entry was handed out with: one the ledger did not apply (``stale``: the read outlived its hold
and the entry was handed to someone else, or a later attempt started; ``already_resolved``) is
logged and counted (:attr:`Reconciler.counts`), never reported as settled. Every settlement is
logged (key, tool, external_ref, outcome, who) and recorded as ``resolved_by``. The confirms are paced (``rate`` per second at most); a
round that fails backs off, doubling up to ``max_backoff``; ``stop()``, SIGINT and SIGTERM end the
loop between two steps.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import random
import signal
import sys
import threading
from collections import Counter
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any

from . import _core as core
from . import _wire as wire
from ._confirm import log_settlement, log_unapplied
from .client import AsyncLedgerClient, LedgerClient
from .errors import LedgerError, NotFound
from .model import Confirmation, Entry, Resolution, Status, UnknownAttempt
from .tools import Ledger, LedgerTool, ledger_tools_of

__all__ = ["Reconciler", "Settlement", "main"]

log = logging.getLogger("idempotency_ledger.reconciler")

#: Entries younger than this are left to their claimant, which settles its own at once.
DEFAULT_OLDER_THAN = 10.0
#: The pause between two rounds that found nothing.
DEFAULT_INTERVAL = 5.0
#: Entries taken per tool at once.
DEFAULT_BATCH = 50
#: Confirms asked per second at most, all tools together.
DEFAULT_RATE = 10.0
#: The first pause after a failed round, doubled after each further failure ...
DEFAULT_BACKOFF = 1.0
#: ... up to this (the TypeScript Reconciler's defaults too: clients/parity.json).
DEFAULT_MAX_BACKOFF = 60.0


@dataclass(frozen=True)
class Settlement:
    """What the reconciler did with one entry."""

    key: str
    tool: str
    external_ref: str
    #: What the read said, when the ledger applied it: ``found``, ``not_found``; else
    #: ``cannot_tell`` (nothing sent), or what the ledger answered a finding it did not apply:
    #: ``stale`` (a later attempt was started, or the entry was handed out again since) or
    #: ``already_resolved`` (the attempt was resolved meanwhile: a late Complete, a person).
    outcome: str
    #: The entry's status afterwards (``UNKNOWN`` when the read could not tell).
    status: Status
    #: Who settled it, as the entry records it (``resolved_by``): this reconciler's principal
    #: when its finding was applied; ``""`` when nobody did or the claimant's Complete did.
    who: str
    #: The attempt the read was about (the pending entry's), and the entry's attempt afterwards:
    #: they differ when a later attempt was started meanwhile.
    attempt: int = 0
    attempt_now: int = 0


def _round(policy: core.Policy, tools: Mapping[str, LedgerTool], principal: str,
           older_than: float, batch: int, gap: float) -> Generator[core.Step, Any,
                                                                    list[Settlement]]:
    """One pass over every tool: take its unknown entries, ask its confirm, send what it
    found, fenced by each entry's attempt and hold token; until the ledger hands out no more
    (taken entries are held for this caller a while, so one it could not tell about is not
    handed back in the same pass)."""
    done: list[Settlement] = []
    for name, tool in tools.items():
        assert tool.confirm is not None
        while True:
            taken = yield from core.reconcile(
                policy, wire.reconcile_request(older_than, name, batch, (), False, (), principal),
                None, budget=policy.retry_budget)
            if not taken.pending:
                break
            answers: list[tuple[Entry, UnknownAttempt, Confirmation, Resolution]] = []
            for pending in taken.pending:
                question = yield from _question(policy, pending)
                if question is None:
                    continue  # gone meanwhile (expired)
                answer = yield from core.ask(tool.confirm, question)
                resolution = core.resolution_of(answer, question, tool.codec, pending)
                if resolution is None:
                    log_settlement(pending, "cannot_tell", "reconciler")
                    done.append(Settlement(question.key, name, question.external_ref,
                                           "cannot_tell", Status.UNKNOWN, "", pending.attempt,
                                           pending.attempt))
                else:
                    answers.append((pending, question, answer, resolution))
                if gap > 0:
                    yield core.Sleep(gap)
            if answers:
                sent = yield from core.reconcile(
                    policy, wire.reconcile_request(None, "", 0, [r for *_, r in answers], True,
                                                   (), principal),
                    None, budget=policy.retry_budget)
                results = {r.key: r for r in sent.results}
                for pending, question, answer, _ in answers:
                    result = results.get(question.key)
                    if result is None or result.entry is None:
                        continue  # gone meanwhile (expired)
                    entry = result.entry
                    if result.applied:
                        outcome = answer.answer.value
                        log_settlement(entry, outcome, "reconciler")
                    else:  # fenced out: logged, counted, never taken as settled by us
                        outcome = result.result.name.lower()
                        log_unapplied(result, pending, answer.answer.value, "reconciler")
                    done.append(Settlement(question.key, name, question.external_ref, outcome,
                                           entry.status, entry.resolved_by, pending.attempt,
                                           entry.attempt))
            if len(taken.pending) < batch:
                break
    return done


def _question(policy: core.Policy, entry: Entry) -> Generator[core.Step, Any,
                                                              UnknownAttempt | None]:
    """What the confirm is asked: the entry with its arguments (Reconcile hands entries out
    without them; Lookup has them, as the server keeps them), about the attempt handed out."""
    try:
        full = yield from core.lookup(policy, wire.lookup_request(entry.key, None, None, None,
                                                                  "JCS"), None)
    except NotFound:
        return None
    try:
        arguments = json.loads(full.arguments_json) if full.arguments_json else {}
    except ValueError:
        arguments = {}
    return UnknownAttempt(key=full.key, external_ref=full.external_ref, arguments=arguments,
                          number=entry.attempt, tool=full.tool, run_id=full.run_id, entry=full)


class Reconciler:
    """Settles the unknown outcomes of `tools` with their ``confirm``; see the module.

    Args:
        ledger: a :class:`~idempotency_ledger.Ledger` (``run()``, ``start()`` in a thread) or an
            :class:`~idempotency_ledger.AsyncLedger` (``await arun()``, ``start()`` as a task).
        tools: the tools to settle: ``ledger.tool()`` functions (or the framework tools made
            from them), an adapter's middleware or toolset, ``LedgerTool(name, confirm)``, a
            mapping of tool names to confirm functions, or a list of these. A tool without a
            ``confirm`` is refused (``ValueError`` naming it): the reconciler could never
            settle it. Entries of tools not given are never touched.
        principal: recorded as ``resolved_by`` (default ``reconciler@<host>:<pid>``).
        older_than: only entries whose attempt started at least this many seconds ago.
        interval: seconds between two rounds that found nothing.
        batch: entries taken at once.
        rate: confirms asked per second at most.
        backoff: the first pause after a failed round, doubled after each further one ...
        max_backoff: ... up to this; each pause is jittered (half to all of it).
    """

    def __init__(self, ledger: LedgerClient | AsyncLedgerClient, tools: Any, *,
                 principal: str | None = None,
                 older_than: float = DEFAULT_OLDER_THAN, interval: float = DEFAULT_INTERVAL,
                 batch: int = DEFAULT_BATCH, rate: float = DEFAULT_RATE,
                 backoff: float = DEFAULT_BACKOFF,
                 max_backoff: float = DEFAULT_MAX_BACKOFF) -> None:
        if rate <= 0 or batch <= 0 or interval < 0 or backoff <= 0:
            raise ValueError("rate, batch and backoff must be positive, interval not negative")
        self.ledger = ledger
        self.tools: dict[str, LedgerTool] = {}
        for tool in ledger_tools_of(tools):
            if tool.confirm is None:
                raise ValueError(
                    f"tool {tool.name} has no confirm: a reconciler cannot ask whether its "
                    "unknown outcomes happened, so it would never settle them. Give the tool "
                    "its paired read (ledger.tool(confirm=...), LedgerTool(name, confirm)), or "
                    "leave it out of the reconciler's tools")
            self.tools[tool.name] = tool
        if not self.tools:
            raise ValueError("no tools given: nothing to reconcile")
        self.principal = principal or core.default_principal("reconciler")
        self.older_than = older_than
        self.interval = interval
        self.batch = batch
        self.gap = 1.0 / rate
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._stop = threading.Event()
        self._astop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task[None] | None = None
        #: Every settlement so far, in order (the log says the same), findings the ledger did
        #: not apply included (``stale``, ``already_resolved``).
        self.settlements: list[Settlement] = []

    @property
    def counts(self) -> Counter[str]:
        """The reconciler's figures: its settlements so far by outcome (``found``,
        ``not_found``, ``cannot_tell``, ``stale``, ``already_resolved``)."""
        return Counter(s.outcome for s in self.settlements)

    def _steps(self) -> Generator[core.Step, Any, list[Settlement]]:
        return _round(self.ledger._policy, self.tools, self.principal, self.older_than,
                      self.batch, self.gap)

    def _next_pause(self, failures: int) -> float:
        if failures == 0:
            return self.interval
        pause = min(self.backoff * 2 ** (failures - 1), self.max_backoff)
        return pause * random.uniform(0.5, 1.0)

    # --- blocking -----------------------------------------------------------------------------

    def run_round(self) -> list[Settlement]:
        """One pass over every tool (blocking client); returns what it settled."""
        if not isinstance(self.ledger, LedgerClient):
            raise TypeError("run_round needs the blocking Ledger; use arun_round")
        settled = self.ledger._drive(self._steps())
        self.settlements += settled
        return settled

    def run(self) -> None:
        """Runs rounds until :meth:`stop` (or SIGINT / SIGTERM, in the main thread)."""
        restore = self._handle_signals()
        log.info("reconciling %s as %s", ", ".join(self.tools), self.principal)
        failures = 0
        try:
            while not self._stop.is_set():
                try:
                    self.run_round()
                    failures = 0
                except (LedgerError, ValueError) as e:  # ValueError: the channel was closed
                    failures += 1
                    log.warning("reconcile round failed (%d in a row): %s", failures, e)
                self._stop.wait(self._next_pause(failures))
        finally:
            restore()

    def start(self) -> Reconciler:
        """Runs in the background beside the agent: a thread with the blocking client, a task
        (of the running loop) with the asyncio one. Returns the reconciler."""
        if isinstance(self.ledger, AsyncLedgerClient):
            self._task = asyncio.get_running_loop().create_task(self.arun())
        else:
            self._thread = threading.Thread(target=self.run, name="ledger-reconciler",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Ends the loop after its current step (waits for the thread; the task ends on its
        own: ``await reconciler.stopped()`` to wait for it)."""
        self._stop.set()
        if self._astop is not None:
            self._astop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    async def stopped(self) -> None:
        """Waits for the background task :meth:`start` made to end."""
        if self._task is not None:
            await self._task

    def _handle_signals(self) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = {s: signal.signal(s, lambda *_: self.stop())
                    for s in (signal.SIGINT, signal.SIGTERM)}
        return lambda: [signal.signal(s, h) for s, h in previous.items()]

    # --- asyncio ------------------------------------------------------------------------------

    async def arun_round(self) -> list[Settlement]:
        """One pass over every tool (asyncio client); returns what it settled."""
        if not isinstance(self.ledger, AsyncLedgerClient):
            raise TypeError("arun_round needs the AsyncLedger; use run_round")
        settled = await self.ledger._drive(self._steps())
        self.settlements += settled
        return settled

    async def arun(self) -> None:
        """Runs rounds until :meth:`stop` (or SIGINT / SIGTERM, where the loop can take them)."""
        self._astop = asyncio.Event()
        if self._stop.is_set():
            return
        loop = asyncio.get_running_loop()
        handled = []
        for s in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(s, self.stop)
                handled.append(s)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
                pass
        failures = 0
        try:
            while not self._astop.is_set():
                try:
                    await self.arun_round()
                    failures = 0
                except LedgerError as e:
                    failures += 1
                    log.warning("reconcile round failed (%d in a row): %s", failures, e)
                try:
                    await asyncio.wait_for(self._astop.wait(), self._next_pause(failures))
                except TimeoutError:
                    pass
        finally:
            for s in handled:
                loop.remove_signal_handler(s)


# --- the console entry point ------------------------------------------------------------------


def _load(spec: str) -> Any:
    """The object `spec` (``module:attribute``) names; a callable is called for it."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise SystemExit(f"{spec!r}: expected module:attribute, such as myapp.tools:TOOLS")
    sys.path.insert(0, os.getcwd())
    module = importlib.import_module(module_name)
    value = module
    for part in attribute.split("."):
        value = getattr(value, part)
    return value() if callable(value) and not hasattr(value, "ledger_tool") and not hasattr(
        value, "ledger_tools") else value


def main(argv: list[str] | None = None) -> int:
    """``idempotency-ledger-reconciler module:tools``: runs a reconciler for the tools a module
    of yours names, until SIGINT or SIGTERM (or one round with ``--once``)."""
    parser = argparse.ArgumentParser(
        prog="idempotency-ledger-reconciler",
        description="Settles the unknown outcomes of your tools with their confirm (paired "
                    "read), and of those tools only.")
    parser.add_argument("tools", help="module:attribute naming your tools: a list of "
                        "ledger.tool() functions or framework tools, a middleware, or a mapping "
                        "of tool names to confirm functions (a callable returning one)")
    parser.add_argument("--target", default=os.environ.get("LEDGER_TARGET", "127.0.0.1:50051"),
                        help="the ledger (env LEDGER_TARGET; default 127.0.0.1:50051)")
    parser.add_argument("--token", default=os.environ.get("LEDGER_TOKEN"),
                        help="your tenant's bearer token (env LEDGER_TOKEN)")
    parser.add_argument("--principal",
                        help="recorded as resolved_by (default reconciler@host:pid)")
    parser.add_argument("--older-than", type=float, default=DEFAULT_OLDER_THAN,
                        help="only entries started at least this many seconds ago "
                             f"(default {DEFAULT_OLDER_THAN:g})")
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL,
                        help=f"seconds between rounds (default {DEFAULT_INTERVAL:g})")
    parser.add_argument("--rate", type=float, default=DEFAULT_RATE,
                        help=f"confirms asked per second at most (default {DEFAULT_RATE:g})")
    parser.add_argument("--once", action="store_true", help="run one round, then exit")
    parser.add_argument("--log-level", default="INFO", help="default INFO: every settlement")
    ns = parser.parse_args(argv)
    logging.basicConfig(level=ns.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tools = _load(ns.tools)
    with Ledger(ns.target, token=ns.token) as ledger:
        reconciler = Reconciler(ledger, tools, principal=ns.principal, older_than=ns.older_than,
                                interval=ns.interval, rate=ns.rate)
        if ns.once:
            log.info("reconciling %s once as %s", ", ".join(reconciler.tools),
                     reconciler.principal)
            reconciler.run_round()
        else:
            reconciler.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
