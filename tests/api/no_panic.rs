//! No input makes the server fail: a proptest property over sequences of Claim, Complete,
//! Lookup, RenewLease and Reconcile requests with hostile fields (`testkit::hostile`: strings
//! with control characters and lengths up to and past the limits, enum numbers out of range,
//! negative and huge durations, random result bytes, keys with odd characters), real and
//! made-up claim tokens, and the clock moved now and then so leases and retention run out, each
//! sequence sent through gRPC to a fresh server on SQLite.
//!
//! Every answer must be OK or INVALID_ARGUMENT, FAILED_PRECONDITION or NOT_FOUND: never
//! INTERNAL or UNKNOWN (a handler that panicked or failed), never a dropped connection and never
//! silence; and after each sequence the server must still run and answer its health check.
//! proptest shrinks a failing sequence (fewer steps, fields back to their sensible values,
//! shorter strings) and reports it with the seed.
//!
//! The run is deterministic: a fixed seed (`NO_PANIC_SEED` changes it) and a fixed number of
//! sequences (`NO_PANIC_CASES`, default 32, of up to 48 steps), and proptest writes no
//! regression file.
//!
//! The typed client can only send well-formed messages; the focused tests at the end also send
//! messages that do not decode (a `string` that is not UTF-8, a field of the wrong wire type).

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotency_ledger::grpc::pb;
use proptest::prelude::*;
use proptest::sample::{Index, select};
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};
use prost_types::Duration as ProtoDuration;
use testkit::hostile::{
    abridged, long_text, odd_bytes, odd_duration, odd_enum, odd_json, sane_duration, sane_json,
    text,
};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::support::{Backend, TestApp, spawn_app_with};

/// The codes an answer may carry besides OK.
const ALLOWED: [Code; 3] = [
    Code::InvalidArgument,
    Code::FailedPrecondition,
    Code::NotFound,
];

/// How long one call may take before it counts as no answer (the longest wait is 100 ms).
const CALL_TIMEOUT: Duration = Duration::from_secs(15);

const DEFAULT_SEED: u64 = 0x1de3_9071_e5ed_9e77;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn no_request_makes_the_server_fail_internally_drop_the_connection_or_stop_serving() {
    let seed: u64 = env_or("NO_PANIC_SEED", DEFAULT_SEED);
    let config = Config {
        cases: env_or("NO_PANIC_CASES", 32),
        // A failure prints its shrunk sequence and the seed; nothing is written next to the
        // sources.
        failure_persistence: None,
        max_shrink_iters: 400,
        ..Config::default()
    };
    let mut seed_bytes = [0u8; 32];
    for chunk in seed_bytes.chunks_mut(8) {
        chunk.copy_from_slice(&seed.to_le_bytes());
    }
    let mut runner = TestRunner::new_with_rng(
        config,
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes),
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let sent = AtomicUsize::new(0);
    let outcome = runner.run(&prop::collection::vec(step(), 1..=48), |steps| {
        runtime.block_on(run_sequence(&steps, &sent))
    });
    let sent = sent.into_inner();
    eprintln!("no_panic: seed {seed:#x}, {sent} requests (shrinking included)");
    match outcome {
        Ok(()) => {}
        Err(TestError::Fail(why, steps)) => panic!(
            "seed {seed:#x}: a sequence got a forbidden answer: {why}\nshrunk to {} steps:\n{}",
            steps.len(),
            steps
                .iter()
                .map(|s| format!("  {s:?}"))
                .collect::<Vec<_>>()
                .join("\n")
        ),
        Err(TestError::Abort(why)) => panic!("seed {seed:#x}: proptest gave up: {why}"),
    }
    assert!(sent >= 100, "only {sent} requests were sent");
}

/// Sends `steps` to a fresh server, then asks it for its health: the first forbidden answer,
/// or a server that stopped, fails the case.
async fn run_sequence(steps: &[Step], sent: &AtomicUsize) -> Result<(), TestCaseError> {
    // A short maximum wait keeps claims that wait on an attempt in flight from eating the
    // time; the wait field itself is still sent with arbitrary values.
    let app = spawn_app_with(Backend::Sqlite, |s| s.max_wait = Duration::from_millis(100)).await;
    let mut pool = Pool::default();
    for (n, step) in steps.iter().enumerate() {
        let call = match step {
            Step::Advance(secs) => {
                app.clock.advance(Duration::from_secs(*secs));
                continue;
            }
            Step::Send(planned) => planned.resolve(&pool),
        };
        sent.fetch_add(1, Ordering::Relaxed);
        match send(&app, &call).await {
            Answer::Claimed { key, token } => pool.claimed(key, token),
            Answer::Ok => {}
            Answer::Refused(code) if ALLOWED.contains(&code) => {}
            failed => {
                return Err(TestCaseError::fail(format!(
                    "step {n}: {failed:?} to {call:?}"
                )));
            }
        }
    }
    let still_running = app.handle.as_ref().is_some_and(|h| !h.is_finished());
    prop_assert!(still_running, "the server task ended");
    prop_assert_eq!(app.health("").await.ok(), Some(ServingStatus::Serving));
    prop_assert_eq!(
        app.health("idempotency.v1.LedgerService").await.ok(),
        Some(ServingStatus::Serving)
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Sending

#[derive(Clone)]
enum Call {
    Claim(pb::ClaimRequest),
    Complete(pb::CompleteRequest),
    Lookup(pb::LookupRequest),
    Reconcile(pb::ReconcileRequest),
    RenewLease(pb::RenewLeaseRequest),
}

/// The request with its long strings cut short.
impl fmt::Debug for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let full = match self {
            Call::Claim(r) => format!("Claim({r:?})"),
            Call::Complete(r) => format!("Complete({r:?})"),
            Call::Lookup(r) => format!("Lookup({r:?})"),
            Call::Reconcile(r) => format!("Reconcile({r:?})"),
            Call::RenewLease(r) => format!("RenewLease({r:?})"),
        };
        f.write_str(&abridged(&full))
    }
}

#[derive(Debug)]
enum Answer {
    /// A claim that got OUTCOME_CLAIMED, with what a Complete needs.
    Claimed {
        key: String,
        token: String,
    },
    Ok,
    /// A gRPC error status (a dropped connection also arrives as one, UNAVAILABLE or UNKNOWN).
    Refused(Code),
    /// No answer within CALL_TIMEOUT.
    Silence,
}

async fn send(app: &TestApp, call: &Call) -> Answer {
    let mut client = app.client.clone();
    let call = call.clone();
    let answer = tokio::time::timeout(CALL_TIMEOUT, async move {
        match call {
            Call::Claim(r) => client.claim(r).await.map(|resp| {
                let resp = resp.into_inner();
                if resp.outcome() == pb::Outcome::Claimed {
                    Answer::Claimed {
                        key: resp.entry.map(|e| e.key).unwrap_or_default(),
                        token: resp.claim_token,
                    }
                } else {
                    Answer::Ok
                }
            }),
            Call::Complete(r) => client.complete(r).await.map(|_| Answer::Ok),
            Call::Lookup(r) => client.lookup(r).await.map(|_| Answer::Ok),
            Call::Reconcile(r) => client.reconcile(r).await.map(|_| Answer::Ok),
            Call::RenewLease(r) => client.renew_lease(r).await.map(|_| Answer::Ok),
        }
    })
    .await;
    match answer {
        Ok(Ok(answer)) => answer,
        Ok(Err(status)) => Answer::Refused(status.code()),
        Err(_) => Answer::Silence,
    }
}

// ---------------------------------------------------------------------------------------------
// Generating sequences: each request a sensible one with some of its fields swapped for hostile
// values (`spoiled`), so that hostile values also reach the code behind the first validation;
// proptest shrinks a spoiled field back to its sensible value first.

/// One step of a sequence.
#[derive(Clone, Debug)]
enum Step {
    /// Moves the server's clock by this many seconds (leases and retention run out).
    Advance(u64),
    /// Sends a request.
    Send(Box<Planned>),
}

/// A request, and which of its keys and tokens are to be taken from what earlier answers of
/// the same sequence taught (a generated sequence cannot know them in advance).
#[derive(Clone, Debug)]
struct Planned {
    call: Call,
    /// The key of a claimed entry, for the request's key (for a Reconcile, its first
    /// resolution's).
    known_key: Option<Index>,
    /// A claimed key and its token, for a Complete or a RenewLease.
    held: Option<Index>,
}

impl Planned {
    /// The request to send now, with what `pool` knows filled in.
    fn resolve(&self, pool: &Pool) -> Call {
        let mut call = self.call.clone();
        let known = self
            .known_key
            .filter(|_| !pool.keys.is_empty())
            .map(|i| i.get(&pool.keys).clone());
        let held = self
            .held
            .filter(|_| !pool.tokens.is_empty())
            .map(|i| i.get(&pool.tokens).clone());
        match &mut call {
            Call::Claim(r) => r.key = known.unwrap_or(std::mem::take(&mut r.key)),
            Call::Lookup(r) => r.key = known.unwrap_or(std::mem::take(&mut r.key)),
            Call::Complete(r) => {
                if let Some((key, token)) = held {
                    (r.key, r.claim_token) = (key, token);
                }
            }
            Call::RenewLease(r) => {
                if let Some((key, token)) = held {
                    (r.key, r.claim_token) = (key, token);
                }
            }
            Call::Reconcile(r) => {
                if let (Some(key), Some(first)) = (known, r.resolutions.first_mut()) {
                    first.key = key;
                }
            }
        }
        call
    }
}

/// What earlier answers taught: keys that exist and the tokens that hold them.
#[derive(Default)]
struct Pool {
    keys: Vec<String>,
    tokens: Vec<(String, String)>,
}

impl Pool {
    fn claimed(&mut self, key: String, token: String) {
        if !self.keys.contains(&key) {
            self.keys.push(key.clone());
        }
        self.tokens.push((key, token));
        if self.tokens.len() > 64 {
            self.tokens.remove(0);
        }
    }
}

const RUNS: &[&str] = &["run-1", "run-2", "ラン 😀"];
const TOOLS: &[&str] = &["issue_credit", "send_email"];
const EXPLICIT_KEYS: &[&str] = &["wf-1:step-1", "wf-1:step-2", "k"];
const ARGS: &[&str] = &[
    "{}",
    r#"{"amount":200,"currency":"EUR"}"#,
    r#"{"currency":"EUR","amount":2e2}"#,
    r#"{"to":" ada@example.com ","cc":null}"#,
    r#"{"s":"\u0000"}"#,
];

/// `sane`, or one time in eight `odd`: shrinks back to `sane`.
fn spoiled<T: fmt::Debug + Clone + 'static>(
    sane: impl Strategy<Value = T> + 'static,
    odd: impl Strategy<Value = T> + 'static,
) -> BoxedStrategy<T> {
    prop_oneof![7 => sane, 1 => odd].boxed()
}

fn one_of(items: &'static [&'static str]) -> BoxedStrategy<String> {
    select(items).prop_map(str::to_owned).boxed()
}

/// An explicit-looking key, or any text (the pool's keys come in through [`Planned`]).
fn any_key() -> BoxedStrategy<String> {
    prop_oneof![1 => one_of(EXPLICIT_KEYS), 1 => text()].boxed()
}

/// Half the time `Some` index into the pool.
fn sometimes_known() -> BoxedStrategy<Option<Index>> {
    prop::option::of(any::<Index>()).boxed()
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        1 => select(&[1u64, 61, 3601, 2 * 86_400, 31 * 86_400][..]).prop_map(Step::Advance),
        24 => planned().prop_map(|p| Step::Send(Box::new(p))),
    ]
}

fn planned() -> impl Strategy<Value = Planned> {
    let with = |call: BoxedStrategy<Call>| {
        (
            call,
            sometimes_known(),
            prop::option::weighted(0.75, any::<Index>()),
        )
            .prop_map(|(call, known_key, held)| Planned {
                call,
                known_key,
                held,
            })
    };
    prop_oneof![
        4 => with(claim().prop_map(Call::Claim).boxed()),
        3 => with(complete().prop_map(Call::Complete).boxed()),
        2 => with(lookup().prop_map(Call::Lookup).boxed()),
        1 => with(renew().prop_map(Call::RenewLease).boxed()),
        1 => with(reconcile().prop_map(Call::Reconcile).boxed()),
    ]
}

fn claim() -> impl Strategy<Value = pb::ClaimRequest> {
    let names = (
        spoiled(one_of(RUNS), text()),
        spoiled(one_of(TOOLS), text()),
        spoiled(sane_json(ARGS), odd_json()),
        spoiled(
            prop_oneof![3 => Just(String::new()), 1 => one_of(EXPLICIT_KEYS)],
            any_key(),
        ),
        spoiled(0..3, odd_enum()),
        spoiled(
            prop_oneof![1 => Just(String::new()), 1 => Just("alice".to_owned())],
            text(),
        ),
    );
    let times = (
        spoiled(sane_duration(120), odd_duration()),
        spoiled(sane_duration(2 * 86_400), odd_duration()),
        spoiled(
            prop_oneof![7 => Just(None), 1 => sane_duration(1)],
            odd_duration(),
        ),
        // Now and then a call that asks a person first (its next claims then wait for a
        // decision nobody takes here).
        prop::bool::weighted(1.0 / 16.0),
        // An explicit key without a run now and then.
        prop::bool::weighted(0.5),
        // The answer's view (AIP-157), or an odd value.
        spoiled(0..3, odd_enum()),
        // What a wait waits for, or an odd value.
        spoiled(0..3, odd_enum()),
        // Now and then a window of intent in place of the run (beside one, it is refused).
        spoiled(
            prop_oneof![15 => Just(None), 1 => sane_duration(600)],
            odd_duration(),
        ),
    );
    (names, times).prop_map(
        |(
            (run_id, tool, arguments_json, key, canonicalization, principal),
            (lease, retention, wait, require_approval, runless, view, wait_for, window),
        )| pb::ClaimRequest {
            run_id: if runless && !key.is_empty() {
                String::new()
            } else {
                run_id
            },
            tool,
            arguments_json,
            key,
            canonicalization,
            lease,
            retention,
            wait,
            principal,
            require_approval,
            view,
            wait_for,
            same_intent_within: window,
        },
    )
}

fn complete() -> impl Strategy<Value = pb::CompleteRequest> {
    select(&[2, 2, 3, 4][..]).prop_flat_map(|status| {
        let succeeded = status == 2;
        let result = if succeeded {
            prop::collection::vec(any::<u8>(), 0..100).boxed()
        } else {
            Just(Vec::new()).boxed()
        };
        let error = if succeeded { "" } else { "timed out" };
        (
            spoiled(any_key(), any_key()),
            spoiled(text(), prop_oneof![Just(String::new()), text()]),
            spoiled(Just(status), odd_enum()),
            spoiled(result, odd_bytes()),
            spoiled(Just(error.to_owned()), long_text()),
            spoiled(
                if status == 3 {
                    any::<bool>().boxed()
                } else {
                    Just(false).boxed()
                },
                any::<bool>(),
            ),
            spoiled(0..3, odd_enum()),
        )
            .prop_map(
                |(key, claim_token, status, result, error, retryable, view)| pb::CompleteRequest {
                    key,
                    claim_token,
                    status,
                    result: result.into(),
                    error,
                    retryable,
                    view,
                },
            )
    })
}

fn lookup() -> impl Strategy<Value = pb::LookupRequest> {
    let by_key = any_key().prop_map(|key| pb::LookupRequest {
        key,
        ..Default::default()
    });
    let by_call = (one_of(RUNS), one_of(TOOLS), sane_json(ARGS), 0..3).prop_map(
        |(run_id, tool, arguments_json, canonicalization)| pb::LookupRequest {
            run_id,
            tool,
            arguments_json,
            canonicalization,
            ..Default::default()
        },
    );
    (
        prop_oneof![by_key, by_call],
        prop::option::weighted(0.15, any_key()),
        prop::option::weighted(0.15, text()),
        prop::option::weighted(0.15, text()),
        prop::option::weighted(0.15, odd_json()),
        prop::option::weighted(0.15, odd_enum()),
    )
        .prop_map(
            |(mut r, key, run_id, tool, arguments_json, canonicalization)| {
                r.key = key.unwrap_or(r.key);
                r.run_id = run_id.unwrap_or(r.run_id);
                r.tool = tool.unwrap_or(r.tool);
                r.arguments_json = arguments_json.unwrap_or(r.arguments_json);
                r.canonicalization = canonicalization.unwrap_or(r.canonicalization);
                r
            },
        )
}

fn renew() -> impl Strategy<Value = pb::RenewLeaseRequest> {
    (
        spoiled(any_key(), any_key()),
        text(),
        spoiled(sane_duration(600), odd_duration()),
    )
        .prop_map(|(key, claim_token, lease)| pb::RenewLeaseRequest {
            key,
            claim_token,
            lease,
        })
}

fn resolution() -> impl Strategy<Value = pb::Resolution> {
    let sane = (
        any::<bool>(),
        any_key(),
        any::<bool>(),
        // A fence that is usually there (a small attempt, one of a few tokens), now and then
        // missing (an old client's resolution, refused).
        select(&[0, 1, 1, 2, u32::MAX][..]),
        one_of(&["", "h", "0123456789abcdef0123456789abcdef"]),
    )
        .prop_map(
            |(succeeded, key, retryable, attempt, hold_token)| pb::Resolution {
                key,
                status: if succeeded { 2 } else { 3 },
                result: if succeeded {
                    b"found".to_vec().into()
                } else {
                    Default::default()
                },
                error: if succeeded { "" } else { "not found" }.to_owned(),
                retryable: !succeeded && retryable,
                attempt,
                hold_token,
            },
        );
    (
        sane,
        prop::option::weighted(0.1, text()),
        prop::option::weighted(0.1, odd_enum()),
        prop::option::weighted(0.1, odd_bytes()),
        prop::option::weighted(0.1, long_text()),
        prop::option::weighted(0.1, text()),
    )
        .prop_map(|(mut r, key, status, result, error, hold_token)| {
            r.key = key.unwrap_or(r.key);
            r.status = status.unwrap_or(r.status);
            r.result = result.map_or(r.result, Into::into);
            r.error = error.unwrap_or(r.error);
            r.hold_token = hold_token.unwrap_or(r.hold_token);
            r
        })
}

fn reconcile() -> impl Strategy<Value = pb::ReconcileRequest> {
    // At and over the most resolutions one call takes.
    let too_many = select(&[1_000usize, 1_001][..]).prop_map(|n| {
        (0..n)
            .map(|i| pb::Resolution {
                key: format!("k-{i}"),
                status: 3,
                ..Default::default()
            })
            .collect::<Vec<_>>()
    });
    (
        spoiled(sane_duration(120), odd_duration()),
        spoiled(prop_oneof![Just(String::new()), one_of(TOOLS)], text()),
        spoiled(
            0..20u32,
            prop_oneof![select(&[1_000, 1_001, u32::MAX][..]), any::<u32>()],
        ),
        spoiled(prop::collection::vec(resolution(), 0..4), too_many),
        prop::bool::weighted(0.25),
        prop_oneof![
            2 => Just(Vec::new()),
            1 => prop::collection::vec(any_key(), 0..3),
        ],
        spoiled(
            prop_oneof![Just(String::new()), Just("reconciler".to_owned())],
            text(),
        ),
    )
        .prop_map(
            |(older_than, tool, limit, resolutions, resolve_only, keys, principal)| {
                pb::ReconcileRequest {
                    older_than,
                    tool,
                    limit,
                    resolutions,
                    resolve_only,
                    keys,
                    principal,
                }
            },
        )
}

// ---------------------------------------------------------------------------------------------
// What the walk found, kept as focused regression tests.

/// A lease or retention shorter than a microsecond is positive, but the ledger keeps durations
/// in whole microseconds: a retention of 1 to 999 ns used to become 0 µs, which the store's
/// `CHECK (retention_us > 0)` refused, so the claim failed with INTERNAL (and such a lease
/// silently became a zero lease). Found by the walk above (seed 0x1de39071e5ed9e77, request
/// #359); since fixed: both are INVALID_ARGUMENT, and one microsecond is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_or_retention_below_one_microsecond_is_invalid_argument_not_internal() {
    let app = spawn_app_with(Backend::Sqlite, |_| {}).await;
    let mut client = app.client.clone();
    for (i, (field, nanos)) in [
        ("retention", 1),
        ("retention", 999),
        ("lease", 1),
        ("lease", 999),
        ("retention", 1_000),
        ("lease", 1_000),
    ]
    .into_iter()
    .enumerate()
    {
        let duration = Some(ProtoDuration { seconds: 0, nanos });
        let mut request = pb::ClaimRequest {
            run_id: format!("run-{i}"),
            tool: "issue_credit".into(),
            arguments_json: "{}".into(),
            ..Default::default()
        };
        if field == "lease" {
            request.lease = duration;
        } else {
            request.retention = duration;
        }
        let code = match client.claim(request).await {
            Ok(_) => Code::Ok,
            Err(status) => status.code(),
        };
        let want = if nanos < 1_000 {
            Code::InvalidArgument
        } else {
            Code::Ok
        };
        assert_eq!(code, want, "a claim with {field} {nanos} ns");
    }
}

/// `ClaimRequest` as it travels, but with byte strings where the proto has `string`s, so that a
/// test can send what a proto3 `string` must not hold.
#[derive(Clone, PartialEq, prost::Message)]
struct RawClaimRequest {
    #[prost(bytes = "vec", tag = "1")]
    run_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    tool: Vec<u8>,
    #[prost(bytes = "vec", tag = "3")]
    arguments_json: Vec<u8>,
}

/// `ClaimRequest`'s field 1 (`run_id`, a string) sent with the wrong wire type.
#[derive(Clone, PartialEq, prost::Message)]
struct WrongWireType {
    #[prost(fixed32, tag = "1")]
    run_id: u32,
}

async fn raw_claim<M: prost::Message + Send + Sync + 'static>(app: &TestApp, message: M) -> Code {
    let mut grpc = tonic::client::Grpc::new(app.channel.clone());
    grpc.ready().await.expect("channel ready");
    let answer: Result<tonic::Response<pb::ClaimResponse>, tonic::Status> = grpc
        .unary(
            tonic::Request::new(message),
            tonic::codegen::http::uri::PathAndQuery::from_static(
                "/idempotency.v1.LedgerService/Claim",
            ),
            tonic_prost::ProstCodec::default(),
        )
        .await;
    match answer {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

/// A request message that does not decode (a `string` field that is not UTF-8, or a field of
/// the wrong wire type) is malformed input, which the ledger answers with INVALID_ARGUMENT
/// (`MALFORMED_MESSAGE`, from its codec: `proto::codec`), where tonic's own codec answers
/// INTERNAL without an ErrorInfo.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_does_not_decode_is_invalid_argument_not_internal() {
    let app = spawn_app_with(Backend::Sqlite, |_| {}).await;
    let valid = RawClaimRequest {
        run_id: b"run-1".to_vec(),
        tool: b"issue_credit".to_vec(),
        arguments_json: b"{}".to_vec(),
    };
    assert_eq!(
        raw_claim(&app, valid.clone()).await,
        Code::Ok,
        "the raw path works"
    );
    let not_utf8_run_id = RawClaimRequest {
        run_id: b"\xff".to_vec(),
        ..valid.clone()
    };
    let not_utf8_arguments = RawClaimRequest {
        arguments_json: b"{\"a\":\"\xc3\"}".to_vec(),
        ..valid
    };
    let mut got = Vec::new();
    got.push(("run_id b\"\\xff\"", raw_claim(&app, not_utf8_run_id).await));
    got.push((
        "arguments_json with a cut UTF-8 sequence",
        raw_claim(&app, not_utf8_arguments).await,
    ));
    got.push((
        "run_id as fixed32",
        raw_claim(&app, WrongWireType { run_id: 7 }).await,
    ));
    let wrong: Vec<_> = got
        .iter()
        .filter(|(_, code)| *code != Code::InvalidArgument)
        .collect();
    assert!(wrong.is_empty(), "undecodable requests got {wrong:?}");
    assert_eq!(app.health("").await.ok(), Some(ServingStatus::Serving));
}
