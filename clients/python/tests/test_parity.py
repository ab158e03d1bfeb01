"""The client conforms to clients/parity.json, the one list of what the Python and TypeScript
clients share: every error class exists with its parent, every gRPC code and reason the list
names converts to its class, the defaults (the reconciler's and who settles too) and the notes
are the client's, and each row of the list is in both READMEs' parity tables. (How an unknown
outcome is settled, the list's ``settlement``, is shown against the real server in
test_confirm.py.)

The conversions are checked through a real gRPC call: a small gRPC server in this process
answers the ledger's Lookup with the code and ErrorInfo reason asked for (most of them, such as
STORE_FULL or STORE_CORRUPT, the real server sends only when its disk or database fails), and
the client's own call path turns the error into a class.
"""

from __future__ import annotations

import inspect
import json
import os
import socket
from collections.abc import Iterator
from concurrent import futures
from dataclasses import fields, replace
from pathlib import Path

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

import idempotency_ledger
from idempotency_ledger import AsyncLedger, Canonicalization, Ledger, LedgerError, Reconciler
from idempotency_ledger import _core as core
from idempotency_ledger import _run_once as once
from idempotency_ledger._core import NOT_PERFORMED_NOTE
from idempotency_ledger._proto import ledger_pb2 as pb
from idempotency_ledger import _wire as wire
from idempotency_ledger._wire import canonicalization_name as _canonicalization
from idempotency_ledger.errors import UNKNOWN_NOTE
from idempotency_ledger.tools import missing_run_id_view, model_view

PARITY = json.loads(
    (Path(__file__).resolve().parents[2] / "parity.json").read_text(encoding="utf-8"))
ERRORS = PARITY["errors"]
BY_CONCEPT = {e["concept"]: e for e in ERRORS}
WITH_CODE = [e for e in ERRORS if e["code"]]


def python_class(concept: str) -> type:
    name = BY_CONCEPT[concept]["python"]
    cls = getattr(idempotency_ledger, name, None)
    assert isinstance(cls, type), f"idempotency_ledger.{name} ({concept}) does not exist"
    return cls


@pytest.mark.parametrize("error", ERRORS, ids=[e["concept"] for e in ERRORS])
def test_every_error_class_exists_with_its_parent(error: dict) -> None:
    cls = python_class(error["concept"])
    assert issubclass(cls, Exception)
    if error["parent"] is None:
        assert cls is LedgerError
    else:
        parent = python_class(error["parent"])
        assert issubclass(cls, parent), f"{cls.__name__} is not a {parent.__name__}"
        assert cls is not parent


def test_the_list_names_every_error_class_the_client_exports() -> None:
    listed = {e["python"] for e in ERRORS}
    exported = {name for name in idempotency_ledger.__all__
                if isinstance(getattr(idempotency_ledger, name), type)
                and issubclass(getattr(idempotency_ledger, name), LedgerError)}
    # ArgumentsRefused is the local key derivation's InvalidArgument, not a class of the wire.
    assert exported - listed == {"ArgumentsRefused"}


class _Refuser(grpc.GenericRpcHandler):
    """Answers every ledger call with the error its Lookup key names: ``CODE`` or
    ``CODE/REASON``, detailed as the ledger details its errors (ErrorInfo, and RetryInfo)."""

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        def refuse(request: pb.LookupRequest, context: grpc.ServicerContext) -> None:
            code_name, _, reason = request.key.partition("/")
            code = grpc.StatusCode[code_name]
            status = status_pb2.Status(code=code.value[0], message=f"refused: {request.key}")
            if reason:
                detail = any_pb2.Any()
                detail.Pack(error_details_pb2.ErrorInfo(domain="idempotency.v1", reason=reason))
                status.details.append(detail)
                retry = any_pb2.Any()
                retry.Pack(error_details_pb2.RetryInfo(retry_delay={"seconds": 2}))
                status.details.append(retry)
            context.set_trailing_metadata(
                (("grpc-status-details-bin", status.SerializeToString()),))
            context.abort(code, status.message)

        return grpc.unary_unary_rpc_method_handler(
            refuse, request_deserializer=pb.LookupRequest.FromString,
            response_serializer=pb.LookupResponse.SerializeToString)


@pytest.fixture(scope="module")
def refuser() -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((_Refuser(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


@pytest.mark.parametrize("error", WITH_CODE, ids=[e["concept"] for e in WITH_CODE])
def test_every_code_and_reason_converts_to_its_class(refuser: str, error: dict) -> None:
    cls = python_class(error["concept"])
    key = error["code"] + (f"/{error['reason']}" if error["reason"] else "")
    with Ledger(refuser, timeout=5) as ledger, pytest.raises(LedgerError) as raised:
        ledger.lookup(key)
    assert type(raised.value) is cls, f"{key} converted to {type(raised.value).__name__}"
    assert raised.value.code == grpc.StatusCode[error["code"]]
    assert raised.value.reason == (error["reason"] or None)
    if error["reason"]:
        assert raised.value.retry_after == 2.0


@pytest.mark.parametrize("reason", ["STORE_IO_ERROR", "STORE_CONTENTION", "STORE_READ_ONLY",
                                    "STORE_UNAVAILABLE"])
def test_the_store_reasons_of_unavailable_stay_unavailable(refuser: str, reason: str) -> None:
    unavailable = python_class("unavailable")
    with Ledger(refuser, timeout=5) as ledger, pytest.raises(unavailable) as raised:
        ledger.lookup(f"UNAVAILABLE/{reason}")
    assert type(raised.value) is unavailable and raised.value.retry_after == 2.0


def test_a_reason_under_another_code_does_not_pick_the_subclass(refuser: str) -> None:
    with Ledger(refuser, timeout=5) as ledger, pytest.raises(LedgerError) as raised:
        ledger.lookup("UNAVAILABLE/STALE_CLAIM_TOKEN")
    assert type(raised.value) is python_class("unavailable")


def _default(function: object, parameter: str) -> object:
    return inspect.signature(function).parameters[parameter].default  # type: ignore[arg-type]


def test_the_defaults_are_the_clients() -> None:
    defaults = PARITY["defaults"]
    assert idempotency_ledger.DEFAULT_WAIT == defaults["wait_seconds"]
    for function in (Ledger.run_once, AsyncLedger.run_once, idempotency_ledger.tools.ledger_tool):
        assert _default(function, "wait") == defaults["wait_seconds"], function
    assert idempotency_ledger.RENEW_EVERY_FRACTION_OF_LEASE == pytest.approx(
        defaults["renew_every_fraction_of_lease"], abs=1e-12)
    for function in (Ledger.run_once, AsyncLedger.run_once, Ledger.claim, AsyncLedger.claim,
                     idempotency_ledger.tools.ledger_tool):
        assert _canonicalization(_default(function, "canonicalization")) == defaults[
            "canonicalization"], function
    assert _canonicalization(Canonicalization.JCS) == defaults["canonicalization"]


def test_every_claim_of_run_once_waits_for_what_the_list_says() -> None:
    # The Claim run-once sends first (test_claims_per_repeat.py counts them over the wire).
    ledger = Ledger("127.0.0.1:1")
    try:
        call = ledger._call("r", "t", {}, lambda a: None, codec=idempotency_ledger.JSON, wait=10,
                            key=None, canonicalization="JCS", lease=None, retention=None,
                            principal=None, timeout=None, action_timeout=None, renew=True,
                            not_executed=(), confirm=None, confirm_delay=0)
        step = next(once.attempt(ledger._policy, call))
    finally:
        ledger.close()
    assert isinstance(step, core.Rpc) and step.method == "Claim"
    assert pb.WaitFor.Name(step.request.wait_for) == PARITY["defaults"]["run_once_wait_for"]


def test_every_complete_asks_for_the_view_of_the_list() -> None:
    request = wire.complete_request("k", "t", "SUCCEEDED", b"r", "", False)
    assert pb.EntryView.Name(request.view) == PARITY["defaults"]["complete_view"]


@pytest.mark.parametrize("form", PARITY["defaults"]["targets"])
def test_every_target_form_is_accepted(form: str) -> None:
    target = form.replace("host", "127.0.0.1").replace("port", "50051")
    ledger = Ledger(target)
    try:
        assert ledger.address == "127.0.0.1:50051"
    finally:
        ledger.close()


def test_the_failover_and_confirm_defaults_are_the_clients() -> None:
    defaults = PARITY["defaults"]
    assert idempotency_ledger.DEFAULT_RETRY_BUDGET == defaults["retry_budget_seconds"]
    assert idempotency_ledger.DEFAULT_CONFIRM_DELAY == defaults["confirm_delay_seconds"]
    for function in (Ledger.run_once, AsyncLedger.run_once, Ledger.attempt):
        assert _default(function, "confirm_delay") == defaults["confirm_delay_seconds"]
    assert _default(Ledger.__init__, "retry_budget") == defaults["retry_budget_seconds"]


def test_what_the_model_reads_is_the_lists() -> None:
    reads = PARITY["model_reads"]
    assert reads["outcome_unknown"] == {"status": "outcome_unknown", "note": UNKNOWN_NOTE}
    assert reads["not_performed"] == {"status": "not_executed", "note": NOT_PERFORMED_NOTE}
    for answer in PARITY["confirm"]["answers"].values():
        name = answer["python"].partition("(")[0]
        assert callable(getattr(idempotency_ledger, name)), name


def test_the_settling_poll_and_the_tool_decorators_confirm_delay_are_the_clients() -> None:
    defaults = PARITY["defaults"]
    assert list(core._SETTLING_POLL) == defaults["settling_poll_seconds"]
    assert _default(idempotency_ledger.tools.ledger_tool, "confirm_delay") == defaults[
        "confirm_delay_seconds"]


def test_who_settles_by_default_is_the_clients() -> None:
    settlement = PARITY["settlement"]
    here = {"host": socket.gethostname(), "pid": os.getpid()}
    confirm = settlement["default_principal"]["confirm"].format(**here)
    reconciler = settlement["default_principal"]["reconciler"].format(**here)
    assert core.default_principal("confirm") == confirm
    assert settlement["principal_order"] == ["call", "client", "default"]
    for principal, expected in (("", confirm), ("agent-7", "agent-7")):
        ledger = Ledger("127.0.0.1:1", principal=principal)
        try:
            assert ledger._policy.settler == expected
            call = ledger._call("r", "t", {}, lambda a: None, codec=idempotency_ledger.JSON,
                                wait=None, key=None, canonicalization="JCS", lease=None,
                                retention=None, principal=None, timeout=None,
                                action_timeout=None, renew=True, not_executed=(),
                                confirm=None, confirm_delay=0)
            assert core.settler(ledger._policy, call) == expected
            for empty in (None, ""):
                assert core.settler(ledger._policy, replace(call, principal=empty)) == expected
            assert core.settler(ledger._policy, replace(call, principal="call-1")) == "call-1"
            assert Reconciler(ledger, {"t": lambda a: None}).principal == reconciler
            assert Reconciler(ledger, {"t": lambda a: None}, principal="").principal == reconciler
        finally:
            ledger.close()


def test_the_reconcilers_defaults_are_the_clients() -> None:
    defaults = PARITY["reconciler"]
    names = {"older_than_seconds": "older_than", "batch": "batch",
             "interval_seconds": "interval", "rate_per_second": "rate",
             "backoff_seconds": "backoff", "max_backoff_seconds": "max_backoff"}
    assert set(defaults) - {"about"} == set(names)
    for key, parameter in names.items():
        assert _default(Reconciler.__init__, parameter) == defaults[key], key


def test_a_gated_and_a_declined_call_read_the_lists_status_and_the_servers_note() -> None:
    reads = PARITY["model_reads"]
    entry = idempotency_ledger.Entry(
        key="k", run_id="r", tool="t", fingerprint="f", status=idempotency_ledger.Status.DENIED,
        attempt=1, result=b"", error="", retryable=False, principal="", started_at=None,
        finished_at=None, lease_expires_at=None, expires_at=None, replay_count=0,
        external_ref="")
    for kind, row in ((idempotency_ledger.Kind.AWAITING_APPROVAL, "awaiting_approval"),
                      (idempotency_ledger.Kind.DENIED, "denied")):
        note = f"the server's note for {row}"
        outcome = idempotency_ledger.CallOutcome(kind, note=note, entry=entry)
        assert model_view(outcome) == {"status": reads[row]["status"], "note": note}
    assert idempotency_ledger.AwaitingApprovalError("n", entry).for_model() == {
        "status": reads["awaiting_approval"]["status"], "note": "n"}
    assert idempotency_ledger.DeniedError("n", entry).for_model() == {
        "status": reads["denied"]["status"], "note": "n"}


def test_the_approval_methods_are_the_clients() -> None:
    methods = PARITY["approvals"]["methods"]["python"]
    assert methods == ["decide", "extend_run", "watch_approvals"]
    for client in (Ledger, AsyncLedger):
        for name in methods:
            assert callable(getattr(client, name, None)), f"{client.__name__}.{name}"
    assert list(inspect.signature(Ledger.decide).parameters)[1:5] == [
        "key", "fingerprint", "decision", "reason"]
    assert list(inspect.signature(Ledger.extend_run).parameters)[1:3] == ["run_id", "at_least"]
    assert list(inspect.signature(Ledger.watch_approvals).parameters)[1:2] == ["cursor"]
    assert inspect.isasyncgenfunction(AsyncLedger.watch_approvals)
    for function in (Ledger.claim, AsyncLedger.claim, Ledger.run_once, AsyncLedger.run_once):
        assert _default(function, "require_approval") is False, function


def test_a_missing_run_id_reads_the_lists_note() -> None:
    expected = PARITY["model_reads"]["missing_run_id"]
    assert missing_run_id_view("issue_credit") == {
        "status": expected["status"], "note": expected["note"].format(tool="issue_credit")}


PARITY_ROWS = (
    [f"defaults.{k}" for k in PARITY["defaults"]]
    + [f"{section}.{k}" for section in ("settlement", "reconciler", "reconciler_tools",
                                        "model_reads", "model_types", "confirm", "approvals")
       for k in PARITY[section] if k != "about"]
    + ["errors"])


@pytest.mark.parametrize("readme", ["python", "typescript"])
def test_every_row_of_the_list_is_documented_in_the_readmes_parity_table(readme: str) -> None:
    text = (Path(__file__).resolve().parents[2] / readme / "README.md").read_text(
        encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    missing = [row for row in PARITY_ROWS if not any(f"| `{row}`" in line for line in rows)]
    assert missing == [], f"clients/{readme}/README.md has no parity row for {missing}"


def test_a_tool_without_confirm_is_refused_as_the_list_says() -> None:
    row = PARITY["reconciler_tools"]["without_confirm"]
    assert (row["behaviour"], row["python"]) == ("refused_at_construction", "ValueError")
    ledger = Ledger("127.0.0.1:1")
    try:
        with pytest.raises(ValueError, match="tool open_ticket has no confirm"):
            Reconciler(ledger, {"issue_credit": lambda a: None, "open_ticket": None})
    finally:
        ledger.close()


def test_the_model_types_of_reconciles_answers_are_the_clients() -> None:
    types = PARITY["model_types"]
    outcome, result = types["resolution_outcome"], types["resolution_result"]
    assert outcome["python"] == "ResolutionOutcome" and result["python"] == "ResolutionResult"
    exported = {name: getattr(idempotency_ledger, name) for name in idempotency_ledger.__all__}
    # Every value of the generated enum, by the list's name, and no other.
    generated = pb.ResolutionOutcome.values()
    assert [exported["ResolutionOutcome"](n).name for n in generated] == outcome["values"]
    assert [f.name for f in fields(exported["ResolutionResult"])] == result["fields"]
