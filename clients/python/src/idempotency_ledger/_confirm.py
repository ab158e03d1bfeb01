"""The paired read's side of the ledger layer: what a tool's ``confirm`` must be (checked when it
is registered), and the lines every settlement, and every finding the ledger did not apply, is
logged with (who settled it being what the entry says)."""

from __future__ import annotations

import ast
import inspect
import logging
import types
import typing
from typing import Any

from .model import (
    Confirmation,
    Entry,
    ResolutionResult,
    Status,
    UnknownAttempt,
)

__all__ = [
    "check_confirm",
    "confirm_required",
    "log_settlement",
    "log_unapplied",
    "said",
    "settled_by",
]

log = logging.getLogger("idempotency_ledger")


def confirm_required(tool: str) -> ValueError:
    """Strict mode's refusal of a tool without its paired read, saying why."""
    return ValueError(
        f"tool {tool} has no confirm=, and the ledger requires one (require_confirm=True): "
        "give it its paired read, a function that looks the effect up (by "
        "attempt.external_ref) and returns found(result), not_found() or cannot_tell(), so "
        "that an unknown outcome can be settled. A tool that cannot be reconciled cannot be "
        "safely retried")


# Annotations of the one parameter of a confirm that cannot be the attempt: the reference string,
# the attempt's number, ... (a read written for them answers "not found" about every attempt).
_NOT_AN_ATTEMPT = frozenset({"str", "int", "float", "bytes", "bool", "dict", "list", "tuple",
                             "set", "frozenset", "None", "NoneType"})
# The fix every refusal names: what the read is given, and how to take it.
_FIX = ("confirm receives the attempt (UnknownAttempt: .key, .external_ref, .arguments, .number, "
        ".tool, .run_id); take it and read attempt.external_ref (the reference the action passed "
        "on), as in def find_it(attempt: UnknownAttempt) -> Confirmation")


def check_confirm(confirm: Any, tool: str) -> None:
    """Refuses, when a tool's paired read is registered, one that cannot be the read: not
    callable, or that cannot be called with one argument (the :class:`UnknownAttempt`), or whose
    parameter taking it is annotated as something an attempt is not (``ref: str``,
    ``number: int``, ``list[str]``). "Not found" is the one answer that lets a tool act again,
    and a read given what it did not expect looks up the wrong thing and finds nothing. An
    unannotated parameter is accepted."""
    name = getattr(confirm, "__qualname__", None) or repr(confirm)
    if not callable(confirm):
        raise TypeError(f"the confirm of tool {tool} must be a function of the attempt, not "
                        f"{confirm!r}: {_FIX}")
    try:
        signature = inspect.signature(confirm, eval_str=True)
    except (NameError, SyntaxError, TypeError, ValueError):
        try:
            signature = inspect.signature(confirm)
        except (TypeError, ValueError):
            return  # a callable without a signature (a builtin): nothing to check
    try:
        bound = signature.bind(None)
    except TypeError as e:
        raise TypeError(
            f"the confirm of tool {tool}, {name}{signature}, cannot be called with one "
            f"argument ({e}): it is called as confirm(attempt); {_FIX}") from None
    (parameter,) = bound.arguments
    annotation = signature.parameters[parameter].annotation
    if not _may_be_attempt(annotation):
        shown = (annotation if isinstance(annotation, str) else annotation.__name__
                 if isinstance(annotation, type) else repr(annotation))
        raise TypeError(
            f"the confirm of tool {tool}, {name}{signature}, takes {parameter!r} as {shown}, but "
            f"{_FIX}. A read that looks up the wrong thing answers not found, and the tool acts "
            "again")


def _may_be_attempt(annotation: Any) -> bool:
    if annotation is inspect.Parameter.empty or annotation is Any:
        return True
    if annotation is None:
        return False
    if isinstance(annotation, str):
        return _text_may_be_attempt(annotation)
    if isinstance(annotation, type):
        try:
            return issubclass(UnknownAttempt, annotation)
        except TypeError:  # a protocol that cannot be checked at run time
            return True
    origin, members = typing.get_origin(annotation), typing.get_args(annotation)
    if members and origin in (typing.Union, types.UnionType):
        return any(_may_be_attempt(member) for member in members)
    if origin is typing.Annotated and members:
        return _may_be_attempt(members[0])
    if isinstance(origin, type):  # list[str], dict[str, Any], type[UnknownAttempt]: the class
        return _may_be_attempt(origin)
    return True  # a TypeVar, a Literal, ...: not ours to judge


def _text_may_be_attempt(text: str) -> bool:
    """An annotation left as text (a name that could not be resolved): judged by its shape,
    ``str``, ``str | None``, ``list[str]`` refused, any other name accepted."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return True
    return _node_may_be_attempt(node)


def _node_may_be_attempt(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id not in _NOT_AN_ATTEMPT
    if isinstance(node, ast.Constant):
        return (_text_may_be_attempt(node.value) if isinstance(node.value, str)
                else node.value is not None)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _node_may_be_attempt(node.left) or _node_may_be_attempt(node.right)
    if isinstance(node, ast.Subscript):
        inner = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if ast.unparse(node.value).rpartition(".")[2] in ("Optional", "Union"):
            return any(_node_may_be_attempt(member) for member in inner)
        return _node_may_be_attempt(node.value)
    return True


def said(answer: Any) -> str:
    """What a confirm's answer said, as the settlement line writes it."""
    return answer.answer.value if isinstance(answer, Confirmation) else "cannot_tell"


def settled_by(entry: Entry) -> str:
    """Who settled `entry`, as the entry itself says it: ``resolved_by=<principal>`` when it
    records one (a Reconcile's resolution); else ``settled_by=claimant`` once it is resolved
    (its claimant's own Complete, which records no resolved_by), ``settled_by=nobody`` while
    its outcome is still unknown. Never a resolved_by the entry does not have."""
    if entry.resolved_by:
        return f"resolved_by={entry.resolved_by}"
    if entry.status in (Status.UNKNOWN, Status.ATTEMPTING):
        return "settled_by=nobody"
    return "settled_by=claimant"


def log_unapplied(result: ResolutionResult, seen: Entry, finding: str, via: str) -> None:
    """A finding (`finding`: ``found`` or ``not_found``) the ledger did not apply (stale: the
    attempt moved on or the entry was handed out again; already resolved; not found), never
    taken as settled by us: one WARNING line with the key, the attempt the read was about, the
    entry's attempt and status now, who settled it as the entry says, and the ledger's why, in
    the TypeScript client's words; and an ERROR line when the ledger marked the entry as a
    possible double effect (a stale "found": an earlier attempt's effect exists while a later
    one was started)."""
    now = result.entry
    log.warning(
        "finding not applied key=%s tool=%s external_ref=%s finding=%s result=%s "
        "attempt_seen=%d attempt_now=%s status_now=%s %s via=%s%s", seen.key, seen.tool,
        seen.external_ref, finding, result.result.name, seen.attempt,
        now.attempt if now else "-", now.status.name if now else "-",
        settled_by(now) if now else "settled_by=nobody", via,
        f": {result.note}" if result.note else "")
    if now is not None and now.possible_double_effect:
        log.error(
            "possible double effect key=%s tool=%s external_ref=%s: the entry is marked, the "
            "intent may have acted twice (attempt %d's effect was found while the entry is at "
            "attempt %d, %s); a person must check the outside world and acknowledge it",
            seen.key, seen.tool, seen.external_ref, seen.attempt, now.attempt, now.status.name)


def log_settlement(entry: Entry, outcome: str, via: str) -> None:
    """One line per settlement (INFO), as the TypeScript client writes it: key, tool,
    external_ref, what the read said (``found``, ``not_found``, ``cannot_tell``, or
    ``elsewhere`` when someone else settled it), the entry's status and who settled it as the
    entry says (:func:`settled_by`), and who asked (``run_once``, ``a repeat``,
    ``reconciler``)."""
    log.info("settled key=%s tool=%s external_ref=%s outcome=%s status=%s %s via=%s",
             entry.key, entry.tool, entry.external_ref, outcome, entry.status.name,
             settled_by(entry), via)
