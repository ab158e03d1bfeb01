"""The ledger tools known by name, and the claims handed from an adapter's approval check to
the tool call that follows: :class:`LedgerTool` (a tool's name and paired read, what the
:class:`~idempotency_ledger.Reconciler` settles with), the registry of the tools made in this
process, and :func:`ledger_tools_of`, which finds them in what an adapter or a caller gives.
Exported from ``tools``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from ._confirm import check_confirm, confirm_required
from .client import AsyncLedgerClient, LedgerClient
from .codec import JSON, Codec, to_jsonable
from .keys import derive_key
from .model import Canonicalization, ClaimResult, UnknownAttempt

Confirm = Callable[[UnknownAttempt], Any]


@dataclass(frozen=True)
class LedgerTool:
    """A tool as the ledger knows it: its name and its paired read. The
    :class:`~idempotency_ledger.Reconciler` settles the entries of the tools it is given that
    have a ``confirm``."""

    name: str
    confirm: Confirm | None = None
    codec: Codec = JSON

    def __post_init__(self) -> None:
        if self.confirm is not None:
            check_confirm(self.confirm, self.name)


def checked_confirms(confirm: Mapping[str, Confirm] | None) -> dict[str, Confirm]:
    """The paired reads an adapter is given by tool name, each checked (:func:`check_confirm`)
    when it is registered, as ``ledger.tool(confirm=...)`` checks its own."""
    checked = dict(confirm or {})
    for name, read in checked.items():
        if read is not None:
            check_confirm(read, name)
    return checked


# Every tool registered in this process by name (the last registration wins): how a framework's
# tool object (which may not keep the function it wraps) is found again by its name.
_REGISTERED: dict[str, LedgerTool] = {}
_REGISTERED_LOCK = threading.Lock()


def registered(name: str) -> LedgerTool | None:
    """The tool registered under `name` in this process, if any."""
    return _REGISTERED.get(name)


def _register(tool: LedgerTool) -> None:
    with _REGISTERED_LOCK:
        _REGISTERED[tool.name] = tool


def require_confirm(ledger: LedgerClient | AsyncLedgerClient, name: str,
                    confirm: Confirm | None) -> None:
    """Strict mode (``require_confirm=True``): refuses a tool without its paired read."""
    if getattr(ledger, "require_confirm", False) and confirm is None:
        raise confirm_required(name)


def ledger_tools_of(item: Any) -> list[LedgerTool]:
    """The ledger tools `item` stands for: a :class:`LedgerTool`; a function made by
    ``ledger.tool()``; a framework's tool object around one (found by its ``name``); an
    adapter's middleware or toolset (its ``ledger_tools``); a mapping of tool names to
    ``confirm`` functions; or an iterable of any of these."""
    if isinstance(item, LedgerTool):
        return [item]
    own = getattr(item, "ledger_tool", None)
    if isinstance(own, LedgerTool):
        return [own]
    many = getattr(item, "ledger_tools", None)
    if many is not None and not callable(many):
        return [t for entry in many for t in ledger_tools_of(entry)]
    if isinstance(item, Mapping):
        return [LedgerTool(str(name), confirm) for name, confirm in item.items()]
    name = getattr(item, "name", None)
    if isinstance(name, str) and registered(name) is not None:
        return [cast(LedgerTool, registered(name))]
    if isinstance(item, (list, tuple, set, frozenset)):
        return [t for entry in item for t in ledger_tools_of(entry)]
    raise TypeError(f"{item!r} is not a ledger tool: give ledger.tool() functions (or the "
                    "framework tools made from them), LedgerTool(name, confirm), an adapter's "
                    "middleware or toolset, or a mapping of tool names to confirm functions")


# --- claims won by an adapter's approval check, handed to the tool call that follows --------

_HANDED_OFF: dict[str, ClaimResult] = {}
_HANDED_OFF_LOCK = threading.Lock()


def hand_off(claimed: ClaimResult) -> None:
    """Keeps a claim an adapter's approval check won (the OpenAI Agents SDK's ``needs_approval``
    claims to learn whether a person must decide): the tool call of the same key that follows
    acts on it instead of claiming again."""
    with _HANDED_OFF_LOCK:
        _HANDED_OFF[claimed.key] = claimed


def withdraw_handed_off(claimed: ClaimResult) -> bool:
    """Takes back a claim handed off that no tool call took (True: it was still there)."""
    with _HANDED_OFF_LOCK:
        if _HANDED_OFF.get(claimed.key) is claimed:
            del _HANDED_OFF[claimed.key]
            return True
    return False


def take_handed_off(run_id: str, tool: str, arguments: Any,
                    options: Mapping[str, Any]) -> ClaimResult | None:
    """The claim handed off for this call's key, if any (taken: used once)."""
    if not _HANDED_OFF:
        return None
    try:
        key = derive_key(run_id, tool, to_jsonable(arguments),
                         str(options.get("canonicalization") or Canonicalization.JCS))
    except Exception:
        return None
    with _HANDED_OFF_LOCK:
        return _HANDED_OFF.pop(key, None)
