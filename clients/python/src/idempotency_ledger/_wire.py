"""The wire: the generated messages built from plain values, and read back into the model.

The only module of the ledger layer that touches the generated stubs' messages (the clients hold
the generated service stub). Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from google.protobuf import duration_pb2, timestamp_pb2

from ._proto import ledger_pb2 as pb
from .errors import InvalidArgument
from .keys import arguments_json
from .model import (
    ApprovalEvent,
    Canonicalization,
    ClaimResult,
    Completion,
    Entry,
    Outcome,
    Reconciliation,
    Decision,
    Resolution,
    ResolutionOutcome,
    ResolutionResult,
    RunExtension,
    Status,
)

Seconds = float | int | timedelta
Arguments = str | Mapping[str, Any]


def duration(value: Seconds | None) -> duration_pb2.Duration | None:
    if value is None:
        return None
    d = duration_pb2.Duration()
    if isinstance(value, timedelta):
        d.FromTimedelta(value)
    else:
        d.FromNanoseconds(round(value * 1e9))
    return d


def seconds(value: Seconds | None) -> float | None:
    if value is None:
        return None
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def timestamp(value: datetime | None) -> timestamp_pb2.Timestamp | None:
    """A protobuf Timestamp; a naive datetime is read as UTC (as protobuf does)."""
    if value is None:
        return None
    t = timestamp_pb2.Timestamp()
    t.FromDatetime(value)
    return t


def canonicalization_name(value: Canonicalization | str) -> str:
    """The proto enum's name (protobuf takes names as well as numbers)."""
    return "CANONICALIZATION_" + Canonicalization(value).value


def status_name(value: Status | str) -> str:
    status = Status[value.upper().removeprefix("STATUS_")] if isinstance(value, str) else value
    return "STATUS_" + Status(status).name


def read_file(value: bytes | str | Path) -> bytes:
    return value if isinstance(value, bytes) else Path(value).read_bytes()


def parse_target(target: str) -> tuple[str, bool | None]:
    """(the gRPC address, TLS) of ``host:port``, ``http://host[:port]`` (plaintext) or
    ``https://host[:port]`` (TLS), as the TypeScript client and the CLI take them. TLS is ``None``
    for a bare ``host:port``: the other arguments decide."""
    if "://" not in target:
        if not target or "/" in target:
            raise ValueError(f"target {target!r}: expected host:port, http://host:port or "
                             "https://host:port")
        return target, None
    url = urlsplit(target)
    if url.scheme not in ("http", "https"):
        raise ValueError(f"target {target!r}: the scheme must be http:// or https://")
    if not url.hostname or url.path not in ("", "/") or url.query or url.fragment or (
            url.username or url.password):
        raise ValueError(f"target {target!r}: expected {url.scheme}://host:port and nothing more")
    try:
        port = url.port or (443 if url.scheme == "https" else 80)
    except ValueError as e:
        raise ValueError(f"target {target!r}: {e}") from None
    host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
    return f"{host}:{port}", url.scheme == "https"


# --- requests ---------------------------------------------------------------------------------


def claim_request(
    run_id: str,
    tool: str,
    arguments: Arguments,
    *,
    key: str | None,
    canonicalization: Canonicalization | str,
    lease: Seconds | None,
    retention: Seconds | None,
    wait: Seconds | None,
    principal: str,
    require_approval: bool = False,
    wait_for_attempt_only: bool = False,
) -> Any:
    """A Claim. `wait_for_attempt_only`: the `wait` holds the call for an attempt in flight only
    (``WAIT_FOR_ATTEMPT``), while a call awaiting a person's decision is answered at once."""
    return pb.ClaimRequest(
        run_id=run_id or "",
        tool=tool,
        arguments_json=arguments_json(arguments),
        key=key or "",
        canonicalization=canonicalization_name(canonicalization),
        lease=duration(lease),
        retention=duration(retention),
        wait=duration(wait) if seconds(wait) else None,
        principal=principal,
        require_approval=require_approval,
        wait_for=pb.WAIT_FOR_ATTEMPT if wait_for_attempt_only else pb.WAIT_FOR_UNSPECIFIED,
    )


def decision_name(value: Decision | str) -> str:
    """The proto's ``DECISION_*`` name of ``"approve"`` / ``"deny"`` (any case) or a
    :class:`Decision`."""
    text = value.value if isinstance(value, Decision) else str(value)
    try:
        return "DECISION_" + Decision(text.upper().removeprefix("DECISION_")).value
    except ValueError:
        raise ValueError(f"decision must be 'approve' or 'deny', not {value!r}") from None


def decide_request(key: str, fingerprint: str, decision: Decision | str, reason: str) -> Any:
    return pb.DecideRequest(key=key, fingerprint=fingerprint, decision=decision_name(decision),
                            reason=reason)


def extend_run_request(run_id: str, at_least: Seconds | None) -> Any:
    return pb.ExtendRunRequest(run_id=run_id, retention=duration(at_least))


def watch_request(cursor: str | None) -> Any:
    return pb.WatchApprovalsRequest(after=cursor or "")


def run_extension(r: Any) -> RunExtension:
    kept = r.kept_until.ToDatetime(tzinfo=UTC) if r.HasField("kept_until") else None
    return RunExtension(int(r.extended), kept)


def approval_event(r: Any) -> ApprovalEvent:
    at = r.at.ToDatetime(tzinfo=UTC) if r.HasField("at") else None
    return ApprovalEvent(r.cursor, r.kind, at, r.principal, Entry.from_pb(r.entry))


#: The view every Complete asks for (``defaults.complete_view`` of clients/parity.json): the
#: answer leaves out the result the call sent, which :func:`completion` puts back.
COMPLETE_VIEW = "ENTRY_VIEW_BASIC"


def complete_request(key: str, claim_token: str, status: Status | str, result: bytes, error: str,
                     retryable: bool) -> Any:
    return pb.CompleteRequest(key=key, claim_token=claim_token, status=status_name(status),
                              result=result, error=error, retryable=retryable, view=COMPLETE_VIEW)


def lookup_request(key: str | None, run_id: str | None, tool: str | None,
                   arguments: Arguments | None, canonicalization: Canonicalization | str) -> Any:
    if key:
        return pb.LookupRequest(key=key)
    if run_id is None or tool is None or arguments is None:
        raise TypeError("lookup needs key, or run_id, tool and arguments")
    return pb.LookupRequest(run_id=run_id, tool=tool, arguments_json=arguments_json(arguments),
                            canonicalization=canonicalization_name(canonicalization))


def renew_request(key: str, claim_token: str, lease: Seconds | None) -> Any:
    return pb.RenewLeaseRequest(key=key, claim_token=claim_token, lease=duration(lease))


def fenced(resolution: Resolution) -> Resolution:
    """`resolution`, refused here as the server would refuse it when it names no attempt or
    hold token (``UNFENCED_RESOLUTION``): before anything is sent, the call changes nothing."""
    if resolution.attempt <= 0 or not resolution.hold_token:
        raise InvalidArgument(
            f"the resolution of {resolution.key} names no attempt or no hold_token: copy both "
            "from the pending entry Reconcile handed out (Resolution.found(pending, result), "
            "Resolution.not_found(pending, error)), so that the ledger can tell a finding "
            "about this attempt from a late one about an earlier attempt",
            reason="UNFENCED_RESOLUTION", field="resolutions")
    return resolution


def reconcile_request(older_than: Seconds | None, tool: str, limit: int,
                      resolutions: Iterable[Resolution], resolve_only: bool,
                      keys: Iterable[str] = (), principal: str = "") -> Any:
    return pb.ReconcileRequest(
        older_than=duration(older_than),
        tool=tool,
        limit=limit,
        resolve_only=resolve_only,
        resolutions=[
            pb.Resolution(key=r.key, status=status_name(r.status), result=r.result,
                          error=r.error, retryable=r.retryable, attempt=r.attempt,
                          hold_token=r.hold_token)
            for r in map(fenced, resolutions)
        ],
        keys=list(keys),
        principal=principal,
    )


def list_request(run_id: str, tool: str, status: Status | str | None,
                 started_after: datetime | None, started_before: datetime | None,
                 page_size: int) -> Any:
    return pb.ListEntriesRequest(
        run_id=run_id,
        tool=tool,
        status=status_name(status) if status is not None else "STATUS_UNSPECIFIED",
        started_after=timestamp(started_after),
        started_before=timestamp(started_before),
        page_size=page_size,
    )


def next_page(request: Any, response: Any) -> bool:
    """Moves `request` to the page after `response`; False after the last page."""
    token = response.next_page_token
    if not token:
        return False
    if token == request.page_token:
        # A server that hands out the same token again would page forever.
        raise RuntimeError("the ledger answered the same page token twice")
    request.page_token = token
    return True


# --- responses --------------------------------------------------------------------------------


def claim_result(r: Any) -> ClaimResult:
    retry_after = r.retry_after.ToTimedelta().total_seconds() if r.HasField("retry_after") else None
    return ClaimResult(Outcome(r.outcome), Entry.from_pb(r.entry), r.claim_token, r.note,
                       retry_after)


def completion(r: Any, sent: bytes) -> Completion:
    """The answer to a Complete that sent the result `sent`, its entry as the full view shows it:
    the basic view leaves the result out, and a Complete that succeeded recorded that very result
    (or found it recorded), so it is the entry's."""
    r.entry.result = sent
    return Completion(Entry.from_pb(r.entry), r.already_completed)


def reconciliation(r: Any) -> Reconciliation:
    return Reconciliation(
        [Entry.from_pb(e) for e in r.pending], [Entry.from_pb(e) for e in r.resolved],
        [ResolutionResult(x.key, ResolutionOutcome(x.result),
                          Entry.from_pb(x.entry) if x.HasField("entry") else None, x.note)
         for x in r.results])


def entry(r: Any) -> Entry:
    return Entry.from_pb(r.entry)
