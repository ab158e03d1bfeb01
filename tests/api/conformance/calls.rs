//! The suite's vocabulary: the intent most tests claim (RUN, TOOL, ARGS), each Ledger call for
//! the default tenant as `name_ok` (which must succeed) and `name_result` (the caller judges),
//! the inputs the tests build (a success, a failure, an unknown report, a claim with a lease,
//! a retention or a wait, a finding), and the set-ups a test starts from in one call
//! (`claimed_on`, `succeeded_on`, `claimed_with`, `unknown_on`). What each test checks stays in
//! the test.

use std::time::Duration;

use idempotency_ledger::domain::{FinalStatus, HoldToken, Key, Status, Tenant};
use idempotency_ledger::error::LedgerError;
use idempotency_ledger::ledger::{
    ClaimInput, ClaimOutput, CompleteInput, CompleteOutput, EntryView, Ledger, ListInput,
    ListOutput, LookupInput, ReconcileInput, ReconcileOutput, RenewInput, ResolutionInput,
};

pub(super) use crate::support::typed::{
    claim_input, claim_key, claim_token, intent, key, principal, run_id, tool,
};
use crate::support::{Backend, TestLedger, test_limits};

pub(super) const RUN: &str = "run-1";

pub(super) const TOOL: &str = "issue_credit";

pub(super) const ARGS: &str = r#"{"customer":"c-42","amount":200,"currency":"EUR"}"#;

pub(super) fn tenant() -> Tenant {
    Tenant::default_tenant()
}

pub(super) async fn claim(ledger: &Ledger, run: &str, tool: &str, args: &str) -> ClaimOutput {
    claim_ok(ledger, claim_input(run, tool, args)).await
}

pub(super) fn done(
    key: impl AsRef<str>,
    token: &str,
    status: FinalStatus,
    result: &[u8],
) -> CompleteInput {
    CompleteInput {
        key: self::key(key),
        claim_token: claim_token(token),
        status,
        result: result.to_vec(),
        error: String::new(),
        retryable: false,
    }
}

pub(super) fn failed(
    key: impl AsRef<str>,
    token: &str,
    error: &str,
    retryable: bool,
) -> CompleteInput {
    CompleteInput {
        key: self::key(key),
        claim_token: claim_token(token),
        status: FinalStatus::Failed,
        result: Vec::new(),
        error: error.into(),
        retryable,
    }
}

pub(super) fn token(out: &ClaimOutput) -> String {
    out.claim_token
        .clone()
        .map(String::from)
        .expect("a claimed outcome carries a token")
}

pub(super) async fn claim_ok(ledger: &Ledger, input: ClaimInput) -> ClaimOutput {
    claim_result(ledger, input).await.expect("claim")
}

pub(super) async fn claim_result(
    ledger: &Ledger,
    input: ClaimInput,
) -> Result<ClaimOutput, LedgerError> {
    ledger.claim(&tenant(), input).await
}

pub(super) async fn complete_ok(ledger: &Ledger, input: CompleteInput) -> CompleteOutput {
    complete(ledger, input).await.expect("complete")
}

pub(super) async fn complete(
    ledger: &Ledger,
    input: CompleteInput,
) -> Result<CompleteOutput, LedgerError> {
    ledger.complete(&tenant(), input).await
}

/// Completes the attempt `claimed` holds as succeeded with `result`.
pub(super) async fn succeed(
    ledger: &Ledger,
    claimed: &ClaimOutput,
    result: &[u8],
) -> CompleteOutput {
    let key = &claimed.entry.entry.key;
    complete_ok(
        ledger,
        done(key, &token(claimed), FinalStatus::Succeeded, result),
    )
    .await
}

/// Completes the attempt `claimed` holds as failed with `error`.
pub(super) async fn fail(
    ledger: &Ledger,
    claimed: &ClaimOutput,
    error: &str,
    retryable: bool,
) -> CompleteOutput {
    let key = &claimed.entry.entry.key;
    complete_ok(ledger, failed(key, &token(claimed), error, retryable)).await
}

pub(super) async fn lookup_ok(ledger: &Ledger, input: LookupInput) -> EntryView {
    lookup_result(ledger, input).await.expect("lookup")
}

pub(super) async fn lookup_result(
    ledger: &Ledger,
    input: LookupInput,
) -> Result<EntryView, LedgerError> {
    ledger.lookup(&tenant(), input).await
}

/// [`lookup_key`], which must find the entry.
pub(super) async fn lookup_found(ledger: &Ledger, key: impl AsRef<str>) -> EntryView {
    lookup_key(ledger, key).await.expect("lookup")
}

pub(super) async fn reconcile_ok(ledger: &Ledger, input: ReconcileInput) -> ReconcileOutput {
    reconcile_result(ledger, input).await.expect("reconcile")
}

pub(super) async fn reconcile_result(
    ledger: &Ledger,
    input: ReconcileInput,
) -> Result<ReconcileOutput, LedgerError> {
    ledger.reconcile(&tenant(), input).await
}

pub(super) async fn renew_ok(ledger: &Ledger, input: RenewInput) -> EntryView {
    renew_result(ledger, input).await.expect("renew")
}

pub(super) async fn renew_result(
    ledger: &Ledger,
    input: RenewInput,
) -> Result<EntryView, LedgerError> {
    ledger.renew_lease(&tenant(), input).await
}

pub(super) async fn list_ok(ledger: &Ledger, input: ListInput) -> ListOutput {
    ledger.list_entries(&tenant(), input).await.expect("list")
}

/// A claim for `run`, TOOL and ARGS with this lease.
pub(super) fn leased(run: &str, lease: Duration) -> ClaimInput {
    ClaimInput {
        lease: Some(lease),
        ..claim_input(run, TOOL, ARGS)
    }
}

/// A claim for `run`, TOOL and ARGS with this retention.
pub(super) fn retained(run: &str, retention: Duration) -> ClaimInput {
    ClaimInput {
        retention: Some(retention),
        ..claim_input(run, TOOL, ARGS)
    }
}

/// Claims RUN, TOOL and ARGS: the intent most tests are about.
pub(super) async fn claim_the_intent(ledger: &Ledger) -> ClaimOutput {
    claim(ledger, RUN, TOOL, ARGS).await
}

/// The claimant of `claimed` reports that it does not know whether the effect happened.
pub(super) fn unknown_report(claimed: &ClaimOutput, error: &str) -> CompleteInput {
    CompleteInput {
        error: error.into(),
        ..done(
            &claimed.entry.entry.key,
            &token(claimed),
            FinalStatus::Unknown,
            b"",
        )
    }
}

/// A ledger on `b` with an attempt claimed for RUN, TOOL and ARGS, and its key: where most
/// tests start.
pub(super) async fn claimed_on(b: Backend) -> (TestLedger, ClaimOutput, String) {
    let t = TestLedger::new(b).await;
    let first = claim_the_intent(&t.ledger).await;
    let key = first.entry.entry.key.to_string();
    (t, first, key)
}

/// As [`claimed_on`], the attempt then completed as succeeded with `result`.
pub(super) async fn succeeded_on(b: Backend, result: &[u8]) -> (TestLedger, ClaimOutput, String) {
    let (t, first, key) = claimed_on(b).await;
    succeed(&t.ledger, &first, result).await;
    (t, first, key)
}

/// A ledger on `b` with the claim `input` made.
pub(super) async fn claimed_with(b: Backend, input: ClaimInput) -> (TestLedger, ClaimOutput) {
    let t = TestLedger::new(b).await;
    let first = claim_ok(&t.ledger, input).await;
    (t, first)
}

/// A ledger on `b` with `n` attempts of TOOL reported unknown by their claimants (see
/// [`unknown_entries`]), and their keys.
pub(super) async fn unknown_on(b: Backend, n: usize) -> (TestLedger, Vec<String>) {
    let t = TestLedger::new(b).await;
    let keys = unknown_entries(&t, TOOL, n).await;
    (t, keys)
}

/// Lookup by key, without the arguments kept for audit (which Claim and Complete leave out), so
/// the entry compares equal to theirs; Lookup must show the arguments.
pub(super) async fn lookup_key(
    ledger: &Ledger,
    key: impl AsRef<str>,
) -> Result<idempotency_ledger::ledger::EntryView, LedgerError> {
    let mut view = lookup_result(ledger, LookupInput::by_key(self::key(key))).await?;
    let arguments = view.entry.arguments.take();
    assert!(
        arguments.as_deref().is_some_and(|a| a.starts_with('{')),
        "Lookup shows the stored arguments: {arguments:?}"
    );
    Ok(view)
}

/// Waits (up to 10 s) until `n` claims are parked on `ledger` (each found the attempt in flight
/// and sleeps until a change); panics with how many are otherwise.
pub(super) async fn until_waiting(ledger: &Ledger, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while ledger.waits().waiting_claims() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {n} claims are parked waiting after 10 s",
            ledger.waits().waiting_claims()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(ledger.waits().waiting_claims(), n, "no claim waits twice");
}

pub(super) fn waiting(run: &str, wait: Duration) -> ClaimInput {
    ClaimInput {
        wait: Some(wait),
        ..claim_input(run, TOOL, ARGS)
    }
}

/// Claims `n` entries of `tool` (runs `run-0`..) and reports them UNKNOWN; returns their keys
/// in claim order.
pub(super) async fn unknown_entries(t: &TestLedger, tool: &str, n: usize) -> Vec<String> {
    let mut keys = Vec::new();
    for i in 0..n {
        let out = claim(&t.ledger, &format!("run-{i}"), tool, ARGS).await;
        complete_ok(&t.ledger, unknown_report(&out, "timeout")).await;
        keys.push(out.entry.entry.key.to_string());
        t.clock.advance(Duration::from_millis(10));
    }
    keys
}

pub(super) async fn reconcile(ledger: &Ledger, input: ReconcileInput) -> Vec<String> {
    reconcile_ok(ledger, input)
        .await
        .pending
        .into_iter()
        .map(|v| v.entry.key.into())
        .collect()
}

/// A finding about `key`, not yet fenced (see [`fenced`]).
pub(super) fn finding(
    key: impl AsRef<str>,
    status: FinalStatus,
    result: &[u8],
    retryable: bool,
) -> ResolutionInput {
    ResolutionInput {
        key: self::key(key),
        status,
        result: result.to_vec(),
        error: if status == FinalStatus::Failed {
            "not found".into()
        } else {
            String::new()
        },
        retryable,
        attempt: 0,
        hold_token: HoldToken::none(),
    }
}

/// `findings` as a reconciler sends them: each key taken first with `Reconcile(keys)`, and its
/// finding carrying the attempt and hold token it was handed out with. A key that is not
/// handed out (resolved, in its lease, absent, held by another) gets attempt 1 under a hold
/// nobody was given.
pub(super) async fn fenced(t: &TestLedger, findings: Vec<ResolutionInput>) -> Vec<ResolutionInput> {
    let keys: Vec<Key> = findings.iter().map(|f| f.key.clone()).collect();
    let pending = if keys.is_empty() {
        Vec::new()
    } else {
        reconcile_ok(
            &t.ledger,
            ReconcileInput {
                keys,
                ..Default::default()
            },
        )
        .await
        .pending
    };
    findings
        .into_iter()
        .map(|mut f| {
            match pending.iter().find(|v| v.entry.key == f.key) {
                Some(v) => {
                    f.attempt = v.entry.attempt;
                    f.hold_token = v.entry.hold_token.clone();
                }
                None => {
                    f.attempt = 1;
                    f.hold_token = HoldToken::parse("a-hold-nobody-was-given").expect("a hold");
                }
            }
            f
        })
        .collect()
}

pub(super) async fn resolve(
    t: &TestLedger,
    findings: Vec<ResolutionInput>,
) -> Vec<(String, Status)> {
    let findings = fenced(t, findings).await;
    reconcile_ok(
        &t.ledger,
        ReconcileInput {
            resolutions: findings,
            ..Default::default()
        },
    )
    .await
    .resolved
    .into_iter()
    .map(|v| (v.entry.key.into(), v.status))
    .collect()
}

pub(super) fn renewal(key: impl AsRef<str>, token: &str, lease: Option<Duration>) -> RenewInput {
    RenewInput {
        key: self::key(key),
        claim_token: claim_token(token),
        lease,
    }
}

/// A second server over the same database, with its own memory.
pub(super) async fn other_server(t: &TestLedger) -> Ledger {
    Ledger::new(t.db.store(4).await, t.clock.clone(), test_limits())
}

pub(super) async fn succeeded_entry(ledger: &Ledger, run: &str, result: &[u8]) -> String {
    let first = claim(ledger, run, TOOL, ARGS).await;
    let key = first.entry.entry.key.to_string();
    succeed(ledger, &first, result).await;
    key
}

pub(super) async fn replay_count_on(ledger: &Ledger, key: impl AsRef<str>) -> u64 {
    lookup_found(ledger, key).await.entry.replay_count
}
