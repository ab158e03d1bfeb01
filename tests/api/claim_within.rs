//! A claim that names no run, claimed in its window of intent (`Ledger::claim_within`, the MCP
//! gateway's and Claim's `same_intent_within`), on every store: the window is counted and the
//! entry inserted together (on SQLite in one transaction), so a new intent acts once however
//! many identical calls race, a repeat within the window is the same intent, a call after a
//! quiet window is a new one, an unresolved intent is never acted on again, and a gated call
//! asks a person in its window's run.

use std::time::Duration;

use idempotency_ledger::domain::{FinalStatus, RunId, Status, Tenant};
use idempotency_ledger::ledger::{
    ClaimInput, ClaimOutput, CompleteInput, Ledger, LookupInput, Outcome,
};

use crate::support::typed::claim_input;
use crate::support::{Backend, TestLedger};

on_every_store!(
    a_new_intent_is_claimed_in_the_first_run_of_its_window_and_a_repeat_replays_it,
    concurrent_identical_calls_claim_one_intent_once,
    a_call_after_a_quiet_window_is_a_new_intent_in_the_next_run,
    an_unresolved_intent_is_never_claimed_again_after_its_window,
    a_gated_call_asks_a_person_in_its_windows_run,
);

const WINDOW: Duration = Duration::from_secs(600);
const TOOL: &str = "mail/send_email";
const ARGS: &str = r#"{"to":"a@example.com","subject":"hi"}"#;

fn tenant() -> Tenant {
    Tenant::default_tenant()
}

/// The call with no run (`claim_within` replaces its key).
fn call() -> ClaimInput {
    ClaimInput {
        lease: Some(Duration::from_secs(30)),
        ..claim_input("placeholder", TOOL, ARGS)
    }
}

async fn claim(ledger: &Ledger, input: ClaimInput) -> ClaimOutput {
    ledger
        .claim_within(&tenant(), input, WINDOW)
        .await
        .expect("claim within the window")
}

/// The run an answer's entry was claimed in, and the intent it counts (`window-<call>-<n>`).
fn run_of(out: &ClaimOutput) -> (RunId, String) {
    let run = out.entry.entry.run_id.clone().expect("a window's run");
    let (call, n) = run.as_str().rsplit_once('-').expect("window-<call>-<n>");
    assert!(call.starts_with("window-"), "{run:?}");
    let n = n.to_owned();
    (run, n)
}

async fn succeed(ledger: &Ledger, out: &ClaimOutput) {
    ledger
        .complete(
            &tenant(),
            CompleteInput {
                key: out.entry.entry.key.clone(),
                claim_token: out.claim_token.clone().expect("a claim token"),
                status: FinalStatus::Succeeded,
                result: b"sent".to_vec(),
                error: String::new(),
                retryable: false,
            },
        )
        .await
        .expect("complete");
}

async fn a_new_intent_is_claimed_in_the_first_run_of_its_window_and_a_repeat_replays_it(
    b: Backend,
) {
    let t = TestLedger::new(b).await;
    let first = claim(&t.ledger, call()).await;
    assert_eq!(first.outcome, Outcome::Claimed);
    let (run, n) = run_of(&first);
    assert_eq!(n, "1");
    // Stored as claimed: the entry is the store's, in the window's run.
    let stored = t
        .ledger
        .lookup(&tenant(), LookupInput::ByKey(first.entry.entry.key.clone()))
        .await
        .expect("stored");
    assert_eq!(stored.status, Status::Attempting);
    assert_eq!(stored.entry.run_id.as_ref(), Some(&run));
    succeed(&t.ledger, &first).await;
    t.clock.advance(Duration::from_secs(300));
    let repeat = claim(&t.ledger, call()).await;
    assert_eq!(repeat.outcome, Outcome::Replayed);
    assert_eq!(repeat.entry.entry.key, first.entry.entry.key);
    assert_eq!(repeat.entry.entry.result, b"sent");
}

async fn concurrent_identical_calls_claim_one_intent_once(b: Backend) {
    let t = TestLedger::new(b).await;
    let calls: Vec<_> = (0..16)
        .map(|_| {
            let ledger = t.ledger.clone();
            tokio::spawn(async move { claim(&ledger, call()).await })
        })
        .collect();
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.expect("join"));
    }
    let claimed = answers
        .iter()
        .filter(|a| a.outcome == Outcome::Claimed)
        .count();
    assert_eq!(
        claimed,
        1,
        "{:?}",
        answers.iter().map(|a| a.outcome).collect::<Vec<_>>()
    );
    assert!(
        answers
            .iter()
            .all(|a| a.entry.entry.key == answers[0].entry.entry.key),
        "one intent, one key"
    );
    assert!(
        answers
            .iter()
            .all(|a| matches!(a.outcome, Outcome::Claimed | Outcome::InProgress)),
        "the others meet the attempt in flight"
    );
}

async fn a_call_after_a_quiet_window_is_a_new_intent_in_the_next_run(b: Backend) {
    let t = TestLedger::new(b).await;
    let first = claim(&t.ledger, call()).await;
    succeed(&t.ledger, &first).await;
    t.clock.advance(WINDOW);
    let later = claim(&t.ledger, call()).await;
    assert_eq!(later.outcome, Outcome::Claimed, "a new intent acts");
    assert_eq!(run_of(&later).1, "2");
    assert_ne!(later.entry.entry.key, first.entry.entry.key);
}

async fn an_unresolved_intent_is_never_claimed_again_after_its_window(b: Backend) {
    let t = TestLedger::new(b).await;
    let first = claim(&t.ledger, call()).await;
    assert_eq!(first.outcome, Outcome::Claimed);
    // Its lease ended long ago without a Complete: unknown, the same intent whatever the time.
    t.clock.advance(WINDOW * 3);
    let again = claim(&t.ledger, call()).await;
    assert_eq!(again.entry.entry.key, first.entry.entry.key);
    assert_eq!(again.outcome, Outcome::InProgress);
    assert_eq!(again.entry.status, Status::Unknown);
    assert_eq!(run_of(&again).1, "1");
}

async fn a_gated_call_asks_a_person_in_its_windows_run(b: Backend) {
    let t = TestLedger::new(b).await;
    let gated = ClaimInput {
        require_approval: true,
        ..call()
    };
    let asked = claim(&t.ledger, gated.clone()).await;
    assert_eq!(asked.outcome, Outcome::AwaitingApproval);
    assert_eq!(run_of(&asked).1, "1");
    let repeat = claim(&t.ledger, gated).await;
    assert_eq!(repeat.outcome, Outcome::AwaitingApproval);
    assert_eq!(repeat.entry.entry.key, asked.entry.entry.key);
}
