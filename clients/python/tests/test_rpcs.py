"""The RPCs through the client, and errors decoded into typed exceptions with reasons."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import grpc
import pytest

from idempotency_ledger import (
    AlreadyResolved,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    KeyReused,
    LeaseEnded,
    Ledger,
    LedgerError,
    NotFound,
    Outcome,
    Resolution,
    ResolutionOutcome,
    StaleClaimToken,
    Status,
    Unauthenticated,
    Unavailable,
)
from idempotency_ledger.testing import LedgerServer

ARGS = {"customer": "c-42", "amount": 200, "currency": "EUR"}


def test_claim_complete_lookup(ledger: Ledger, run_id: str) -> None:
    claim = ledger.claim(run_id, "issue_credit", ARGS, principal="agent-7",
                         lease=timedelta(minutes=5))
    assert claim.outcome == Outcome.CLAIMED and len(claim.claim_token) == 32
    assert claim.entry.status == Status.ATTEMPTING and claim.entry.principal == "agent-7"
    assert claim.entry.lease_expires_at - claim.entry.started_at == timedelta(minutes=5)
    assert claim.entry.finished_at is None and claim.entry.expires_at is None
    done = ledger.complete(claim.key, claim.claim_token, Status.SUCCEEDED, result=b'{"id":1}')
    assert not done.already_completed and done.entry.status == Status.SUCCEEDED
    # Completes ask for the basic view (no echo of the result on the wire); the client puts the
    # result it sent back, so the entry reads as the full view's.
    assert done.entry.result == b'{"id":1}'
    again = ledger.complete(claim.key, claim.claim_token, "SUCCEEDED", result=b'{"id":1}')
    assert again.already_completed
    looked_up = ledger.lookup(claim.key)
    assert looked_up == ledger.lookup(run_id=run_id, tool="issue_credit", arguments=ARGS)
    # Lookup also returns the arguments kept for audit; Complete's answer leaves them out.
    assert looked_up.arguments_json == '{"amount":200,"currency":"EUR","customer":"c-42"}'
    assert dataclasses.replace(looked_up, arguments_json="") == again.entry
    replay = ledger.claim(run_id, "issue_credit", ARGS)
    assert replay.outcome == Outcome.REPLAYED and replay.entry.result == b'{"id":1}'


def test_a_duplicate_member_is_invalid_argument_naming_the_field(ledger: Ledger) -> None:
    with pytest.raises(InvalidArgument) as refused:
        ledger.claim("r", "t", '{"a":1,"a":2}')
    e = refused.value
    assert (e.code, e.reason, e.field) == (grpc.StatusCode.INVALID_ARGUMENT, "DUPLICATE_MEMBER",
                                           "arguments_json")
    assert e.message == 'arguments_json: duplicate member name "a" at byte 7'
    assert "DUPLICATE_MEMBER" in str(e)


@pytest.mark.parametrize(("field", "kwargs"), [
    ("lease", {"lease": timedelta(days=2)}),
    ("retention", {"retention": timedelta(days=400)}),
    ("tool", {"tool": ""}),
])
def test_bad_fields_are_invalid_field(ledger: Ledger, run_id: str, field: str,
                                      kwargs: dict) -> None:
    call = {"run_id": run_id, "tool": "t", "arguments": {}, **kwargs}
    with pytest.raises(InvalidArgument) as refused:
        ledger.claim(**call)
    assert (refused.value.reason, refused.value.field) == ("INVALID_FIELD", field)


def test_a_result_goes_only_with_success(ledger: Ledger, run_id: str) -> None:
    claim = ledger.claim(run_id, "t", {})
    with pytest.raises(InvalidArgument) as refused:
        ledger.complete(claim.key, claim.claim_token, Status.FAILED, result=b"x")
    assert (refused.value.reason, refused.value.field) == ("INVALID_FIELD", "result")
    assert ledger.lookup(claim.key).status == Status.ATTEMPTING  # unchanged


def test_an_explicit_key_with_other_arguments_is_key_reused(ledger: Ledger, run_id: str) -> None:
    ledger.claim("", "issue_credit", ARGS, key=f"{run_id}:step-1")
    with pytest.raises(KeyReused) as reused:
        ledger.claim("", "issue_credit", {**ARGS, "amount": 201}, key=f"{run_id}:step-1")
    assert isinstance(reused.value, FailedPrecondition)
    assert reused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert reused.value.reason == "KEY_REUSED_WITH_DIFFERENT_REQUEST"


def test_a_wrong_token_is_stale_and_another_outcome_is_already_resolved(ledger: Ledger,
                                                                        run_id: str) -> None:
    claim = ledger.claim(run_id, "t", {})
    with pytest.raises(StaleClaimToken) as stale:
        ledger.complete(claim.key, "0" * 32, Status.SUCCEEDED)
    assert stale.value.reason == "STALE_CLAIM_TOKEN"
    ledger.complete(claim.key, claim.claim_token, Status.SUCCEEDED, result=b"1")
    with pytest.raises(AlreadyResolved) as resolved:
        ledger.complete(claim.key, claim.claim_token, Status.FAILED, error="no")
    assert resolved.value.reason == "ALREADY_RESOLVED"
    assert ledger.lookup(claim.key).status == Status.SUCCEEDED


def test_an_absent_key_is_not_found(ledger: Ledger) -> None:
    with pytest.raises(NotFound) as absent:
        ledger.lookup("no-such-key")
    assert (absent.value.code, absent.value.reason) == (grpc.StatusCode.NOT_FOUND,
                                                        "ENTRY_NOT_FOUND")
    with pytest.raises(NotFound):
        ledger.complete("no-such-key", "0" * 32, Status.SUCCEEDED)


def test_a_claimant_may_complete_after_its_lease_expired(ledger: Ledger, run_id: str) -> None:
    claim = ledger.claim(run_id, "t", {}, lease=0.2)
    time.sleep(0.4)
    assert ledger.lookup(claim.key).status == Status.UNKNOWN
    late = ledger.complete(claim.key, claim.claim_token, Status.SUCCEEDED, result=b"late")
    assert late.entry.status == Status.SUCCEEDED


@contextmanager
def paused(server: LedgerServer) -> Iterator[None]:
    """The server process stopped (SIGSTOP): connections stay open, nothing is answered."""
    os.kill(server.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.pid, signal.SIGCONT)


def test_the_clients_own_deadline_is_deadline_exceeded(fresh_server: LedgerServer) -> None:
    # A paused server cannot answer however long the call waits, so only the client's own timer
    # can end the call: no race against the clock (a 1 us deadline was once answered in time).
    with Ledger(fresh_server.address, timeout=5) as ledger:
        with pytest.raises(NotFound):
            ledger.lookup("warm-up")  # the channel is connected before the server stops
        with paused(fresh_server), pytest.raises(DeadlineExceeded) as late:
            ledger.claim("run-1", "t", {}, timeout=0.3)
        assert late.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert late.value.reason is None  # the client's, not the server's: no details
        # The claim was sent: the server resumed and took it, so the truth is in the ledger.
        assert ledger.claim("run-1", "t", {}).outcome in (Outcome.CLAIMED, Outcome.IN_PROGRESS)


def test_a_call_the_server_cannot_finish_in_time_is_deadline_exceeded(
        fresh_server: LedgerServer) -> None:
    # Another process holds SQLite's write lock, so the server cannot write the claim before the
    # deadline however fast the machine: it answers DEADLINE_EXCEEDED (or the client's timer does).
    with Ledger(fresh_server.address, timeout=5) as ledger:
        with pytest.raises(NotFound):
            ledger.lookup("warm-up")
        lock = sqlite3.connect(str(fresh_server.database), timeout=0, isolation_level=None)
        try:
            lock.execute("BEGIN EXCLUSIVE")
            with pytest.raises(DeadlineExceeded) as late:
                ledger.claim("run-1", "t", {}, timeout=0.5)
            assert late.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        with pytest.raises(NotFound):  # nothing was written
            ledger.lookup(run_id="run-1", tool="t", arguments={})


def test_an_unreachable_server_is_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nobody listens there
    # Sent again for a second (the retry budget), then the error: nobody is there.
    with Ledger(f"127.0.0.1:{port}", timeout=2, retry_budget=1) as ledger, pytest.raises(
            Unavailable) as down:
        ledger.lookup("k")
    assert down.value.code == grpc.StatusCode.UNAVAILABLE and down.value.reason is None
    assert isinstance(down.value, LedgerError)


def test_reconcile_resolves_unknown_entries(fresh_server: LedgerServer) -> None:
    with Ledger(fresh_server.address) as ledger:
        found = ledger.claim("run-1", "issue_credit", {"n": 1})
        ledger.complete(found.key, found.claim_token, Status.UNKNOWN, error="timed out")
        missing = ledger.claim("run-1", "issue_credit", {"n": 2}, lease=0.2)  # never completed
        ledger.claim("run-1", "send_reply", {"n": 3}, lease=0.2)
        time.sleep(0.3)
        batch = ledger.reconcile(tool="issue_credit", older_than=0.1)
        assert [e.key for e in batch.pending] == [found.key, missing.key]  # oldest first
        assert all(e.status == Status.UNKNOWN for e in batch.pending)
        # Each hand-out carries the attempt and a hold token, which the resolutions send back.
        assert all(e.attempt == 1 and e.hold_token for e in batch.pending)
        assert ledger.reconcile(tool="issue_credit").pending == []  # held for this caller
        first, second = batch.pending
        done = ledger.reconcile(resolutions=[
            Resolution.found(first, b'{"credit_id":"cr-1"}'),
            Resolution.not_found(second, "no such credit"),
        ])
        assert [(e.key, e.status) for e in done.resolved] == [(found.key, Status.SUCCEEDED),
                                                               (missing.key, Status.FAILED)]
        # Each resolution is answered, in the request's order, with the entry as it stands.
        assert [(r.key, r.result, r.applied, r.entry.status) for r in done.results] == [
            (found.key, ResolutionOutcome.APPLIED, True, Status.SUCCEEDED),
            (missing.key, ResolutionOutcome.APPLIED, True, Status.FAILED)]
        assert not any(e.hold_token for e in done.resolved)  # set on hand-outs only
        assert [e.tool for e in done.pending] == ["send_reply"]
        assert ledger.claim("run-1", "issue_credit", {"n": 1}).outcome == Outcome.REPLAYED
        retry = ledger.claim("run-1", "issue_credit", {"n": 2})
        assert (retry.outcome, retry.entry.attempt) == (Outcome.CLAIMED, 2)


def test_tls_with_a_root_certificate(ledger_bin: Path, tmp_path: Path) -> None:
    if subprocess.run(["openssl", "version"], capture_output=True).returncode != 0:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj", "/CN=ledger",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True)
    with LedgerServer(ledger_bin, args=["--tls-cert", str(cert), "--tls-key", str(key)]) as tls:
        with Ledger(tls.address, root_certificates=cert) as ledger:
            claim = ledger.claim("run-1", "t", {})
            assert claim.outcome == Outcome.CLAIMED
        # https:// means TLS, as in the TypeScript client and the CLI.
        with Ledger(f"https://127.0.0.1:{tls.port}", root_certificates=cert) as ledger:
            assert ledger.lookup(claim.key).key == claim.key
        for plain_target in (tls.address, f"http://127.0.0.1:{tls.port}"):
            with Ledger(plain_target, timeout=2) as plaintext, pytest.raises(Unavailable):
                plaintext.lookup(claim.key)


def test_renew_lease_extends_the_attempt_from_now(ledger: Ledger, run_id: str) -> None:
    claim = ledger.claim(run_id, "t", {}, lease=1)
    renewed = ledger.renew_lease(claim.key, claim.claim_token, timedelta(minutes=10))
    assert renewed.status == Status.ATTEMPTING and renewed.key == claim.key
    assert renewed.lease_expires_at - claim.entry.lease_expires_at > timedelta(minutes=9)
    time.sleep(1.2)  # past the first lease: the renewed one holds
    assert ledger.lookup(claim.key).status == Status.ATTEMPTING
    # Unset: the server's default lease (60 s), counted from now.
    default = ledger.renew_lease(claim.key, claim.claim_token)
    assert timedelta(seconds=55) < default.lease_expires_at - renewed.started_at < timedelta(
        seconds=70)


def test_renew_lease_refusals(ledger: Ledger, run_id: str) -> None:
    claim = ledger.claim(run_id, "t", {"n": 1})
    with pytest.raises(StaleClaimToken) as stale:
        ledger.renew_lease(claim.key, "0" * 32, 5)
    assert (stale.value.code, stale.value.reason) == (grpc.StatusCode.FAILED_PRECONDITION,
                                                      "STALE_CLAIM_TOKEN")
    with pytest.raises(InvalidArgument) as too_long:
        ledger.renew_lease(claim.key, claim.claim_token, timedelta(days=2))  # --max-lease 1h
    assert (too_long.value.reason, too_long.value.field) == ("INVALID_FIELD", "lease")
    ledger.complete(claim.key, claim.claim_token, Status.SUCCEEDED, result=b"1")
    with pytest.raises(LeaseEnded) as resolved:
        ledger.renew_lease(claim.key, claim.claim_token, 5)
    assert isinstance(resolved.value, FailedPrecondition)
    assert resolved.value.reason == "LEASE_ENDED"
    assert ledger.lookup(claim.key).status == Status.SUCCEEDED  # unchanged

    ended = ledger.claim(run_id, "t", {"n": 2}, lease=0.2)
    time.sleep(0.4)
    with pytest.raises(LeaseEnded):  # it reads UNKNOWN: a reconciler may be on it
        ledger.renew_lease(ended.key, ended.claim_token, 5)
    assert ledger.lookup(ended.key).status == Status.UNKNOWN


def test_reconcile_resolve_only_hands_out_nothing(fresh_server: LedgerServer) -> None:
    with Ledger(fresh_server.address) as ledger:
        first = ledger.claim("run-1", "issue_credit", {"n": 1})
        ledger.complete(first.key, first.claim_token, Status.UNKNOWN, error="timed out")
        second = ledger.claim("run-1", "issue_credit", {"n": 2})
        ledger.complete(second.key, second.claim_token, Status.UNKNOWN, error="timed out")
        (held,) = ledger.reconcile(keys=[first.key]).pending
        done = ledger.reconcile(resolutions=[Resolution.found(held, b'"found"')],
                                resolve_only=True)
        assert done.pending == []
        assert [(e.key, e.status) for e in done.resolved] == [(first.key, Status.SUCCEEDED)]
        # Nothing was held by the resolve-only call: the other entry is handed out now.
        assert [e.key for e in ledger.reconcile().pending] == [second.key]


def test_errors_name_their_code_once(auth_server: LedgerServer) -> None:
    with Ledger(auth_server.address, token="wrong") as ledger, \
            pytest.raises(Unauthenticated) as refused:
        ledger.lookup("k")
    assert refused.value.reason == "UNAUTHENTICATED"
    assert str(refused.value) == f"[UNAUTHENTICATED] {refused.value.message}"
    with Ledger(auth_server.address, token="token-a") as ledger, \
            pytest.raises(NotFound) as absent:
        ledger.lookup("k")
    assert str(absent.value) == f"[NOT_FOUND ENTRY_NOT_FOUND] {absent.value.message}"


@pytest.mark.parametrize(("target", "address"), [
    ("127.0.0.1:{port}", "127.0.0.1:{port}"),
    ("http://127.0.0.1:{port}", "127.0.0.1:{port}"),
    ("http://localhost:{port}/", "localhost:{port}"),
])
def test_plaintext_targets(server: LedgerServer, target: str, address: str) -> None:
    with Ledger(target.format(port=server.port)) as ledger:
        assert ledger.address == address.format(port=server.port)
        with pytest.raises(NotFound):
            ledger.lookup("no-such-key")


@pytest.mark.parametrize(("target", "kwargs", "message"), [
    ("ftp://127.0.0.1:1", {}, "http:// or https://"),
    ("http://127.0.0.1:1/v1", {}, "nothing more"),
    ("http://127.0.0.1:99999", {}, "out of range"),
    ("http://127.0.0.1:1", {"tls": True}, "use https://"),
    ("http://127.0.0.1:1", {"root_certificates": b"pem"}, "use https://"),
    ("https://127.0.0.1:1", {"tls": False}, "tls=False"),
    ("127.0.0.1:1/x", {}, "expected host:port"),
])
def test_bad_targets_are_refused_before_connecting(target: str, kwargs: dict,
                                                   message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Ledger(target, **kwargs)
