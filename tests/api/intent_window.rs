//! The window of intent of a call that names no run (the MCP gateway's), on every store: an
//! identical call less than the window after the last one is the same intent (one run, so one
//! key), concurrent first calls are one intent, a call after a quiet window is a new one, and a
//! call whose last intent is still unresolved is that intent whatever the time.

use std::time::Duration;

use idempotency_ledger::domain::{RunId, Tenant};
use idempotency_ledger::ledger::{ClaimInput, Outcome};

use crate::support::typed::{claim_input, tool};
use crate::support::{Backend, TestLedger};

on_every_store!(
    identical_calls_within_the_window_are_one_intent_and_a_later_one_is_new,
    concurrent_first_calls_are_one_intent,
    an_unresolved_intent_keeps_its_window_whatever_the_time,
    other_arguments_and_other_tenants_have_windows_of_their_own,
);

const WINDOW: Duration = Duration::from_secs(600);
const TOOL: &str = "mail/send_email";
const ARGS: &str = r#"{"to":"a@example.com","subject":"hi"}"#;

fn tenant() -> Tenant {
    Tenant::default_tenant()
}

/// The intent a window's run counts (`window-<call>-<n>`: its `n`).
fn generation(run: &RunId) -> &str {
    let (call, n) = run.as_str().rsplit_once('-').expect("window-<call>-<n>");
    assert!(
        call.starts_with("window-") && call.len() == "window-".len() + 16,
        "{run:?}"
    );
    n
}

async fn window(t: &TestLedger, args: &str) -> RunId {
    t.ledger
        .window_run(&tenant(), &tool(TOOL), args, WINDOW)
        .await
        .expect("window")
}

async fn identical_calls_within_the_window_are_one_intent_and_a_later_one_is_new(b: Backend) {
    let t = TestLedger::new(b).await;
    let first = window(&t, ARGS).await;
    assert_eq!(generation(&first), "1");
    // Key order and spelling do not matter: the canonical arguments do.
    t.clock.advance(Duration::from_secs(500));
    assert_eq!(
        window(&t, r#"{"subject":"hi","to":"a@example.com"}"#).await,
        first
    );
    // Less than the window after the last call, across what would be a window boundary.
    t.clock.advance(Duration::from_secs(500));
    assert_eq!(
        window(&t, ARGS).await,
        first,
        "the window slides with each call"
    );
    t.clock.advance(WINDOW);
    let later = window(&t, ARGS).await;
    assert_eq!(
        generation(&later),
        "2",
        "a call after a quiet window is new"
    );
    assert_eq!(
        later.as_str().rsplit_once('-').map(|(call, _)| call),
        first.as_str().rsplit_once('-').map(|(call, _)| call),
        "the same call's intents are counted in one window"
    );
}

async fn concurrent_first_calls_are_one_intent(b: Backend) {
    let t = TestLedger::new(b).await;
    let calls: Vec<_> = (0..16)
        .map(|_| {
            let ledger = t.ledger.clone();
            tokio::spawn(async move {
                ledger
                    .window_run(&tenant(), &tool(TOOL), ARGS, WINDOW)
                    .await
                    .expect("window")
            })
        })
        .collect();
    let mut runs = Vec::new();
    for call in calls {
        runs.push(call.await.expect("join"));
    }
    assert_eq!(generation(&runs[0]), "1");
    assert!(runs.iter().all(|run| *run == runs[0]), "{runs:?}");
}

async fn an_unresolved_intent_keeps_its_window_whatever_the_time(b: Backend) {
    let t = TestLedger::new(b).await;
    let run = window(&t, ARGS).await;
    let claimed = t
        .ledger
        .claim(
            &tenant(),
            ClaimInput {
                lease: Some(Duration::from_secs(30)),
                ..claim_input(run.as_str(), TOOL, ARGS)
            },
        )
        .await
        .expect("claim");
    assert_eq!(claimed.outcome, Outcome::Claimed);
    // Its lease ended long ago without a Complete: unknown, so the same intent still.
    t.clock.advance(WINDOW * 3);
    assert_eq!(
        window(&t, ARGS).await,
        run,
        "an outcome nobody knows is never a new intent"
    );
}

async fn other_arguments_and_other_tenants_have_windows_of_their_own(b: Backend) {
    let t = TestLedger::new(b).await;
    let first = window(&t, ARGS).await;
    assert_eq!(generation(&first), "1");
    t.clock.advance(WINDOW * 2);
    assert_eq!(generation(&window(&t, ARGS).await), "2");
    let other = window(&t, r#"{"to":"b@example.com","subject":"hi"}"#).await;
    assert_eq!(generation(&other), "1");
    // Each call's intents are runs of their own: a pause of one keeps none of the other's.
    assert_ne!(other, first);
    let acme = Tenant::parse("acme").expect("tenant");
    let theirs = t
        .ledger
        .window_run(&acme, &tool(TOOL), ARGS, WINDOW)
        .await
        .expect("window");
    assert_eq!(generation(&theirs), "1");
}
