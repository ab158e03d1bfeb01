//! Approvals and time seen from outside the write that made it, on every store: a request past
//! `decide_by` (or an approval past `execute_by`) reads lapsed everywhere from that moment,
//! before anything records it, and the next claim asks again at attempt + 1; an approval covers
//! the retries made before its `execute_by` only; and a paused run keeps every key, whether its
//! entries finished before the pause or during it.

use std::time::Duration;

use idempotency_ledger::domain::{
    ApprovalState, Decision, EventKind, FinalStatus, Micros, Principal, Status, Tenant,
};
use idempotency_ledger::ledger::{
    ClaimInput, ClaimOutput, CompleteInput, DecideInput, Ledger, ListInput, LookupInput, Outcome,
};

use crate::support::typed::{claim_input, principal};
use crate::support::{Backend, TestLedger, test_limits};

on_every_store!(
    a_lapsed_request_reads_lapsed_before_anything_records_it,
    an_approval_unused_past_execute_by_reads_lapsed_and_is_asked_again,
    a_retry_after_execute_by_of_an_approved_attempt_asks_again,
    an_entry_finished_while_its_run_awaits_a_decision_replays_after_its_retention,
    an_entry_finished_while_another_call_of_its_run_awaits_keeps_its_key_through_a_denial,
    the_sweep_keeps_an_entry_whose_finish_did_not_see_its_run_pause,
    a_watchers_cursor_never_passes_an_event_after_the_history_was_pruned,
);

const RUN: &str = "run-paused";
const REFUND: &str = "issue_refund";
const ARGS: &str = r#"{"order":"o-1","amount":250}"#;
const LOOKUP_ORDER: &str = "lookup_order";
const ORDER: &str = r#"{"order":"o-1"}"#;

fn tenant() -> Tenant {
    Tenant::default_tenant()
}

fn gated(args: &str) -> ClaimInput {
    ClaimInput {
        require_approval: true,
        principal: principal("agent-7"),
        ..claim_input(RUN, REFUND, args)
    }
}

/// The run's ungated call, kept for a minute once finished.
fn lookup_order() -> ClaimInput {
    ClaimInput {
        retention: Some(Duration::from_secs(60)),
        ..claim_input(RUN, LOOKUP_ORDER, ORDER)
    }
}

async fn claim(ledger: &Ledger, input: ClaimInput) -> ClaimOutput {
    ledger.claim(&tenant(), input).await.expect("claim")
}

async fn decide(ledger: &Ledger, out: &ClaimOutput, decision: Decision) {
    let input = DecideInput {
        key: out.entry.entry.key.clone(),
        fingerprint: out.entry.entry.fingerprint.clone(),
        decision,
        reason: "checked".into(),
    };
    let approver = Principal::parse("alice").expect("a principal");
    ledger
        .decide(&tenant(), input, &approver)
        .await
        .expect("decide");
}

async fn complete(ledger: &Ledger, out: &ClaimOutput, status: FinalStatus, retryable: bool) {
    ledger
        .complete(
            &tenant(),
            CompleteInput {
                key: out.entry.entry.key.clone(),
                claim_token: out.claim_token.clone().expect("a claim token"),
                status,
                result: if status == FinalStatus::Succeeded {
                    b"order o-1: 250 EUR".to_vec()
                } else {
                    Vec::new()
                },
                error: if status == FinalStatus::Succeeded {
                    String::new()
                } else {
                    "the payments API refused: try again".into()
                },
                retryable,
            },
        )
        .await
        .expect("complete");
}

async fn lookup(ledger: &Ledger, out: &ClaimOutput) -> idempotency_ledger::ledger::EntryView {
    ledger
        .lookup(&tenant(), LookupInput::by_key(out.entry.entry.key.clone()))
        .await
        .expect("lookup")
}

/// The keys a listing of `status` shows.
async fn listed(ledger: &Ledger, status: Status) -> Vec<String> {
    let page = ledger
        .list_entries(
            &tenant(),
            ListInput {
                status: Some(status),
                ..ListInput::default()
            },
        )
        .await
        .expect("list");
    page.entries
        .into_iter()
        .map(|e| e.entry.key.as_str().to_owned())
        .collect()
}

fn advance_past(t: &TestLedger, at: Micros) {
    t.clock
        .advance(at.minus(t.clock_now()).to_duration() + Duration::from_secs(1));
}

async fn a_lapsed_request_reads_lapsed_before_anything_records_it(b: Backend) {
    let t = TestLedger::new(b).await;
    let asked = claim(&t.ledger, gated(ARGS)).await;
    let key = asked.entry.entry.key.as_str().to_owned();
    assert_eq!(
        listed(&t.ledger, Status::AwaitingApproval).await,
        vec![key.clone()]
    );
    let decide_by = asked.entry.entry.approval.decide_by.expect("a deadline");
    advance_past(&t, decide_by);

    // Nothing has recorded the lapse (no sweep, no claim): every read says it all the same.
    let seen = lookup(&t.ledger, &asked).await;
    assert_eq!(
        (seen.status, seen.entry.retryable, seen.entry.approval.state),
        (Status::Failed, true, ApprovalState::Expired),
        "Lookup reads the lapse from the moment it happens"
    );
    assert_eq!(
        seen.entry.finished_at,
        Some(decide_by),
        "it lapsed at decide_by"
    );
    assert!(seen.entry.error.contains("lapsed"), "{}", seen.entry.error);
    assert!(listed(&t.ledger, Status::AwaitingApproval).await.is_empty());
    assert_eq!(listed(&t.ledger, Status::Failed).await, vec![key.clone()]);
    let counts = t
        .ledger
        .store()
        .count_unresolved(t.clock_now())
        .await
        .expect("count");
    assert_eq!(counts.awaiting_approval, 0, "the awaiting gauge drops it");
    assert_eq!(
        t.ledger
            .history(&tenant(), &asked.entry.entry.key)
            .await
            .expect("history")
            .len(),
        1,
        "read, not written: only the request is on record"
    );

    // The next claim asks again, as a new attempt, with the lapse on record at its deadline.
    let again = claim(&t.ledger, gated(ARGS)).await;
    assert_eq!(again.outcome, Outcome::AwaitingApproval);
    assert_eq!(again.entry.entry.attempt, 2, "a new request is attempt + 1");
    let history = t
        .ledger
        .history(&tenant(), &asked.entry.entry.key)
        .await
        .expect("history");
    let kinds: Vec<_> = history.iter().map(|e| e.kind.clone()).collect();
    assert_eq!(
        kinds,
        [
            EventKind::ApprovalRequested,
            EventKind::ApprovalExpired,
            EventKind::ApprovalRequested
        ]
    );
    assert_eq!(
        history[1].at, decide_by,
        "the lapse is dated when it happened"
    );
    assert_eq!(
        t.ledger.expire_lapsed_approvals(100).await.expect("sweep"),
        0,
        "recorded once"
    );
}

async fn an_approval_unused_past_execute_by_reads_lapsed_and_is_asked_again(b: Backend) {
    let t = TestLedger::new(b).await;
    let asked = claim(&t.ledger, gated(ARGS)).await;
    decide(&t.ledger, &asked, Decision::Approve).await;
    let approved = lookup(&t.ledger, &asked).await;
    assert_eq!(approved.status, Status::AwaitingApproval);
    let execute_by = approved.entry.approval.execute_by.expect("a deadline");
    advance_past(&t, execute_by);

    let seen = lookup(&t.ledger, &asked).await;
    assert_eq!(
        (seen.status, seen.entry.approval.state),
        (Status::Failed, ApprovalState::Expired)
    );
    assert_eq!(seen.entry.finished_at, Some(execute_by));
    // The sweep records it, dated at execute_by, and counts it once.
    assert_eq!(
        t.ledger.expire_lapsed_approvals(100).await.expect("sweep"),
        1
    );
    assert_eq!(t.ledger.approvals().take_expired(), 1);
    assert_eq!(lookup(&t.ledger, &asked).await, seen, "recorded as it read");
    let again = claim(&t.ledger, gated(ARGS)).await;
    assert_eq!(
        (again.outcome, again.entry.entry.attempt),
        (Outcome::AwaitingApproval, 2)
    );
}

async fn a_retry_after_execute_by_of_an_approved_attempt_asks_again(b: Backend) {
    let t = TestLedger::new(b).await;
    // Kept for three days: the failed attempt is still there after execute_by (a day).
    let kept = || ClaimInput {
        retention: Some(Duration::from_secs(3 * 24 * 3600)),
        ..gated(ARGS)
    };
    let asked = claim(&t.ledger, kept()).await;
    decide(&t.ledger, &asked, Decision::Approve).await;
    let acting = claim(&t.ledger, kept()).await;
    assert_eq!(acting.outcome, Outcome::Claimed);
    let execute_by = acting.entry.entry.approval.execute_by.expect("a deadline");
    // Before execute_by, the approval covers a retry of the approved call that failed.
    complete(&t.ledger, &acting, FinalStatus::Failed, true).await;
    let retry = claim(&t.ledger, kept()).await;
    assert_eq!(
        (retry.outcome, retry.entry.entry.attempt),
        (Outcome::Claimed, 2),
        "the approval covers the attempts before its execute_by"
    );
    complete(&t.ledger, &retry, FinalStatus::Failed, true).await;
    // After it, a retry asks a person again: nothing acts on a stale yes.
    advance_past(&t, execute_by);
    let late = claim(&t.ledger, kept()).await;
    assert_eq!(late.outcome, Outcome::AwaitingApproval);
    assert!(late.claim_token.is_none(), "nothing may act");
    assert_eq!(
        (late.entry.entry.attempt, late.entry.entry.approval.state),
        (3, ApprovalState::Requested)
    );
    // Even without the gate on the retry: the call needed a person before.
    let ungated = claim(&t.ledger, claim_input(RUN, REFUND, ARGS)).await;
    assert_eq!(ungated.outcome, Outcome::AwaitingApproval);
}

async fn an_entry_finished_while_its_run_awaits_a_decision_replays_after_its_retention(b: Backend) {
    let t = TestLedger::new(b).await;
    let asked = claim(&t.ledger, gated(ARGS)).await;
    // During the pause, another call of the run finishes, kept for a minute.
    let during = claim(&t.ledger, lookup_order()).await;
    assert_eq!(during.outcome, Outcome::Claimed);
    complete(&t.ledger, &during, FinalStatus::Succeeded, false).await;
    // Two days later, the run is still paused: the call replays as its finish wrote it (no
    // sweep has run), and the pruner keeps it.
    t.clock.advance(Duration::from_secs(2 * 24 * 3600));
    let repeat = claim(&t.ledger, lookup_order()).await;
    assert_eq!(
        repeat.outcome,
        Outcome::Replayed,
        "an entry finished during the pause keeps its key"
    );
    t.ledger.prune(100).await.expect("prune");
    assert_eq!(
        claim(&t.ledger, lookup_order()).await.outcome,
        Outcome::Replayed
    );
    // The decision gives it its retention again, from then.
    decide(&t.ledger, &asked, Decision::Approve).await;
    t.clock.advance(Duration::from_secs(50));
    t.ledger.prune(100).await.expect("prune");
    assert_eq!(
        claim(&t.ledger, lookup_order()).await.outcome,
        Outcome::Replayed
    );
    // Past the pause's end plus the minute, with no call of the run awaiting: retention holds.
    let decide_by = asked.entry.entry.approval.decide_by.expect("a deadline");
    advance_past(
        &t,
        decide_by.plus(Micros::from_duration(Duration::from_secs(60))),
    );
    t.ledger.prune(100).await.expect("prune");
    assert_eq!(
        claim(&t.ledger, lookup_order()).await.outcome,
        Outcome::Claimed
    );
}

async fn an_entry_finished_while_another_call_of_its_run_awaits_keeps_its_key_through_a_denial(
    b: Backend,
) {
    let mut limits = test_limits();
    limits.approval_timeout = Duration::from_secs(3 * 24 * 3600);
    let t = TestLedger::with_limits(b, limits).await;
    // Two gated calls of one step; the person denies the first at once and leaves the second.
    let first = claim(&t.ledger, gated(ARGS)).await;
    let second = claim(&t.ledger, gated(r#"{"order":"o-2","amount":900}"#)).await;
    decide(&t.ledger, &first, Decision::Deny).await;
    // The denial is finished, kept while the second call still awaits, past its own retention.
    let during = claim(&t.ledger, lookup_order()).await;
    complete(&t.ledger, &during, FinalStatus::Succeeded, false).await;
    t.clock.advance(Duration::from_secs(2 * 24 * 3600));
    assert_eq!(
        claim(&t.ledger, gated(ARGS)).await.outcome,
        Outcome::Denied,
        "the denial is kept while its run is paused"
    );
    t.ledger.prune(100).await.expect("prune");
    assert_eq!(
        claim(&t.ledger, lookup_order()).await.outcome,
        Outcome::Replayed
    );
    assert_eq!(
        lookup(&t.ledger, &second).await.status,
        Status::AwaitingApproval
    );
}

async fn the_sweep_keeps_an_entry_whose_finish_did_not_see_its_run_pause(b: Backend) {
    let t = TestLedger::new(b).await;
    let _asked = claim(&t.ledger, gated(ARGS)).await;
    let during = claim(&t.ledger, lookup_order()).await;
    complete(&t.ledger, &during, FinalStatus::Succeeded, false).await;
    // What a finish committing in the same instant as the request leaves on PostgreSQL (neither
    // statement sees the other's row): the entry's own retention only.
    t.db.execute(
        "UPDATE ledger_entries SET expires_at = finished_at + retention_us \
         WHERE tool = 'lookup_order'",
    )
    .await;
    t.clock.advance(Duration::from_secs(2 * 24 * 3600));
    t.ledger.prune(100).await.expect("prune");
    // Asked on another server, which remembers nothing of the finish.
    let other = Ledger::new(t.db.store(2).await, t.clock.clone(), test_limits());
    assert_eq!(
        claim(&other, lookup_order()).await.outcome,
        Outcome::Replayed,
        "the sweep kept the paused run's entry before pruning"
    );
}

async fn a_watchers_cursor_never_passes_an_event_after_the_history_was_pruned(b: Backend) {
    let t = TestLedger::new(b).await;
    let asked = claim(&t.ledger, gated(ARGS)).await;
    decide(&t.ledger, &asked, Decision::Deny).await;
    let (seen, cursor) = t
        .ledger
        .approval_events(&tenant(), Some(0), 100)
        .await
        .expect("events");
    assert_eq!(
        seen.iter().map(|e| e.kind).collect::<Vec<_>>(),
        ["requested", "denied"]
    );
    // The denial expires and is pruned with its history: the tenant's history is empty now.
    t.clock.advance(Duration::from_secs(3 * 24 * 3600));
    assert!(t.ledger.prune(100).await.expect("prune") >= 1);
    // A new request's event comes after the cursor the watcher holds, never under it.
    let again = claim(&t.ledger, gated(r#"{"order":"o-2","amount":900}"#)).await;
    let (next, _) = t
        .ledger
        .approval_events(&tenant(), Some(cursor), 100)
        .await
        .expect("events");
    assert_eq!(
        next.iter().map(|e| e.kind).collect::<Vec<_>>(),
        ["requested"],
        "the new request's event is after the cursor (ids are never taken again)"
    );
    assert!(next[0].cursor > cursor);
    assert_eq!(
        next[0].entry.as_ref().map(|e| e.entry.key.clone()),
        Some(again.entry.entry.key.clone())
    );
}
