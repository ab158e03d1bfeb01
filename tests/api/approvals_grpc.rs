//! Approvals over gRPC against the real binary: only a credential with the approver role
//! decides, and the decision records it; WatchApprovals streams the events and resumes from a
//! cursor; the policy file gates what it says and SIGHUP swaps it (a bad file keeps the old
//! one and names its line); a SIGKILL between a decision and the claim that uses it loses
//! nothing; the CLI's approvals, approve and deny.

use std::time::Duration;

use idempotency_ledger::grpc::pb;
use idempotency_ledger::grpc::pb::ledger_service_client::LedgerServiceClient;
use tokio_stream::StreamExt as _;
use tonic::transport::Channel;
use tonic::{Code, Request};

use crate::rotation::signal;
use crate::support::{ServerProcess, reason};

const AGENT: &str = "tok-agent-7";
const APPROVER: &str = "tok-alice";
const ARGS: &str = r#"{"order":"o-1","amount":250}"#;

fn bearer<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("header"),
    );
    request
}

fn claim_req(run: &str, tool: &str, args: &str, require: bool) -> pb::ClaimRequest {
    pb::ClaimRequest {
        run_id: run.into(),
        tool: tool.into(),
        arguments_json: args.into(),
        require_approval: require,
        ..Default::default()
    }
}

/// A server on a fresh SQLite file with an agent's and an approver's credential of one tenant
/// (and `extra` flags); its directory.
async fn server(extra: &[&str]) -> (ServerProcess, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("dir");
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        format!("acme {AGENT}\nacme {APPROVER} approver=alice\nglobex tok-globex approver\n"),
    )
    .expect("tokens");
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let tokens = tokens.display().to_string();
    let mut flags = vec!["--auth-tokens-file", tokens.as_str()];
    flags.extend_from_slice(extra);
    (ServerProcess::start(&url, &flags).await, dir)
}

async fn claim(
    client: &mut LedgerServiceClient<Channel>,
    request: pb::ClaimRequest,
) -> pb::ClaimResponse {
    client
        .claim(bearer(request, AGENT))
        .await
        .expect("claim")
        .into_inner()
}

fn decide_req(entry: &pb::Entry, approve: bool, reason: &str) -> pb::DecideRequest {
    pb::DecideRequest {
        key: entry.key.clone(),
        fingerprint: entry.fingerprint.clone(),
        decision: if approve {
            pb::Decision::Approve
        } else {
            pb::Decision::Deny
        }
        .into(),
        reason: reason.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_approver_decides_and_the_decision_records_its_credential() {
    let (server, _dir) = server(&[]).await;
    let mut client = server.client().await;
    let asked = claim(&mut client, claim_req("run-1", "issue_refund", ARGS, true)).await;
    assert_eq!(asked.outcome(), pb::Outcome::AwaitingApproval);
    assert!(asked.claim_token.is_empty());
    let entry = asked.entry.expect("entry");
    assert_eq!(
        entry.approval.as_ref().map(pb::Approval::state),
        Some(pb::ApprovalState::Requested)
    );
    // The agent's own token cannot decide, whatever the body says.
    let refused = client
        .decide(bearer(decide_req(&entry, true, "I approve myself"), AGENT))
        .await
        .expect_err("an agent's token");
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert_eq!(reason(&refused), "APPROVER_ROLE_REQUIRED");
    // Another tenant's approver does not see it.
    let elsewhere = client
        .decide(bearer(decide_req(&entry, true, ""), "tok-globex"))
        .await
        .expect_err("another tenant");
    assert_eq!(elsewhere.code(), Code::NotFound);
    // The approver decides; decided_by is its credential's name.
    let decided = client
        .decide(bearer(decide_req(&entry, true, "within policy"), APPROVER))
        .await
        .expect("decide")
        .into_inner()
        .entry
        .expect("entry");
    let approval = decided.approval.expect("approval");
    assert_eq!(
        (
            approval.state(),
            approval.decided_by.as_str(),
            approval.reason.as_str()
        ),
        (pb::ApprovalState::Approved, "alice", "within policy")
    );
    // The approved call's next claim acts; a different fingerprint is refused.
    let mut other = entry.clone();
    other.fingerprint = "0".repeat(64);
    let mismatch = client
        .decide(bearer(decide_req(&other, false, ""), APPROVER))
        .await
        .expect_err("mismatch");
    assert_eq!(
        (mismatch.code(), reason(&mismatch)),
        (Code::FailedPrecondition, "APPROVAL_MISMATCH".to_string())
    );
    let acting = claim(&mut client, claim_req("run-1", "issue_refund", ARGS, true)).await;
    assert_eq!(acting.outcome(), pb::Outcome::Claimed);
    assert!(!acting.claim_token.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_approvals_streams_requests_and_decisions_and_resumes_from_a_cursor() {
    let (server, _dir) = server(&[]).await;
    let mut client = server.client().await;
    let mut stream = client
        .watch_approvals(bearer(pb::WatchApprovalsRequest::default(), APPROVER))
        .await
        .expect("watch")
        .into_inner();
    let asked = claim(
        &mut client,
        claim_req("run-w", "delete_account", "{}", true),
    )
    .await;
    let requested = next(&mut stream).await;
    assert_eq!(requested.kind, "requested");
    let shown = requested.entry.expect("the entry");
    assert_eq!(
        (shown.tool.as_str(), shown.arguments_json.as_str()),
        ("delete_account", "{}")
    );
    let entry = asked.entry.expect("entry");
    client
        .decide(bearer(decide_req(&entry, false, "not today"), APPROVER))
        .await
        .expect("decide");
    let denied = next(&mut stream).await;
    assert_eq!(
        (denied.kind.as_str(), denied.principal.as_str()),
        ("denied", "alice")
    );
    // A reconnect from the first event's cursor sees the denial again, and what follows.
    drop(stream);
    let other = claim(
        &mut client,
        claim_req("run-w", "delete_account", r#"{"u":2}"#, true),
    )
    .await;
    let mut resumed = client
        .watch_approvals(bearer(
            pb::WatchApprovalsRequest {
                after: requested.cursor.clone(),
            },
            APPROVER,
        ))
        .await
        .expect("watch")
        .into_inner();
    let first = next(&mut resumed).await;
    assert_eq!(
        (first.kind.as_str(), first.cursor.as_str()),
        ("denied", denied.cursor.as_str())
    );
    let second = next(&mut resumed).await;
    assert_eq!(second.kind, "requested");
    assert_eq!(second.entry.map(|e| e.key), other.entry.map(|e| e.key));
    // Another tenant's watch sees none of it; a cursor that is not one is refused.
    let bad = client
        .watch_approvals(bearer(
            pb::WatchApprovalsRequest {
                after: "nope".into(),
            },
            APPROVER,
        ))
        .await
        .expect_err("a bad cursor");
    assert_eq!(bad.code(), Code::InvalidArgument);
    let mut theirs = client
        .watch_approvals(bearer(
            pb::WatchApprovalsRequest { after: "0".into() },
            "tok-globex",
        ))
        .await
        .expect("watch")
        .into_inner();
    assert!(
        tokio::time::timeout(Duration::from_millis(1500), theirs.next())
            .await
            .is_err(),
        "globex sees no acme event"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_waits_for_attempts_only_answers_a_gated_repeat_at_once() {
    let (server, _dir) = server(&[]).await;
    let mut client = server.client().await;
    let first = claim(&mut client, claim_req("run-w", "issue_refund", ARGS, true)).await;
    assert_eq!(first.outcome(), pb::Outcome::AwaitingApproval);
    let waiting = |wait_for: i32| pb::ClaimRequest {
        wait: Some(prost_types::Duration {
            seconds: 20,
            nanos: 0,
        }),
        wait_for,
        ..claim_req("run-w", "issue_refund", ARGS, true)
    };
    let since = std::time::Instant::now();
    let repeat = claim(&mut client, waiting(pb::WaitFor::Attempt.into())).await;
    assert_eq!(repeat.outcome(), pb::Outcome::AwaitingApproval);
    assert!(
        since.elapsed() < Duration::from_secs(5),
        "answered after {:?}",
        since.elapsed()
    );
    // A value that is no WaitFor is refused, naming the field.
    let refused = client
        .claim(bearer(waiting(9), AGENT))
        .await
        .expect_err("wait_for 9");
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert_eq!(reason(&refused), "INVALID_FIELD");
    assert!(
        refused.message().contains("wait_for"),
        "{}",
        refused.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapse_is_recorded_when_it_happens_with_no_claim_and_counted_once() {
    // The sweep of expired entries runs every minute (the default): a lapse recorded within
    // seconds of its deadline was recorded by the loop that waits for it.
    let (server, _dir) = server(&[
        "--approval-timeout",
        "2s",
        "--metrics-listen",
        "127.0.0.1:0",
    ])
    .await;
    let mut client = server.client().await;
    let asked = claim(&mut client, claim_req("run-l", "issue_refund", ARGS, true)).await;
    let entry = asked.entry.expect("entry");
    let lookup = pb::LookupRequest {
        key: entry.key.clone(),
        include_history: true,
        ..Default::default()
    };
    let since = std::time::Instant::now();
    let recorded = loop {
        let found = client
            .lookup(bearer(lookup.clone(), AGENT))
            .await
            .expect("lookup")
            .into_inner();
        if found.history.iter().any(|e| e.kind == "approval_expired") {
            break found;
        }
        assert!(
            since.elapsed() < Duration::from_secs(20),
            "no lapse recorded 20 s after a 2 s deadline: {found:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let lapsed = recorded.entry.expect("entry");
    assert_eq!(lapsed.status(), pb::Status::Failed);
    assert_eq!(
        lapsed.approval.expect("approval").state(),
        pb::ApprovalState::Expired
    );
    let scraped = crate::metrics::scrape(server.metrics_addr()).await;
    assert!(
        scraped.contains("ledger_approvals_expired_total 1\n"),
        "counted once: {scraped}"
    );
    let log = server.log.lock().expect("log").clone();
    assert!(
        log.contains("an approval lapsed"),
        "the lapse's log line: {log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_gates_what_it_says_and_sighup_swaps_it() {
    let dir = tempfile::tempdir().expect("dir");
    let policy = dir.path().join("policy");
    std::fs::write(&policy, "* issue_refund /amount > 100\n").expect("policy");
    let policy_flag = policy.display().to_string();
    let (server, _server_dir) = server(&["--approval-policy", &policy_flag]).await;
    let mut client = server.client().await;
    let outcome = |run: &'static str, amount: u32| {
        claim_req(
            run,
            "issue_refund",
            &format!(r#"{{"order":"{run}","amount":{amount}}}"#),
            false,
        )
    };
    assert_eq!(
        claim(&mut client, outcome("r-1", 100)).await.outcome(),
        pb::Outcome::Claimed
    );
    assert_eq!(
        claim(&mut client, outcome("r-2", 101)).await.outcome(),
        pb::Outcome::AwaitingApproval
    );
    // A bad file is refused, named by its line, and the rules in force stay.
    std::fs::write(
        &policy,
        "* issue_refund /amount > 100\n* issue_refund amount > 5\n",
    )
    .expect("policy");
    signal(&server, "HUP");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let log = server.log.lock().expect("log").clone();
        if log.contains("the approval policy was not taken") {
            assert!(log.contains("line 2"), "{log}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no reload line:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        claim(&mut client, outcome("r-3", 50)).await.outcome(),
        pb::Outcome::Claimed
    );
    // A good one is in force for the claims that follow.
    std::fs::write(&policy, "* issue_refund /amount > 10\n").expect("policy");
    signal(&server, "HUP");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut run = 0;
    loop {
        run += 1;
        let out = claim(
            &mut client,
            claim_req(
                "r-4",
                "issue_refund",
                &format!(r#"{{"order":"o-{run}","amount":50}}"#),
                false,
            ),
        )
        .await;
        if out.outcome() == pb::Outcome::AwaitingApproval {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new policy never applied"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_between_the_decision_and_the_claim_loses_nothing() {
    let (mut server, dir) = server(&[]).await;
    let mut client = server.client().await;
    let asked = claim(&mut client, claim_req("run-k", "issue_refund", ARGS, true)).await;
    let entry = asked.entry.expect("entry");
    client
        .decide(bearer(decide_req(&entry, true, "ok"), APPROVER))
        .await
        .expect("decide");
    server.child.start_kill().expect("kill -9");
    server.child.wait().await.expect("gone");
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let tokens = dir.path().join("tokens").display().to_string();
    let restarted = ServerProcess::start(&url, &["--auth-tokens-file", &tokens]).await;
    let mut client = restarted.client().await;
    let acting = claim(&mut client, claim_req("run-k", "issue_refund", ARGS, true)).await;
    assert_eq!(
        acting.outcome(),
        pb::Outcome::Claimed,
        "the approval survived"
    );
    let again = claim(&mut client, claim_req("run-k", "issue_refund", ARGS, true)).await;
    assert_eq!(again.outcome(), pb::Outcome::InProgress, "used once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_lists_approves_and_denies_with_the_fingerprint_shown() {
    let (server, _dir) = server(&[]).await;
    let mut client = server.client().await;
    let refund = claim(&mut client, claim_req("run-c", "issue_refund", ARGS, true))
        .await
        .entry
        .expect("entry");
    let wipe = claim(
        &mut client,
        claim_req("run-c", "delete_account", r#"{"user":"u-9"}"#, true),
    )
    .await
    .entry
    .expect("entry");
    let addr = format!("http://{}", server.addr);
    let cli = |args: &[&str], token: &str| {
        let mut command = crate::support::ledger_command();
        command
            .args(args)
            .args(["--server", &addr])
            .env("LEDGER_TOKEN", token);
        async move {
            let out = tokio::time::timeout(Duration::from_secs(30), command.output())
                .await
                .expect("in time")
                .expect("run");
            (
                out.status.code(),
                String::from_utf8(out.stdout).expect("utf-8"),
                String::from_utf8(out.stderr).expect("utf-8"),
            )
        }
    };
    let (code, listed, _) = cli(&["approvals"], AGENT).await;
    assert_eq!(code, Some(0));
    assert!(
        listed.contains(&refund.key)
            && listed.contains(r#"{"amount":250,"order":"o-1"}"#)
            && listed.contains(&refund.fingerprint)
            && listed.contains("2 calls await a decision"),
        "{listed}"
    );
    let short = &refund.fingerprint[..12];
    // Not an approver: refused by the server.
    let (code, _, err) = cli(&["approve", &refund.key, "--fingerprint", short], AGENT).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("PERMISSION_DENIED") && err.contains("APPROVER_ROLE_REQUIRED"),
        "{err}"
    );
    // The fingerprint of other arguments: refused before anything is sent.
    let wrong = &wipe.fingerprint[..12];
    let (code, _, err) = cli(&["approve", &refund.key, "--fingerprint", wrong], APPROVER).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("APPROVAL_MISMATCH"), "{err}");
    let (code, out, err) = cli(
        &[
            "approve",
            &refund.key,
            "--fingerprint",
            short,
            "--reason",
            "ok",
        ],
        APPROVER,
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("status            AWAITING_APPROVAL"), "{out}");
    assert!(
        out.contains("approval          APPROVED; asked ") && out.contains(": ok; use by "),
        "{out}"
    );
    let (code, _, err) = cli(
        &[
            "deny",
            &wipe.key,
            "--fingerprint",
            &wipe.fingerprint,
            "--reason",
            "accounts are closed by support",
        ],
        APPROVER,
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    let denied = claim(
        &mut client,
        claim_req("run-c", "delete_account", r#"{"user":"u-9"}"#, true),
    )
    .await;
    assert_eq!(denied.outcome(), pb::Outcome::Denied);
    assert!(
        denied.note.contains("accounts are closed by support"),
        "{}",
        denied.note
    );
    let (_, listed, _) = cli(&["approvals"], AGENT).await;
    assert!(
        listed.contains("no call awaits a decision; 1 approved, not yet used by the agent")
            && listed.contains("APPROVED by alice "),
        "{listed}"
    );
}

async fn next(
    stream: &mut tonic::Streaming<pb::WatchApprovalsResponse>,
) -> pb::WatchApprovalsResponse {
    tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("an event within 5 s")
        .expect("the stream goes on")
        .expect("an event")
}
