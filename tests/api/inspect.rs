//! The inspection commands, `idempotency-ledger entries` and `idempotency-ledger entry KEY`: the
//! real binary run against a real server whose entries were made through a real gRPC client,
//! its output read back and checked against what Lookup answers.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use base64::Engine as _;
use idempotency_ledger::grpc::pb;
use prost_types::Timestamp;
use tonic::Request;

use crate::grpc_api::tokens_file;
use crate::support::{Backend, TestApp, free_port, spawn_app_with};

on_every_backend!(
    the_inspection_commands_print_what_the_store_holds,
    entry_finds_an_entry_by_a_unique_key_prefix_or_its_external_ref,
    resolve_settles_an_unknown_outcome_once_and_claims_nothing,
    renew_extends_the_lease_of_the_attempt_whose_token_it_has,
    resolve_is_fenced_and_a_possible_double_effect_is_shown_first_until_acknowledged,
);

const ACME: &str = "token-acme";
const GLOBEX: &str = "token-globex";
const RUN: &str = "run-audit";
/// More than one page of the listing's default page size (100).
const CREDITS: usize = 100;
const EXPLICIT_KEY: &str = "wf-42:step-3";
/// A result that is not UTF-8: shown in base64.
const BINARY_RESULT: &[u8] = &[0xff, 0x00, 0x41];

/// What the binary printed and how it ended.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `idempotency-ledger ARGS` with `env` (and none of the caller's LEDGER_* variables).
async fn cli(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut command = crate::support::ledger_command();
    command.args(args);
    for (k, v) in env {
        command.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(30), command.output())
        .await
        .expect("the command ends within 30 s")
        .expect("run idempotency-ledger");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8(out.stdout).expect("UTF-8 stdout"),
        stderr: String::from_utf8(out.stderr).expect("UTF-8 stderr"),
    }
}

/// Runs the command as tenant acme against `app` and expects success.
async fn acme(app: &TestApp, args: &[&str]) -> String {
    let server = format!("http://{}", app.addr);
    let mut all = args.to_vec();
    all.extend(["--server", &server, "--token", ACME]);
    let run = cli(&all, &[]).await;
    assert_eq!(
        run.code,
        Some(0),
        "{args:?} failed:\n{}\n{}",
        run.stdout,
        run.stderr
    );
    run.stdout
}

/// Runs the command as tenant acme against `app`, whatever its exit status.
async fn acme_run(app: &TestApp, args: &[&str]) -> Run {
    let server = format!("http://{}", app.addr);
    let mut all = args.to_vec();
    all.extend(["--server", &server]);
    cli(&all, &[("LEDGER_TOKEN", ACME)]).await
}

/// The value of one field of `entry`'s output (`name`, two spaces or more, the value).
fn field(out: &str, name: &str) -> String {
    out.lines()
        .find_map(|l| {
            l.strip_prefix(name)
                .filter(|rest| rest.starts_with("  "))
                .map(str::trim)
        })
        .unwrap_or_else(|| panic!("no {name} in:\n{out}"))
        .to_string()
}

fn bearer<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("header"),
    );
    request
}

/// What the test made, by key: the status column, attempt and replay count it expects.
type Expected = BTreeMap<String, (&'static str, u32, u64)>;

/// Claims (and completes, per `outcome`) one entry as `token`; returns its key.
async fn make(
    app: &TestApp,
    token: &str,
    claim: pb::ClaimRequest,
    outcome: Option<pb::CompleteRequest>,
) -> String {
    let mut client = app.client.clone();
    let claimed = client
        .claim(bearer(claim, token))
        .await
        .expect("claim")
        .into_inner();
    assert_eq!(claimed.outcome(), pb::Outcome::Claimed);
    let key = claimed.entry.expect("entry").key;
    if let Some(complete) = outcome {
        client
            .complete(bearer(
                pb::CompleteRequest {
                    key: key.clone(),
                    claim_token: claimed.claim_token,
                    ..complete
                },
                token,
            ))
            .await
            .expect("complete");
    }
    key
}

fn claim(run: &str, tool: &str, args: &str) -> pb::ClaimRequest {
    pb::ClaimRequest {
        run_id: run.into(),
        tool: tool.into(),
        arguments_json: args.into(),
        principal: "agent-7".into(),
        // Longer than the hour the clock is moved, so attempts in flight stay ATTEMPTING.
        lease: Some(prost_types::Duration {
            seconds: 3 * 3600,
            nanos: 0,
        }),
        ..Default::default()
    }
}

fn succeeded(result: &[u8]) -> Option<pb::CompleteRequest> {
    Some(pb::CompleteRequest {
        status: pb::Status::Succeeded.into(),
        result: result.to_vec().into(),
        ..Default::default()
    })
}

fn failed(error: &str, retryable: bool) -> Option<pb::CompleteRequest> {
    Some(pb::CompleteRequest {
        status: pb::Status::Failed.into(),
        error: error.into(),
        retryable,
        ..Default::default()
    })
}

/// Fills the store: in run-audit, 100 credits (every tenth replayed, the first three times),
/// three replies in flight, a permanent and a retried retryable failure, an unknown outcome, an
/// explicit key with a binary result; two entries of another run; globex's entry in run-audit;
/// and an hour later, three entries of run-later.
async fn fill(app: &TestApp) -> (Expected, Vec<String>) {
    let mut expected = Expected::new();
    for i in 0..CREDITS {
        let args = format!("{{\"customer\":\"c-{i}\",\"amount\":{i}}}");
        let key = make(
            app,
            ACME,
            claim(RUN, "issue_credit", &args),
            succeeded(format!("{{\"credit_id\":\"cr-{i}\"}}").as_bytes()),
        )
        .await;
        let replays = match i {
            0 => 3,
            i if i % 10 == 0 => 1,
            _ => 0,
        };
        for _ in 0..replays {
            let again = app
                .client
                .clone()
                .claim(bearer(claim(RUN, "issue_credit", &args), ACME))
                .await
                .expect("replay")
                .into_inner();
            assert_eq!(again.outcome(), pb::Outcome::Replayed);
        }
        expected.insert(key, ("SUCCEEDED", 1, replays));
    }
    for i in 0..3 {
        let key = make(
            app,
            ACME,
            claim(RUN, "send_reply", &format!("{{\"ticket\":{i}}}")),
            None,
        )
        .await;
        expected.insert(key, ("ATTEMPTING", 1, 0));
    }
    let key = make(
        app,
        ACME,
        claim(RUN, "open_ticket", "{\"queue\":\"billing\"}"),
        failed("queue closed\nretry tomorrow", false),
    )
    .await;
    expected.insert(key, ("FAILED (permanent)", 1, 0));
    // A retryable failure, claimed again and failed again: attempt 2.
    let refund = claim(RUN, "refund", "{\"order\":\"o-1\"}");
    make(app, ACME, refund.clone(), failed("gateway said no", true)).await;
    let key = make(app, ACME, refund, failed("gateway said no again", true)).await;
    expected.insert(key, ("FAILED (retryable)", 2, 0));
    let key = make(
        app,
        ACME,
        claim(RUN, "send_sms", "{\"to\":\"+15550100\"}"),
        Some(pb::CompleteRequest {
            status: pb::Status::Unknown.into(),
            error: "timed out after 30 s".into(),
            ..Default::default()
        }),
    )
    .await;
    expected.insert(key, ("UNKNOWN", 1, 0));
    let key = make(
        app,
        ACME,
        pb::ClaimRequest {
            key: EXPLICIT_KEY.into(),
            ..claim(RUN, "charge_card", "{\"card\":\"tok_visa\",\"cents\":1299}")
        },
        succeeded(BINARY_RESULT),
    )
    .await;
    assert_eq!(key, EXPLICIT_KEY);
    expected.insert(key, ("SUCCEEDED", 1, 0));

    for i in 0..2 {
        make(
            app,
            ACME,
            claim("run-other", "issue_credit", &format!("{{\"n\":{i}}}")),
            succeeded(b"{}"),
        )
        .await;
    }
    // Same run name, another tenant: never in acme's listing.
    make(
        app,
        GLOBEX,
        claim(RUN, "issue_credit", "{\"customer\":\"c-globex\"}"),
        succeeded(b"{}"),
    )
    .await;

    app.clock.advance(Duration::from_secs(3600));
    let mut later = Vec::new();
    for i in 0..3 {
        later.push(
            make(
                app,
                ACME,
                claim("run-later", "issue_credit", &format!("{{\"n\":{i}}}")),
                succeeded(b"{}"),
            )
            .await,
        );
    }
    (expected, later)
}

/// The cells of a table row (columns are separated by at least two spaces).
fn cells(line: &str) -> Vec<&str> {
    line.split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

/// The data rows of a table (between the header and the count line), and the count line.
fn table(stdout: &str) -> (Vec<Vec<&str>>, &str) {
    let lines: Vec<&str> = stdout.lines().collect();
    let (count, body) = lines.split_last().expect("a count line");
    if body.is_empty() {
        return (Vec::new(), count);
    }
    assert!(body[0].starts_with("STARTED_AT"), "a header:\n{stdout}");
    (body[1..].iter().map(|l| cells(l)).collect(), count)
}

/// The keys of a `--wide` table (KEY is the second column).
fn keys(stdout: &str) -> Vec<String> {
    table(stdout)
        .0
        .iter()
        .map(|row| row[1].to_string())
        .collect()
}

fn time_of(value: &serde_json::Value) -> Option<Timestamp> {
    value
        .as_str()
        .map(|t| Timestamp::from_str(t).expect("an RFC 3339 time"))
}

/// Checks that a JSON entry says what Lookup says, field by field.
fn assert_same_entry(json: &serde_json::Value, entry: &pb::Entry) {
    let key = &entry.key;
    assert_eq!(json["key"], entry.key.as_str());
    assert_eq!(json["runId"], entry.run_id.as_str(), "{key}");
    assert_eq!(json["tool"], entry.tool.as_str(), "{key}");
    assert_eq!(json["fingerprint"], entry.fingerprint.as_str(), "{key}");
    assert_eq!(json["status"], entry.status().as_str_name(), "{key}");
    assert_eq!(json["attempt"], entry.attempt, "{key}");
    let result = base64::engine::general_purpose::STANDARD
        .decode(json["result"].as_str().expect("result"))
        .expect("base64");
    assert_eq!(result, entry.result.to_vec(), "{key}");
    match std::str::from_utf8(&entry.result) {
        Ok(text) => assert_eq!(json["resultText"], text, "{key}"),
        Err(_) => assert!(json["resultText"].is_null(), "{key}"),
    }
    assert_eq!(json["error"], entry.error.as_str(), "{key}");
    assert_eq!(json["retryable"], entry.retryable, "{key}");
    assert_eq!(json["principal"], entry.principal.as_str(), "{key}");
    assert_eq!(time_of(&json["startedAt"]), entry.started_at, "{key}");
    assert_eq!(time_of(&json["finishedAt"]), entry.finished_at, "{key}");
    assert_eq!(
        time_of(&json["leaseExpiresAt"]),
        entry.lease_expires_at,
        "{key}"
    );
    assert_eq!(time_of(&json["expiresAt"]), entry.expires_at, "{key}");
    assert_eq!(
        json["replayCount"],
        entry.replay_count.to_string().as_str(),
        "{key}"
    );
    assert_eq!(json["externalRef"], entry.external_ref.as_str(), "{key}");
    assert_eq!(
        json["argumentsJson"],
        entry.arguments_json.as_str(),
        "{key}"
    );
    assert!(!entry.arguments_json.is_empty(), "{key}: arguments kept");
}

async fn lookup(app: &TestApp, key: &str) -> pb::Entry {
    app.client
        .clone()
        .lookup(bearer(
            pb::LookupRequest {
                key: key.into(),
                ..Default::default()
            },
            ACME,
        ))
        .await
        .expect("lookup")
        .into_inner()
        .entry
        .expect("entry")
}

async fn the_inspection_commands_print_what_the_store_holds(backend: Backend) {
    let dir = tempfile::tempdir().expect("temp dir");
    let tokens = tokens_file(&dir);
    let app = spawn_app_with(backend, |s| {
        s.auth_tokens_file = Some(tokens);
        s.max_lease = Duration::from_secs(4 * 3600);
    })
    .await;
    let (expected, later) = fill(&app).await;
    let total = expected.len();
    assert_eq!(total, CREDITS + 7);

    // Every entry of the run exactly once, with its status, attempt and replays; the count.
    let out = acme(&app, &["entries", "--run", RUN, "--wide"]).await;
    let (rows, count) = table(&out);
    assert_eq!(count, format!("{total} entries"), "{out}");
    let mut seen = BTreeMap::new();
    for row in &rows {
        // STARTED_AT KEY TOOL STATUS ATTEMPT REPLAYS FINISHED_AT [ERROR]: no RUN column.
        assert!(row.len() >= 7, "{row:?}");
        let key = row[1].to_string();
        let (status, attempt, replays): (&str, u32, u64) = (
            row[3],
            row[4].parse().expect("attempt"),
            row[5].parse().expect("replays"),
        );
        assert!(
            seen.insert(key.clone(), (status, attempt, replays))
                .is_none(),
            "{key} listed twice:\n{out}"
        );
    }
    let seen: Expected = seen
        .into_iter()
        .map(|(k, (s, a, r))| {
            let status = expected.get(&k).map_or("?", |e| e.0);
            assert_eq!(status, s, "{k} status in:\n{out}");
            (k, (status, a, r))
        })
        .collect();
    assert_eq!(seen, expected, "the listing of {RUN}:\n{out}");
    // The error column shows a newline escaped, so the row stays one line.
    let failure = rows
        .iter()
        .find(|r| r[3] == "FAILED (permanent)")
        .expect("the permanent failure");
    assert_eq!(failure.last(), Some(&"queue closed\\nretry tomorrow"));

    // Without --wide the same rows, keys shortened; the explicit key is short enough to stay.
    let out = acme(&app, &["entries", "--run", RUN]).await;
    let (rows, count) = table(&out);
    assert_eq!(
        (rows.len(), count),
        (total, format!("{total} entries").as_str())
    );
    assert!(rows.iter().any(|r| r[1] == EXPLICIT_KEY), "{out}");
    assert!(
        rows.iter()
            .filter(|r| r[1] != EXPLICIT_KEY)
            .all(|r| r[1].chars().count() == 16 && r[1].ends_with('…')),
        "{out}"
    );

    // Filters.
    let out = acme(&app, &["entries", "--run", RUN, "--tool", "send_reply"]).await;
    assert_eq!(table(&out).1, "3 entries", "{out}");
    let failures: Vec<String> = expected
        .iter()
        .filter(|(_, e)| e.0.starts_with("FAILED"))
        .map(|(k, _)| k.clone())
        .collect();
    // A state in any case, or by its proto name as `entry` and --json print it.
    for status in ["failed", "FAILED", "Failed", "STATUS_FAILED"] {
        let out = acme(&app, &["entries", "--status", status, "--wide"]).await;
        let mut listed = keys(&out);
        listed.sort();
        assert_eq!(listed, failures, "--status {status}:\n{out}");
    }
    let out = acme(&app, &["entries", "--status", "unknown"]).await;
    assert_eq!(table(&out).1, "1 entry", "{out}");
    let out = acme(&app, &["entries", "--status", "attempting", "--run", RUN]).await;
    assert_eq!(table(&out).1, "3 entries", "{out}");
    // Another run is listed with a RUN column; no run filter lists every run of the tenant.
    let out = acme(&app, &["entries", "--run", "run-other"]).await;
    assert_eq!(table(&out).1, "2 entries", "{out}");
    let out = acme(&app, &["entries"]).await;
    assert_eq!(table(&out).1, format!("{} entries", total + 2 + 3), "{out}");
    assert!(
        out.lines().next().is_some_and(|h| h.contains("  RUN  ")),
        "{out}"
    );

    // A time range: the hour later starts where the entries of run-later start.
    let later_start = lookup(&app, &later[0])
        .await
        .started_at
        .expect("started_at")
        .to_string();
    let out = acme(&app, &["entries", "--since", &later_start, "--wide"]).await;
    let mut listed = keys(&out);
    listed.sort();
    let mut want = later.clone();
    want.sort();
    assert_eq!(listed, want, "{out}");
    let out = acme(&app, &["entries", "--until", &later_start]).await;
    assert_eq!(table(&out).1, format!("{} entries", total + 2), "{out}");
    // Relative: nothing started more than half an hour before now.
    let out = acme(&app, &["entries", "--until", "30m"]).await;
    assert_eq!(out, "0 entries\n");

    // --limit stops early and says more match; --page-size pages in smaller steps.
    let out = acme(&app, &["entries", "--run", RUN, "--limit", "5"]).await;
    let (rows, count) = table(&out);
    assert_eq!(rows.len(), 5, "{out}");
    assert_eq!(count, "5 entries (--limit reached; more match)");
    let out = acme(
        &app,
        &["entries", "--run", RUN, "--page-size", "7", "--wide"],
    )
    .await;
    let mut listed = keys(&out);
    listed.sort();
    assert_eq!(
        listed,
        expected.keys().cloned().collect::<Vec<_>>(),
        "{out}"
    );

    // --json: an array of what Lookup answers, field by field.
    let out = acme(&app, &["entries", "--run", RUN, "--json"]).await;
    let listed: Vec<serde_json::Value> = serde_json::from_str(&out).expect("a JSON array");
    assert_eq!(listed.len(), total);
    for json in &listed {
        let key = json["key"].as_str().expect("key");
        assert_same_entry(json, &lookup(&app, key).await);
    }
    let out = acme(&app, &["entries", "--run", "no-such-run", "--json"]).await;
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).ok(),
        Some(serde_json::json!([]))
    );

    // entry KEY: every field a line; the binary result in base64.
    let out = acme(&app, &["entry", EXPLICIT_KEY]).await;
    let field = |name: &str| {
        out.lines()
            .find_map(|l| {
                l.strip_prefix(name)
                    .filter(|rest| rest.starts_with("  "))
                    .map(str::trim)
            })
            .unwrap_or_else(|| panic!("no {name} in:\n{out}"))
    };
    let stored = lookup(&app, EXPLICIT_KEY).await;
    assert_eq!(field("key"), EXPLICIT_KEY);
    assert_eq!(field("status"), "SUCCEEDED");
    assert_eq!(field("run_id"), RUN);
    assert_eq!(field("principal"), "agent-7");
    assert_eq!(field("external_ref"), stored.external_ref);
    assert_eq!(field("arguments_json"), stored.arguments_json);
    assert_eq!(field("result (base64)"), "/wBB");
    assert_eq!(
        field("started_at"),
        stored.started_at.expect("started").to_string()
    );
    let out = acme(&app, &["entry", EXPLICIT_KEY, "--json"]).await;
    assert_same_entry(&serde_json::from_str(&out).expect("a JSON object"), &stored);

    // A missing key (and globex's key, indistinguishable) exits 1 with the message.
    let server = format!("http://{}", app.addr);
    let globex_key = {
        let mut client = app.client.clone();
        let r = client
            .lookup(bearer(
                pb::LookupRequest {
                    run_id: RUN.into(),
                    tool: "issue_credit".into(),
                    arguments_json: "{\"customer\":\"c-globex\"}".into(),
                    ..Default::default()
                },
                GLOBEX,
            ))
            .await
            .expect("globex lookup");
        r.into_inner().entry.expect("entry").key
    };
    for key in ["no-such-key", globex_key.as_str()] {
        let run = cli(
            &["entry", key, "--server", &server],
            &[("LEDGER_TOKEN", ACME)],
        )
        .await;
        assert_eq!(run.code, Some(1), "{}{}", run.stdout, run.stderr);
        assert!(
            run.stderr.contains(&format!("no entry with key {key}")),
            "{}",
            run.stderr
        );
        assert_eq!(run.stdout, "");
    }

    // A wrong token, or none: UNAUTHENTICATED, a failure (not "no entry").
    for token in [Some("token-wrong"), None] {
        let env: Vec<(&str, &str)> = token.map(|t| ("LEDGER_TOKEN", t)).into_iter().collect();
        for args in [
            vec!["entries", "--server", &server],
            vec!["entry", EXPLICIT_KEY, "--server", &server],
        ] {
            let run = cli(&args, &env).await;
            assert_eq!(run.code, Some(2), "{args:?}: {}{}", run.stdout, run.stderr);
            assert!(
                run.stderr.contains("UNAUTHENTICATED"),
                "{args:?}: {}",
                run.stderr
            );
            // What to change is this command's flag or variable, not a gRPC header.
            assert!(
                run.stderr.contains("--token") && run.stderr.contains("LEDGER_TOKEN"),
                "{args:?}: {}",
                run.stderr
            );
            assert!(!run.stderr.contains("authorization"), "{}", run.stderr);
        }
    }
}

async fn entry_finds_an_entry_by_a_unique_key_prefix_or_its_external_ref(backend: Backend) {
    let dir = tempfile::tempdir().expect("temp dir");
    let tokens = tokens_file(&dir);
    let app = spawn_app_with(backend, |s| {
        s.auth_tokens_file = Some(tokens);
        s.max_lease = Duration::from_secs(4 * 3600);
    })
    .await;
    let mut derived = Vec::new();
    for i in 0..5 {
        let args = format!("{{\"customer\":\"c-{i}\"}}");
        derived.push(
            make(
                &app,
                ACME,
                claim(RUN, "issue_credit", &args),
                succeeded(b"{}"),
            )
            .await,
        );
    }
    for key in ["wf-42:step-3", "wf-42:step-4"] {
        let request = pb::ClaimRequest {
            key: key.into(),
            ..claim(RUN, "charge_card", &format!("{{\"step\":\"{key}\"}}"))
        };
        make(&app, ACME, request, succeeded(b"{}")).await;
    }
    // Another tenant's keys neither match nor make a prefix ambiguous.
    for key in ["wf-42:step-5", "wf-43:step-1"] {
        let request = pb::ClaimRequest {
            key: key.into(),
            ..claim(RUN, "charge_card", "{}")
        };
        make(&app, GLOBEX, request, succeeded(b"{}")).await;
    }

    // The table's shortened keys, with and without the `…`, print what the whole key does.
    let out = acme(&app, &["entries", "--run", RUN]).await;
    let (rows, _) = table(&out);
    let mut seen = 0;
    for row in &rows {
        let cell = row[1];
        let Some(prefix) = cell.strip_suffix('…') else {
            continue;
        };
        assert_eq!(prefix.chars().count(), 15, "{cell}");
        let key = derived
            .iter()
            .find(|k| k.starts_with(prefix))
            .unwrap_or_else(|| panic!("{cell} is none of {derived:?}"));
        let whole = acme(&app, &["entry", key]).await;
        assert_eq!(field(&whole, "key"), *key);
        assert_eq!(acme(&app, &["entry", cell]).await, whole, "{cell}");
        assert_eq!(acme(&app, &["entry", prefix]).await, whole, "{prefix}");
        // Six characters are enough when they are unique (five random keys: they are).
        assert_eq!(acme(&app, &["entry", &key[..6]]).await, whole);
        seen += 1;
    }
    assert_eq!(seen, derived.len(), "{out}");

    // An external_ref, of a derived key and of an explicit one.
    for key in [derived[0].as_str(), "wf-42:step-3"] {
        let stored = lookup(&app, key).await;
        assert!(stored.external_ref.starts_with("idem-"), "{stored:?}");
        let by_ref = acme(&app, &["entry", &stored.external_ref]).await;
        assert_eq!(by_ref, acme(&app, &["entry", key]).await);
        let json = acme(&app, &["entry", &stored.external_ref, "--json"]).await;
        assert_same_entry(
            &serde_json::from_str(&json).expect("a JSON object"),
            &stored,
        );
    }

    // An ambiguous prefix is refused, naming how many and which keys match (acme's only).
    for prefix in ["wf-42:", "wf-42:step-", "wf-42:step…"] {
        let run = acme_run(&app, &["entry", prefix]).await;
        assert_eq!(run.code, Some(2), "{prefix}: {}{}", run.stdout, run.stderr);
        assert_eq!(run.stdout, "");
        let shown = prefix.trim_end_matches('…');
        assert!(
            run.stderr.starts_with(&format!(
                "error: `{shown}` is ambiguous: 2 entries match it"
            )),
            "{}",
            run.stderr
        );
        let listed: Vec<&str> = run
            .stderr
            .lines()
            .filter_map(|l| l.strip_prefix("  "))
            .collect();
        assert_eq!(listed, ["wf-42:step-3", "wf-42:step-4"], "{}", run.stderr);
    }

    // What matches nothing is a missing entry (1); what is too short to mean one is refused.
    for (text, message) in [
        (
            "wf-43:",
            "no entry with key wf-43:, nor one whose key starts with it".to_string(),
        ),
        (
            "ffffff0000…",
            "no entry whose key starts with ffffff0000".to_string(),
        ),
        ("wf-4", "no entry with key wf-4".to_string()),
        (
            &"0".repeat(64),
            format!("no entry with key {}", "0".repeat(64)),
        ),
    ] {
        let run = acme_run(&app, &["entry", text]).await;
        assert_eq!(run.code, Some(1), "{text}: {}{}", run.stdout, run.stderr);
        assert!(run.stderr.starts_with(&message), "{text}: {}", run.stderr);
    }
    let run = acme_run(&app, &["entry", "wf-4"]).await;
    assert!(
        run.stderr.contains("at least 6 characters"),
        "{}",
        run.stderr
    );
    let run = acme_run(&app, &["entry", "wf-…"]).await;
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr.contains("at least 6 characters"),
        "{}",
        run.stderr
    );

    // The search is bounded. Oldest first, the sixth entry is wf-42:step-3: a search that
    // stops there has seen one match of `wf-42:`, and is refused, for wf-42:step-4 is next.
    let run = acme_run(&app, &["entry", "wf-42:", "--search-limit", "6"]).await;
    assert_eq!(run.code, Some(2), "{}{}", run.stdout, run.stderr);
    assert_eq!(run.stdout, "");
    assert!(
        run.stderr.starts_with(
            "error: `wf-42:` matches wf-42:step-3 among the tenant's first 6 entries, but the \
             search stops there"
        ),
        "{}",
        run.stderr
    );
    let step_4 = lookup(&app, "wf-42:step-4").await.external_ref;
    let run = acme_run(&app, &["entry", &step_4, "--search-limit", "6"]).await;
    assert_eq!(run.code, Some(2), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("none of the tenant's first 6 entries"),
        "{}",
        run.stderr
    );
    // A limit that reaches it finds it; a whole key is never searched for.
    let whole = acme(&app, &["entry", "wf-42:step-4"]).await;
    assert_eq!(
        acme(&app, &["entry", &step_4, "--search-limit", "7"]).await,
        whole
    );
    assert_eq!(
        acme(&app, &["entry", "wf-42:step-4", "--search-limit", "1"]).await,
        whole
    );
}

fn unknown(error: &str) -> Option<pb::CompleteRequest> {
    Some(pb::CompleteRequest {
        status: pb::Status::Unknown.into(),
        error: error.into(),
        ..Default::default()
    })
}

async fn claim_again(app: &TestApp, request: pb::ClaimRequest) -> pb::ClaimResponse {
    app.client
        .clone()
        .claim(bearer(request, ACME))
        .await
        .expect("claim")
        .into_inner()
}

async fn resolve_settles_an_unknown_outcome_once_and_claims_nothing(backend: Backend) {
    let dir = tempfile::tempdir().expect("temp dir");
    let tokens = tokens_file(&dir);
    let app = spawn_app_with(backend, |s| {
        s.auth_tokens_file = Some(tokens);
        s.max_lease = Duration::from_secs(4 * 3600);
    })
    .await;
    let sms = claim(RUN, "send_sms", "{\"to\":\"+15550100\"}");
    let sms_key = make(&app, ACME, sms.clone(), unknown("timed out after 30 s")).await;
    let refund = claim(RUN, "refund", "{\"order\":\"o-1\"}");
    let refund_key = make(&app, ACME, refund.clone(), unknown("gateway timed out")).await;
    let left_key = make(
        &app,
        ACME,
        claim(RUN, "send_sms", "{\"to\":\"+15550101\"}"),
        unknown("timed out"),
    )
    .await;
    let in_flight = make(&app, ACME, claim(RUN, "send_reply", "{\"ticket\":1}"), None).await;
    let short = pb::ClaimRequest {
        lease: Some(prost_types::Duration {
            seconds: 60,
            nanos: 0,
        }),
        ..claim(RUN, "open_ticket", "{\"queue\":\"billing\"}")
    };
    let lapsing = make(&app, ACME, short.clone(), None).await;
    let done = make(
        &app,
        ACME,
        claim(RUN, "issue_credit", "{\"amount\":5}"),
        succeeded(b"{\"credit_id\":\"cr-1\"}"),
    )
    .await;
    let globex = make(
        &app,
        GLOBEX,
        pb::ClaimRequest {
            key: "wf-globex:1".into(),
            ..claim(RUN, "send_sms", "{}")
        },
        unknown("timed out"),
    )
    .await;

    // The effect was found: by the table's prefix, the entry is SUCCEEDED with the result,
    // printed as `entry` prints it, and a repeat of the intent replays it.
    let found = "{\"sms_id\":\"s-981\"}";
    let cut = format!("{}…", &sms_key[..15]);
    let out = acme(&app, &["resolve", &cut, "--succeeded", found]).await;
    assert_eq!(field(&out, "key"), sms_key);
    assert_eq!(field(&out, "status"), "SUCCEEDED");
    assert_eq!(field(&out, "result (UTF-8)"), found);
    assert!(
        field(&out, "resolved_by").starts_with("cli:"),
        "the operator is recorded: {out}"
    );
    // `entry` prints the same fields, then the entry's history: the finding just applied.
    let shown = acme(&app, &["entry", &sms_key]).await;
    let history = shown
        .strip_prefix(out.as_str())
        .unwrap_or_else(|| panic!("entry prints the same fields first:\n{shown}\n---\n{out}"));
    assert!(
        history.starts_with("history\n")
            && history.contains("finding_applied  attempt 1  cli:")
            && history.contains("found: the effect exists"),
        "{history}"
    );
    let again = claim_again(&app, sms.clone()).await;
    assert_eq!(again.outcome(), pb::Outcome::Replayed);
    assert_eq!(&again.entry.expect("entry").result[..], found.as_bytes());
    // The same resolution again changes nothing, and says so.
    let run = acme_run(&app, &["resolve", &sms_key, "--succeeded", found]).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let shown = acme(&app, &["entry", &sms_key]).await;
    assert!(
        shown.starts_with(&run.stdout),
        "{shown}\n---\n{}",
        run.stdout
    );
    assert!(
        run.stderr
            .contains("already resolved with this outcome: nothing changed"),
        "{}",
        run.stderr
    );
    // Another outcome for a resolved entry (by the resolution above, or by its claimant) is
    // refused and changes nothing.
    for key in [sms_key.as_str(), done.as_str()] {
        let run = acme_run(
            &app,
            &["resolve", key, "--failed", "no such sms", "--retryable"],
        )
        .await;
        assert_eq!(run.code, Some(2), "{key}: {}{}", run.stdout, run.stderr);
        assert_eq!(run.stdout, "");
        assert!(
            run.stderr
                .starts_with("error: FAILED_PRECONDITION (ALREADY_RESOLVED): "),
            "{}",
            run.stderr
        );
        assert!(run.stderr.contains("SUCCEEDED"), "{}", run.stderr);
        assert_eq!(lookup(&app, key).await.status(), pb::Status::Succeeded);
    }

    // The effect was not found, by external_ref: retryable, so the next claim tries again.
    let reference = lookup(&app, &refund_key).await.external_ref;
    let out = acme(
        &app,
        &[
            "resolve",
            &reference,
            "--failed",
            "no refund at the gateway",
            "--retryable",
            "--principal",
            "ops:alice",
            "--json",
        ],
    )
    .await;
    let json: serde_json::Value = serde_json::from_str(&out).expect("a JSON object");
    assert_eq!(json["key"], refund_key.as_str());
    assert_eq!(json["status"], "STATUS_FAILED");
    assert_eq!(json["error"], "no refund at the gateway");
    assert_eq!(json["retryable"], true);
    assert_eq!(json["resolvedBy"], "ops:alice");
    let again = claim_again(&app, refund).await;
    assert_eq!(again.outcome(), pb::Outcome::Claimed);
    assert_eq!(again.entry.expect("entry").attempt, 2);

    // An attempt in its lease is its claimant's: refused, still ATTEMPTING.
    let run = acme_run(&app, &["resolve", &in_flight, "--succeeded", "{}"]).await;
    assert_eq!(run.code, Some(2), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stderr
            .starts_with("error: FAILED_PRECONDITION (LEASE_NOT_ENDED): "),
        "{}",
        run.stderr
    );
    assert_eq!(
        lookup(&app, &in_flight).await.status(),
        pb::Status::Attempting
    );
    // Past its lease it reads UNKNOWN and is resolved like one; a permanent failure.
    app.clock.advance(Duration::from_secs(120));
    let out = acme(&app, &["resolve", &lapsing, "--failed", "queue closed"]).await;
    assert_eq!(field(&out, "status"), "FAILED");
    assert_eq!(field(&out, "retryable"), "false");
    let again = claim_again(&app, short).await;
    assert_eq!(again.outcome(), pb::Outcome::PreviouslyFailed);

    // No entry (and another tenant's, indistinguishable): exit 1, and globex's is untouched.
    for key in ["no-such-key", globex.as_str()] {
        let run = acme_run(&app, &["resolve", key, "--succeeded", "{}"]).await;
        assert_eq!(run.code, Some(1), "{key}: {}{}", run.stdout, run.stderr);
        assert!(
            run.stderr.starts_with(&format!("no entry with key {key}")),
            "{}",
            run.stderr
        );
    }
    let stays = app
        .client
        .clone()
        .lookup(bearer(
            pb::LookupRequest {
                key: globex.clone(),
                ..Default::default()
            },
            GLOBEX,
        ))
        .await
        .expect("globex lookup")
        .into_inner()
        .entry
        .expect("entry");
    assert_eq!(stays.status(), pb::Status::Unknown);

    // resolve hands out and holds nothing: after one more, a reconciler still gets the
    // unknown entry nobody resolved.
    acme(&app, &["resolve", &sms_key, "--succeeded", found]).await;
    let pending = app
        .client
        .clone()
        .reconcile(bearer(
            pb::ReconcileRequest {
                limit: 100,
                ..Default::default()
            },
            ACME,
        ))
        .await
        .expect("reconcile")
        .into_inner()
        .pending;
    let keys: Vec<&str> = pending.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, [left_key.as_str()]);
}

async fn renew_extends_the_lease_of_the_attempt_whose_token_it_has(backend: Backend) {
    let dir = tempfile::tempdir().expect("temp dir");
    let tokens = tokens_file(&dir);
    // The default lease (60 s) and maximum (1 h).
    let app = spawn_app_with(backend, |s| s.auth_tokens_file = Some(tokens)).await;
    let request = pb::ClaimRequest {
        lease: None,
        ..claim(RUN, "request_approval", "{\"amount\":5000}")
    };
    let claimed = claim_again(&app, request.clone()).await;
    assert_eq!(claimed.outcome(), pb::Outcome::Claimed);
    let token = claimed.claim_token;
    let entry = claimed.entry.expect("entry");
    let key = entry.key;
    let started = entry.started_at.expect("started_at");
    let after = |seconds: i64| {
        Timestamp {
            seconds: started.seconds + seconds,
            nanos: started.nanos,
        }
        .to_string()
    };

    // By the table's prefix: ten minutes from now, printed and stored.
    app.clock.advance(Duration::from_secs(30));
    let cut = format!("{}…", &key[..15]);
    let out = acme(
        &app,
        &["renew", &cut, "--claim-token", &token, "--lease", "10m"],
    )
    .await;
    assert_eq!(
        out,
        format!(
            "key               {key}\nlease_expires_at  {}\n",
            after(630)
        )
    );
    assert_eq!(
        lookup(&app, &key)
            .await
            .lease_expires_at
            .map(|t| t.to_string()),
        Some(after(630))
    );
    // Past the first lease, a duplicate still finds the attempt in flight, not UNKNOWN.
    app.clock.advance(Duration::from_secs(300));
    let duplicate = claim_again(&app, request.clone()).await;
    assert_eq!(duplicate.outcome(), pb::Outcome::InProgress);
    assert_eq!(
        duplicate.entry.expect("entry").status(),
        pb::Status::Attempting
    );
    // Without --lease, the server's default from now; --json prints the entry.
    let out = acme(&app, &["renew", &key, "--claim-token", &token, "--json"]).await;
    let json: serde_json::Value = serde_json::from_str(&out).expect("a JSON object");
    assert_eq!(json["key"], key.as_str());
    assert_eq!(json["status"], "STATUS_ATTEMPTING");
    assert_eq!(json["leaseExpiresAt"], after(330 + 60).as_str());

    // A wrong token, or a lease above the maximum, is refused and changes nothing.
    for (args, refusal) in [
        (
            vec!["--claim-token", "0123456789abcdef0123456789abcdef"],
            "error: FAILED_PRECONDITION (STALE_CLAIM_TOKEN): ",
        ),
        (
            vec!["--claim-token", token.as_str(), "--lease", "2h"],
            "error: INVALID_ARGUMENT",
        ),
    ] {
        let mut all = vec!["renew", key.as_str()];
        all.extend(args);
        let run = acme_run(&app, &all).await;
        assert_eq!(run.code, Some(2), "{all:?}: {}{}", run.stdout, run.stderr);
        assert_eq!(run.stdout, "");
        assert!(run.stderr.starts_with(refusal), "{}", run.stderr);
    }
    assert_eq!(
        lookup(&app, &key)
            .await
            .lease_expires_at
            .map(|t| t.to_string()),
        Some(after(390))
    );
    // A lease that ended is not revived: the entry reads UNKNOWN, a reconciler's now.
    app.clock.advance(Duration::from_secs(120));
    let run = acme_run(&app, &["renew", &key, "--claim-token", &token]).await;
    assert_eq!(run.code, Some(2), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stderr
            .starts_with("error: FAILED_PRECONDITION (LEASE_ENDED): "),
        "{}",
        run.stderr
    );
    assert_eq!(lookup(&app, &key).await.status(), pb::Status::Unknown);
    let run = acme_run(&app, &["renew", "no-such-key", "--claim-token", &token]).await;
    assert_eq!(run.code, Some(1), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stderr.starts_with("no entry with key no-such-key"),
        "{}",
        run.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_cannot_be_reached_is_named_with_the_cause() {
    let server = format!("http://127.0.0.1:{}", free_port());
    for args in [vec!["entries"], vec!["entry", "some-key"]] {
        let mut all = args.clone();
        all.extend(["--server", &server, "--timeout", "3s"]);
        let run = cli(&all, &[]).await;
        assert_eq!(run.code, Some(2), "{args:?}: {}", run.stderr);
        assert!(
            run.stderr
                .contains(&format!("error: cannot connect to {server}")),
            "{}",
            run.stderr
        );
        assert!(
            run.stderr.to_lowercase().contains("connection refused"),
            "{}",
            run.stderr
        );
    }
    // A server without a scheme is plaintext http.
    let bare = server.trim_start_matches("http://");
    let run = cli(&["entry", "k", "--server", bare], &[]).await;
    assert!(
        run.stderr.contains(&format!("cannot connect to {server}")),
        "{}",
        run.stderr
    );
}

/// The real server binary with TLS; `entry` reaches it with --ca-cert (the answer, NOT_FOUND of
/// a key nobody claimed, needs no entry), and only with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_commands_speak_tls_and_mutual_tls() {
    let pki = crate::operations::pki();
    let path = |name: &str| pki.dir.path().join(name).to_string_lossy().into_owned();
    std::fs::write(pki.dir.path().join("client.pem"), &pki.client_cert_pem).expect("write");
    std::fs::write(pki.dir.path().join("client.key"), &pki.client_key_pem).expect("write");
    let (_db, port, server) = crate::operations::mutual_tls_server(&pki).await;
    let url = format!("https://localhost:{port}");
    let ca = path("ca.pem");
    let mtls = [
        "--ca-cert",
        ca.as_str(),
        "--client-cert",
        &path("client.pem"),
        "--client-key",
        &path("client.key"),
    ];
    let with_certificate: Vec<&str> = ["entry", "k-tls", "--server", &url]
        .into_iter()
        .chain(mtls.iter().copied())
        .collect();
    let run = cli(&with_certificate, &[]).await;
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(
        run.stderr.contains("no entry with key k-tls"),
        "{}",
        run.stderr
    );
    // By IP address, with the certificate's name given.
    let by_ip = format!("https://127.0.0.1:{port}");
    let mut args = with_certificate.clone();
    args[3] = &by_ip;
    args.extend(["--tls-server-name", "localhost"]);
    assert_eq!(cli(&args, &[]).await.code, Some(1));
    // Without the client certificate the server refuses the connection.
    let run = cli(&["entry", "k-tls", "--server", &url, "--ca-cert", &ca], &[]).await;
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    // Without --ca-cert, https is refused before connecting.
    let run = cli(&["entry", "k-tls", "--server", &url], &[]).await;
    assert_eq!(run.code, Some(2));
    assert!(run.stderr.contains("needs --ca-cert"), "{}", run.stderr);
    drop(server);
}

async fn resolve_is_fenced_and_a_possible_double_effect_is_shown_first_until_acknowledged(
    backend: Backend,
) {
    let dir = tempfile::tempdir().expect("temp dir");
    let tokens = tokens_file(&dir);
    let app = spawn_app_with(backend, |s| {
        s.auth_tokens_file = Some(tokens);
        s.max_lease = Duration::from_secs(4 * 3600);
    })
    .await;
    let key = make(
        &app,
        ACME,
        claim(RUN, "issue_credit", "{\"n\":1}"),
        unknown("timed out"),
    )
    .await;
    let plain = make(
        &app,
        ACME,
        claim(RUN, "issue_credit", "{\"n\":2}"),
        succeeded(b"ok"),
    )
    .await;
    // A reconciler holds the entry: the CLI does not settle over it.
    let mut client = app.client.clone();
    let held = client
        .reconcile(bearer(
            pb::ReconcileRequest {
                keys: vec![key.clone()],
                ..Default::default()
            },
            ACME,
        ))
        .await
        .expect("take")
        .into_inner()
        .pending
        .pop()
        .expect("handed out");
    let run = acme_run(&app, &["resolve", &key, "--failed", "none", "--retryable"]).await;
    assert_eq!(run.code, Some(2), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stderr
            .starts_with("error: FAILED_PRECONDITION (HELD): "),
        "{}",
        run.stderr
    );
    assert_eq!(lookup(&app, &key).await.status(), pb::Status::Unknown);
    // The reconciler found nothing; then its second read of the same attempt finds the effect
    // (it was still landing): the entry says "not done, retry", so it is marked.
    for (status, result) in [
        (pb::Status::Failed, &b""[..]),
        (pb::Status::Succeeded, b"cr-1"),
    ] {
        client
            .reconcile(bearer(
                pb::ReconcileRequest {
                    resolutions: vec![pb::Resolution {
                        key: key.clone(),
                        status: status.into(),
                        result: result.to_vec().into(),
                        retryable: result.is_empty(),
                        attempt: held.attempt,
                        hold_token: held.hold_token.clone(),
                        ..Default::default()
                    }],
                    principal: "reconciler-7".into(),
                    ..Default::default()
                },
                ACME,
            ))
            .await
            .expect("resolve");
    }
    // `entries` shows the marked entry first, with its evidence, then the table of all.
    let listing = acme(&app, &["entries", "--wide"]).await;
    let warning = listing
        .find("POSSIBLE DOUBLE EFFECT")
        .unwrap_or_else(|| panic!("no warning:\n{listing}"));
    let evidence = listing
        .find("the effect of attempt 1 exists")
        .unwrap_or_else(|| panic!("no evidence:\n{listing}"));
    let table = listing.rfind("STARTED_AT").expect("the table");
    assert!(warning < evidence && evidence < table, "{listing}");
    assert!(listing[table..].contains(&plain), "{listing}");
    let only = acme(&app, &["entries", "--possible-double-effect", "--wide"]).await;
    assert_eq!(keys(&only), [key.as_str()], "{only}");
    // `entry` starts with the warning and ends with the history.
    let shown = acme(&app, &["entry", &key]).await;
    assert!(shown.starts_with("POSSIBLE DOUBLE EFFECT"), "{shown}");
    assert!(
        shown.contains("finding_already_resolved  attempt 1  reconciler-7")
            && shown.contains("possible_double_effect  attempt 1  reconciler-7"),
        "{shown}"
    );
    // Acknowledged: the mark goes, the note stays in the history.
    let acked = acme(
        &app,
        &[
            "acknowledge",
            &key,
            "--note",
            "refunded one credit",
            "--principal",
            "ops:alice",
        ],
    )
    .await;
    assert_eq!(field(&acked, "key"), key);
    assert!(!lookup(&app, &key).await.possible_double_effect);
    let shown = acme(&app, &["entry", &key]).await;
    assert!(!shown.contains("POSSIBLE DOUBLE EFFECT"), "{shown}");
    assert!(
        shown.contains("double_effect_acknowledged  attempt 1  ops:alice  refunded one credit"),
        "{shown}"
    );
    assert!(
        !acme(&app, &["entries"])
            .await
            .contains("POSSIBLE DOUBLE EFFECT")
    );
    // Again: nothing is marked; refused, exit 2.
    let run = acme_run(&app, &["acknowledge", &key, "--note", "again"]).await;
    assert_eq!(run.code, Some(2), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stderr
            .starts_with("error: FAILED_PRECONDITION (NOT_MARKED): "),
        "{}",
        run.stderr
    );
}
