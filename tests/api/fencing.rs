//! Fenced findings, on every store: a reconciler's finding settles only the attempt it
//! observed, under the hold it was handed out with; a late one is reported stale, kept in the
//! entry's history, and, when it found an earlier attempt's effect, marks the entry as a
//! possible double effect until a person acknowledges it. And the reconcile grace: an outcome
//! is handed out only once it has been unknown that long.

use std::time::Duration;

use idempotency_ledger::domain::time::Clock as _;
use idempotency_ledger::domain::{EventKind, FinalStatus, HoldToken, Principal, Status, Tenant};
use idempotency_ledger::error::LedgerError;
use idempotency_ledger::ledger::{
    AcknowledgeInput, ClaimInput, CompleteInput, EntryView, Ledger, ListInput, LookupInput,
    ReconcileInput, ReconcileOutput, ResolutionInput, ResolutionOutcome,
};
use idempotency_ledger::reason::Reason;

use crate::support::typed::{self, claim_input};
use crate::support::{Backend, TestLedger, test_limits};

on_every_store!(
    a_late_not_found_about_an_earlier_attempt_is_stale_and_the_intent_does_not_act_again,
    a_late_found_about_an_earlier_attempt_marks_a_possible_double_effect_until_acknowledged,
    a_finding_sent_while_its_hold_is_current_settles,
    an_expired_hold_that_nobody_replaced_still_settles,
    a_finding_under_a_replaced_hold_is_stale_and_the_new_holders_settles,
    a_found_after_the_attempt_was_recorded_not_done_marks_a_double_effect,
    a_resolution_without_its_attempt_or_hold_is_refused_and_changes_nothing,
    an_outcome_is_handed_out_only_once_it_has_been_unknown_for_the_grace,
    the_history_goes_with_its_entry_when_it_expires,
);

const TOOL: &str = "issue_credit";
const ARGS: &str = r#"{"customer":"c-42","amount":200,"currency":"EUR"}"#;
/// The reconcile lease of these tests' ledgers: a hold ends a second after its hand-out.
const HOLD: Duration = Duration::from_secs(1);

fn tenant() -> Tenant {
    Tenant::default_tenant()
}

async fn ledger(b: Backend) -> TestLedger {
    let mut limits = test_limits();
    limits.reconcile_lease = HOLD;
    TestLedger::with_limits(b, limits).await
}

/// Claims the intent of `run` (CLAIMED, a new attempt) and reports it UNKNOWN; returns its key.
async fn unknown_attempt(t: &TestLedger, run: &str, want_attempt: u32) -> String {
    let out = t
        .ledger
        .claim(&tenant(), claim_input(run, TOOL, ARGS))
        .await
        .expect("claim");
    assert_eq!(out.entry.entry.attempt, want_attempt, "{out:?}");
    let key = out.entry.entry.key.to_string();
    t.ledger
        .complete(
            &tenant(),
            CompleteInput {
                key: typed::key(&key),
                claim_token: out.claim_token.expect("claimed"),
                status: FinalStatus::Unknown,
                result: Vec::new(),
                error: "connection lost after sending the request".into(),
                retryable: false,
            },
        )
        .await
        .expect("unknown");
    key
}

/// Takes `key` as a reconciler does; the pending entry (with its hold token).
async fn take(ledger: &Ledger, key: &str) -> EntryView {
    let out = ledger
        .reconcile(
            &tenant(),
            ReconcileInput {
                keys: vec![typed::key(key)],
                ..Default::default()
            },
        )
        .await
        .expect("reconcile");
    assert_eq!(out.pending.len(), 1, "{key} not handed out: {out:?}");
    let view = out.pending.into_iter().next().expect("one");
    assert!(
        !view.entry.hold_token.is_none(),
        "a hand-out carries a hold"
    );
    view
}

/// What a reconciler found about the entry it was handed (`held`).
fn finding(held: &EntryView, found: bool) -> ResolutionInput {
    ResolutionInput {
        key: held.entry.key.clone(),
        status: if found {
            FinalStatus::Succeeded
        } else {
            FinalStatus::Failed
        },
        result: if found {
            b"credit cr-1".to_vec()
        } else {
            Vec::new()
        },
        error: if found {
            String::new()
        } else {
            "no credit with this reference".into()
        },
        retryable: !found,
        attempt: held.entry.attempt,
        hold_token: held.entry.hold_token.clone(),
    }
}

async fn send(ledger: &Ledger, who: &str, findings: Vec<ResolutionInput>) -> ReconcileOutput {
    ledger
        .reconcile(
            &tenant(),
            ReconcileInput {
                resolutions: findings,
                resolve_only: true,
                principal: typed::principal(who),
                ..Default::default()
            },
        )
        .await
        .expect("reconcile")
}

async fn lookup(ledger: &Ledger, key: &str) -> EntryView {
    ledger
        .lookup(&tenant(), LookupInput::by_key(typed::key(key)))
        .await
        .expect("lookup")
}

/// The issue's story: attempt 1 is unknown; reconciler A takes it, finds nothing, stalls; its
/// hold ends; B takes it, finds nothing, resolves FAILED retryable; attempt 2 acts and loses
/// its connection (unknown); A wakes and sends its finding about attempt 1. Unfenced, it would
/// settle attempt 2 as not done, and the next claim would act a third time.
async fn a_late_not_found_about_an_earlier_attempt_is_stale_and_the_intent_does_not_act_again(
    b: Backend,
) {
    let t = ledger(b).await;
    let key = unknown_attempt(&t, "run-1", 1).await;
    let by_a = take(&t.ledger, &key).await;
    t.clock.advance(HOLD + Duration::from_millis(1));
    let by_b = take(&t.ledger, &key).await;
    assert_ne!(by_a.entry.hold_token, by_b.entry.hold_token);
    let out = send(&t.ledger, "reconciler-b", vec![finding(&by_b, false)]).await;
    assert_eq!(out.results[0].outcome, ResolutionOutcome::Applied);
    assert_eq!(unknown_attempt(&t, "run-1", 2).await, key);

    let late = send(&t.ledger, "reconciler-a", vec![finding(&by_a, false)]).await;
    let result = &late.results[0];
    assert!(
        matches!(result.outcome, ResolutionOutcome::Stale(_)),
        "{result:?}"
    );
    let now = result.entry.as_ref().expect("the entry as it stands");
    assert_eq!(
        (now.entry.attempt, now.status),
        (2, Status::Unknown),
        "the result says where the entry is"
    );
    assert!(result.note.contains("attempt 2"), "{}", result.note);
    assert!(
        !result.marked_double_effect,
        "a stale not-found marks nothing"
    );

    // The entry is untouched: attempt 2, unknown, nobody's resolution.
    let after = lookup(&t.ledger, &key).await;
    assert_eq!((after.entry.attempt, after.status), (2, Status::Unknown));
    assert_eq!(after.entry.resolved_by, "");
    assert!(!after.entry.possible_double_effect);
    // So the intent does not act a third time: a repeat is IN_PROGRESS.
    let repeat = t
        .ledger
        .claim(&tenant(), claim_input("run-1", TOOL, ARGS))
        .await
        .expect("claim");
    assert_eq!(
        repeat.outcome,
        idempotency_ledger::ledger::Outcome::InProgress
    );

    // The stale finding is kept in the history, after B's applied one, with who sent it.
    let history = t
        .ledger
        .history(&tenant(), &after.entry.key)
        .await
        .expect("history");
    let kinds: Vec<(EventKind, u32, &str)> = history
        .iter()
        .map(|e| (e.kind.clone(), e.attempt, e.principal.as_str()))
        .collect();
    assert_eq!(
        kinds,
        [
            (EventKind::FindingApplied, 1, "reconciler-b"),
            (EventKind::FindingStale, 1, "reconciler-a"),
        ]
    );
    assert!(
        history[1].detail.contains("not found") && history[1].detail.contains("attempt 2"),
        "{:?}",
        history[1]
    );
}

async fn a_late_found_about_an_earlier_attempt_marks_a_possible_double_effect_until_acknowledged(
    b: Backend,
) {
    let t = ledger(b).await;
    let key = unknown_attempt(&t, "run-1", 1).await;
    let by_a = take(&t.ledger, &key).await;
    t.clock.advance(HOLD + Duration::from_millis(1));
    let by_b = take(&t.ledger, &key).await;
    send(&t.ledger, "reconciler-b", vec![finding(&by_b, false)]).await;
    unknown_attempt(&t, "run-1", 2).await;

    // A's late read did find attempt 1's effect: attempt 2 may have acted too.
    let late = send(&t.ledger, "reconciler-a", vec![finding(&by_a, true)]).await;
    assert!(matches!(
        late.results[0].outcome,
        ResolutionOutcome::Stale(_)
    ));
    assert!(late.results[0].marked_double_effect);
    let marked = lookup(&t.ledger, &key).await;
    assert!(marked.entry.possible_double_effect, "Lookup shows the mark");
    assert_eq!(
        (marked.entry.attempt, marked.status),
        (2, Status::Unknown),
        "nothing else changed"
    );
    let listed = t
        .ledger
        .double_effects(&tenant(), 10)
        .await
        .expect("double effects");
    assert_eq!(
        listed
            .iter()
            .map(|v| v.entry.key.to_string())
            .collect::<Vec<_>>(),
        [key.as_str()]
    );
    let by_filter = t
        .ledger
        .list_entries(
            &tenant(),
            ListInput {
                possible_double_effect: true,
                ..Default::default()
            },
        )
        .await
        .expect("list");
    assert_eq!(by_filter.entries.len(), 1);
    let history = t
        .ledger
        .history(&tenant(), &marked.entry.key)
        .await
        .expect("history");
    let mark = history
        .iter()
        .find(|e| e.kind == EventKind::PossibleDoubleEffect)
        .expect("the mark is in the history");
    assert_eq!((mark.attempt, mark.principal.as_str()), (1, "reconciler-a"));
    assert!(mark.detail.contains("attempt 2"), "{}", mark.detail);

    // The mark stays across what happens to the entry next (attempt 2 settled found)...
    let by_c = take(&t.ledger, &key).await;
    send(&t.ledger, "reconciler-c", vec![finding(&by_c, true)]).await;
    assert!(lookup(&t.ledger, &key).await.entry.possible_double_effect);

    // ...until a person acknowledges it, which is kept in the history too.
    let refused_note = t
        .ledger
        .acknowledge_double_effect(
            &tenant(),
            AcknowledgeInput {
                key: typed::key(&key),
                note: "x".repeat(1025),
                principal: typed::principal("alice"),
            },
        )
        .await;
    assert!(
        matches!(
            refused_note,
            Err(LedgerError::InvalidArgument { field: "note", .. })
        ),
        "{refused_note:?}"
    );
    assert!(lookup(&t.ledger, &key).await.entry.possible_double_effect);
    let acked = t
        .ledger
        .acknowledge_double_effect(
            &tenant(),
            AcknowledgeInput {
                key: typed::key(&key),
                note: "refunded the second credit".into(),
                principal: typed::principal("alice"),
            },
        )
        .await
        .expect("acknowledge");
    assert!(!acked.entry.possible_double_effect);
    assert!(!lookup(&t.ledger, &key).await.entry.possible_double_effect);
    assert!(
        t.ledger
            .double_effects(&tenant(), 10)
            .await
            .expect("double effects")
            .is_empty()
    );
    let last = t
        .ledger
        .history(&tenant(), &acked.entry.key)
        .await
        .expect("history")
        .pop()
        .expect("an event");
    assert_eq!(
        (last.kind, last.principal.as_str(), last.detail.as_str()),
        (
            EventKind::DoubleEffectAcknowledged,
            "alice",
            "refunded the second credit"
        )
    );
    // Twice is refused, and so is an entry that does not exist.
    let again = t
        .ledger
        .acknowledge_double_effect(
            &tenant(),
            AcknowledgeInput {
                key: typed::key(&key),
                note: "again".into(),
                principal: Principal::none(),
            },
        )
        .await;
    assert!(matches!(again, Err(LedgerError::NotMarked)), "{again:?}");
    assert_eq!(again.map(|_| ()).unwrap_err().reason(), Reason::NotMarked);
    let absent = t
        .ledger
        .acknowledge_double_effect(
            &tenant(),
            AcknowledgeInput {
                key: typed::key("f".repeat(64)),
                note: "n".into(),
                principal: Principal::none(),
            },
        )
        .await;
    assert!(matches!(absent, Err(LedgerError::NotFound)), "{absent:?}");
}

async fn a_finding_sent_while_its_hold_is_current_settles(b: Backend) {
    let t = ledger(b).await;
    let key = unknown_attempt(&t, "run-1", 1).await;
    let held = take(&t.ledger, &key).await;
    let out = send(&t.ledger, "reconciler-a", vec![finding(&held, true)]).await;
    assert_eq!(out.results[0].outcome, ResolutionOutcome::Applied);
    assert_eq!(out.resolved.len(), 1);
    let after = lookup(&t.ledger, &key).await;
    assert_eq!(
        (after.status, after.entry.result.as_slice()),
        (Status::Succeeded, b"credit cr-1".as_slice())
    );
    assert_eq!(after.entry.resolved_by, "reconciler-a");
    // Sent again (a retried call): the attempt is resolved now; nothing changes.
    let again = send(&t.ledger, "reconciler-a", vec![finding(&held, true)]).await;
    assert_eq!(again.results[0].outcome, ResolutionOutcome::AlreadyResolved);
    assert_eq!(lookup(&t.ledger, &key).await, after);
}

async fn an_expired_hold_that_nobody_replaced_still_settles(b: Backend) {
    let t = ledger(b).await;
    let key = unknown_attempt(&t, "run-1", 1).await;
    let held = take(&t.ledger, &key).await;
    // Long past the hold; nobody took the entry since: the finding is still the newest
    // evidence about this attempt.
    t.clock.advance(HOLD * 30);
    let out = send(&t.ledger, "slow-reconciler", vec![finding(&held, false)]).await;
    assert_eq!(out.results[0].outcome, ResolutionOutcome::Applied);
    let after = lookup(&t.ledger, &key).await;
    assert_eq!(
        (after.status, after.entry.retryable),
        (Status::Failed, true)
    );
}

async fn a_finding_under_a_replaced_hold_is_stale_and_the_new_holders_settles(b: Backend) {
    let t = ledger(b).await;
    let key = unknown_attempt(&t, "run-1", 1).await;
    let by_a = take(&t.ledger, &key).await;
    t.clock.advance(HOLD + Duration::from_millis(1));
    let by_b = take(&t.ledger, &key).await;
    // The same attempt, but B holds it now: A no longer speaks for it.
    let late = send(&t.ledger, "reconciler-a", vec![finding(&by_a, false)]).await;
    assert!(
        matches!(late.results[0].outcome, ResolutionOutcome::Stale(_)),
        "{:?}",
        late.results[0]
    );
    assert!(late.results[0].note.contains("handed out again"));
    assert_eq!(lookup(&t.ledger, &key).await.status, Status::Unknown);
    let out = send(&t.ledger, "reconciler-b", vec![finding(&by_b, true)]).await;
    assert_eq!(out.results[0].outcome, ResolutionOutcome::Applied);
    assert_eq!(lookup(&t.ledger, &key).await.status, Status::Succeeded);
}

async fn a_found_after_the_attempt_was_recorded_not_done_marks_a_double_effect(b: Backend) {
    let t = ledger(b).await;
    let key = unknown_attempt(&t, "run-1", 1).await;
    let by_a = take(&t.ledger, &key).await;
    t.clock.advance(HOLD + Duration::from_millis(1));
    let by_b = take(&t.ledger, &key).await;
    // B read too early and found nothing; A's read found the effect landing after all. The
    // entry says "not done, retry": the next claim would act a second time.
    send(&t.ledger, "reconciler-b", vec![finding(&by_b, false)]).await;
    let late = send(&t.ledger, "reconciler-a", vec![finding(&by_a, true)]).await;
    assert_eq!(late.results[0].outcome, ResolutionOutcome::AlreadyResolved);
    assert!(late.results[0].marked_double_effect);
    let after = lookup(&t.ledger, &key).await;
    assert!(after.entry.possible_double_effect);
    assert_eq!(
        (after.status, after.entry.retryable),
        (Status::Failed, true),
        "the outcome itself is not changed by a stale finding"
    );
}

async fn a_resolution_without_its_attempt_or_hold_is_refused_and_changes_nothing(b: Backend) {
    let t = ledger(b).await;
    let key = unknown_attempt(&t, "run-1", 1).await;
    let held = take(&t.ledger, &key).await;
    let good = finding(&held, true);
    for unfenced in [
        ResolutionInput {
            attempt: 0,
            ..good.clone()
        },
        ResolutionInput {
            hold_token: HoldToken::none(),
            ..good.clone()
        },
    ] {
        // With a good one beside it: the call is refused whole.
        let refused = t
            .ledger
            .reconcile(
                &tenant(),
                ReconcileInput {
                    resolutions: vec![good.clone(), unfenced],
                    ..Default::default()
                },
            )
            .await;
        match refused {
            Err(
                ref e @ LedgerError::InvalidArgument {
                    field: "resolutions",
                    ref message,
                    ..
                },
            ) => {
                assert_eq!(e.reason(), Reason::UnfencedResolution);
                assert!(message.contains("hold_token"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }
    let after = lookup(&t.ledger, &key).await;
    assert_eq!(after.status, Status::Unknown);
    assert!(
        t.ledger
            .history(&tenant(), &after.entry.key)
            .await
            .expect("history")
            .is_empty(),
        "nothing recorded"
    );
    // Still held by the one hand-out: the good finding alone applies.
    let out = send(&t.ledger, "reconciler-a", vec![good]).await;
    assert_eq!(out.results[0].outcome, ResolutionOutcome::Applied);
}

async fn an_outcome_is_handed_out_only_once_it_has_been_unknown_for_the_grace(b: Backend) {
    let grace = Duration::from_secs(10);
    let mut limits = test_limits();
    limits.reconcile_grace = grace;
    let t = TestLedger::with_limits(b, limits).await;
    let pick = |ledger: Ledger, keys: Vec<String>| async move {
        ledger
            .reconcile(
                &tenant(),
                ReconcileInput {
                    keys: keys.iter().map(typed::key).collect(),
                    ..Default::default()
                },
            )
            .await
            .expect("reconcile")
            .pending
            .into_iter()
            .map(|v| v.entry.key.to_string())
            .collect::<Vec<_>>()
    };
    // A claimant's UNKNOWN report ends its lease then: the grace counts from the report.
    let reported = unknown_attempt(&t, "run-reported", 1).await;
    let lease_end = lookup(&t.ledger, &reported).await.entry.lease_expires_at;
    assert_eq!(lease_end, t.clock.now(), "the report ended the lease");
    // An attempt whose lease ends without a Complete: the grace counts from the lease's end.
    let lapsing = t
        .ledger
        .claim(
            &tenant(),
            ClaimInput {
                lease: Some(Duration::from_secs(5)),
                ..claim_input("run-lapsing", TOOL, ARGS)
            },
        )
        .await
        .expect("claim")
        .entry
        .entry
        .key
        .to_string();
    t.clock.advance(Duration::from_secs(9));
    // The report 9 s ago, the lease's end 4 s ago: neither by the general pick nor by key.
    assert!(pick(t.ledger.clone(), Vec::new()).await.is_empty());
    assert!(
        pick(t.ledger.clone(), vec![reported.clone(), lapsing.clone()])
            .await
            .is_empty()
    );
    t.clock.advance(Duration::from_secs(1));
    assert_eq!(
        pick(t.ledger.clone(), Vec::new()).await,
        [reported.as_str()],
        "10 s after the report"
    );
    t.clock.advance(Duration::from_secs(5));
    assert_eq!(
        pick(t.ledger.clone(), vec![lapsing.clone()]).await,
        [lapsing.as_str()],
        "10 s after the lease ended"
    );
}

async fn the_history_goes_with_its_entry_when_it_expires(b: Backend) {
    let t = ledger(b).await;
    let key = unknown_attempt(&t, "run-1", 1).await;
    let held = take(&t.ledger, &key).await;
    send(&t.ledger, "reconciler-a", vec![finding(&held, true)]).await;
    let view = lookup(&t.ledger, &key).await;
    assert_eq!(
        t.ledger
            .history(&tenant(), &view.entry.key)
            .await
            .expect("history")
            .len(),
        1
    );
    t.clock
        .advance(view.entry.retention.to_duration() + Duration::from_secs(1));
    assert!(t.ledger.prune(100).await.expect("prune") >= 1);
    assert!(
        t.ledger
            .history(&tenant(), &view.entry.key)
            .await
            .expect("history")
            .is_empty(),
        "deleted with the entry"
    );
}
