//! No input makes the server fail: a seeded random walk of a few hundred Claim, Complete, Lookup
//! and Reconcile requests with arbitrary fields (strings with control characters and lengths up
//! to and past the limits, enum numbers out of range, negative and huge durations, random result
//! bytes, keys with odd characters, real and made-up claim tokens), sent through gRPC to a real
//! server on SQLite, with the clock moved now and then so leases and retention run out.
//!
//! Every answer must be OK or INVALID_ARGUMENT, FAILED_PRECONDITION or NOT_FOUND: never
//! INTERNAL or UNKNOWN (a handler that panicked or failed), never a dropped connection and never
//! silence. The server must still answer its health check at the end. A failing request is
//! shrunk (fields emptied, strings halved) while it keeps failing, and reported with the seed.
//!
//! `NO_PANIC_SEED`, `NO_PANIC_REQUESTS` (default 400) and `NO_PANIC_SECONDS` (default 10)
//! change the walk.
//!
//! The typed client can only send well-formed messages; the focused tests at the end also send
//! messages that do not decode (a `string` that is not UTF-8, a field of the wrong wire type).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use idempotency_ledger::grpc::pb;
use prost_types::Duration as ProtoDuration;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_request_makes_the_server_fail_internally_drop_the_connection_or_stop_serving() {
    let seed: u64 = env_or("NO_PANIC_SEED", DEFAULT_SEED);
    let max_requests: usize = env_or("NO_PANIC_REQUESTS", 400);
    let budget = Duration::from_secs(env_or("NO_PANIC_SECONDS", 10));
    // A short maximum wait keeps claims that wait on an attempt in flight from eating the
    // time budget; the wait field itself is still sent with arbitrary values.
    let app = spawn_app_with(Backend::Sqlite, |s| s.max_wait = Duration::from_millis(100)).await;
    let mut rng = Rng::seed_from_u64(seed);
    let mut pool = Pool::default();
    let mut answers: BTreeMap<String, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    let started = Instant::now();
    let mut sent = 0;
    while sent < max_requests && started.elapsed() < budget {
        if rng.random_ratio(1, 25) {
            let by = *pick(&mut rng, &[1, 61, 3601, 2 * 86_400, 31 * 86_400]);
            app.clock.advance(Duration::from_secs(by));
            continue;
        }
        let call = gen_call(&mut rng, &pool);
        sent += 1;
        let answer = send(&app, &call).await;
        *answers.entry(answer.label()).or_default() += 1;
        match answer {
            Answer::Claimed { key, token } => pool.claimed(key, token),
            Answer::Ok => {}
            Answer::Refused(code) if ALLOWED.contains(&code) => {}
            failed => {
                let minimal = shrink(&app, call.clone()).await;
                failures.push(format!(
                    "request #{sent}: {failed:?}\n  request:  {}\n  shrunk to {} -> {:?}",
                    describe(&call),
                    describe(&minimal),
                    send(&app, &minimal).await,
                ));
            }
        }
    }
    eprintln!(
        "no_panic: seed {seed:#x}, {sent} requests in {:.1?}: {answers:?}",
        started.elapsed()
    );
    assert!(sent >= 100, "only {sent} requests in {budget:?}");

    let still_running = app.handle.as_ref().is_some_and(|h| !h.is_finished());
    let health = app.health("").await;
    let ledger_health = app.health("idempotency.v1.LedgerService").await;
    assert!(
        failures.is_empty(),
        "seed {seed:#x}: {} of {sent} requests got a forbidden answer:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(still_running, "the server task ended");
    assert_eq!(health.ok(), Some(ServingStatus::Serving), "health of \"\"");
    assert_eq!(
        ledger_health.ok(),
        Some(ServingStatus::Serving),
        "health of the ledger service"
    );
}

// ---------------------------------------------------------------------------------------------
// Sending

#[derive(Clone, Debug)]
enum Call {
    Claim(pb::ClaimRequest),
    Complete(pb::CompleteRequest),
    Lookup(pb::LookupRequest),
    Reconcile(pb::ReconcileRequest),
    RenewLease(pb::RenewLeaseRequest),
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

impl Answer {
    fn label(&self) -> String {
        match self {
            Answer::Claimed { .. } => "OK (claimed)".to_owned(),
            Answer::Ok => "OK".to_owned(),
            Answer::Refused(code) => format!("{code:?}"),
            Answer::Silence => "no answer".to_owned(),
        }
    }

    fn is_failure(&self) -> bool {
        match self {
            Answer::Refused(code) => !ALLOWED.contains(code),
            Answer::Silence => true,
            Answer::Claimed { .. } | Answer::Ok => false,
        }
    }
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
// Shrinking a failing request

/// Simplifies `call` greedily while it still gets a forbidden answer.
async fn shrink(app: &TestApp, mut call: Call) -> Call {
    let mut budget = 300;
    'outer: while budget > 0 {
        for candidate in simplifications(&call) {
            budget -= 1;
            if send(app, &candidate).await.is_failure() {
                call = candidate;
                continue 'outer;
            }
            if budget == 0 {
                break 'outer;
            }
        }
        break;
    }
    call
}

/// Shorter versions of a string: empty, and each half.
fn smaller_strings(s: &str) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    match chars.len() {
        0 => vec![],
        1 => vec![String::new()],
        n => vec![
            String::new(),
            chars[..n / 2].iter().collect(),
            chars[n / 2..].iter().collect(),
        ],
    }
}

fn smaller_bytes(b: &[u8]) -> Vec<Vec<u8>> {
    match b.len() {
        0 => vec![],
        1 => vec![Vec::new()],
        n => vec![Vec::new(), b[..n / 2].to_vec(), b[n / 2..].to_vec()],
    }
}

/// Every one-step simplification of `call`.
fn simplifications(call: &Call) -> Vec<Call> {
    let mut out = Vec::new();
    macro_rules! strings {
        ($variant:ident, $r:expr, $($field:ident),+) => {$(
            for s in smaller_strings(&$r.$field) {
                let mut c = $r.clone();
                c.$field = s;
                out.push(Call::$variant(c));
            }
        )+};
    }
    macro_rules! zero {
        ($variant:ident, $r:expr, $($field:ident),+) => {$(
            let mut c = $r.clone();
            c.$field = Default::default();
            if c.$field != $r.$field {
                out.push(Call::$variant(c));
            }
        )+};
    }
    match call {
        Call::Claim(r) => {
            zero!(Claim, r, lease, retention, wait, canonicalization);
            strings!(Claim, r, arguments_json, run_id, tool, key, principal);
        }
        Call::Complete(r) => {
            zero!(Complete, r, status, retryable);
            strings!(Complete, r, key, claim_token, error);
            for b in smaller_bytes(&r.result) {
                let mut c = r.clone();
                c.result = b.into();
                out.push(Call::Complete(c));
            }
        }
        Call::Lookup(r) => {
            zero!(Lookup, r, canonicalization);
            strings!(Lookup, r, key, run_id, tool, arguments_json);
        }
        Call::RenewLease(r) => {
            zero!(RenewLease, r, lease);
            strings!(RenewLease, r, key, claim_token);
        }
        Call::Reconcile(r) => {
            zero!(Reconcile, r, older_than, limit);
            strings!(Reconcile, r, tool);
            let n = r.resolutions.len();
            if n > 0 {
                for part in [&r.resolutions[..n / 2], &r.resolutions[n / 2..]] {
                    let mut c = r.clone();
                    c.resolutions = part.to_vec();
                    out.push(Call::Reconcile(c));
                }
                for (i, res) in r.resolutions.iter().enumerate().take(4) {
                    let mut simpler = Vec::new();
                    for s in smaller_strings(&res.key) {
                        simpler.push(pb::Resolution {
                            key: s,
                            ..res.clone()
                        });
                    }
                    for s in smaller_strings(&res.error) {
                        simpler.push(pb::Resolution {
                            error: s,
                            ..res.clone()
                        });
                    }
                    for b in smaller_bytes(&res.result) {
                        simpler.push(pb::Resolution {
                            result: b.into(),
                            ..res.clone()
                        });
                    }
                    for s in simpler {
                        let mut c = r.clone();
                        c.resolutions[i] = s;
                        out.push(Call::Reconcile(c));
                    }
                }
            }
        }
    }
    out
}

/// The request's `Debug` form with long strings and byte strings cut short.
fn describe(call: &Call) -> String {
    fn cut(s: &str) -> String {
        if s.len() <= 80 {
            return s.to_owned();
        }
        let prefix: String = s.chars().take(40).collect();
        format!("{prefix}…<{} bytes>", s.len())
    }
    fn cut_bytes(b: &[u8]) -> String {
        if b.len() <= 40 {
            format!("{b:?}")
        } else {
            format!("{:?}…<{} bytes>", &b[..20], b.len())
        }
    }
    let mut out = String::new();
    match call {
        Call::Claim(r) => {
            let _ = write!(
                out,
                "Claim {{ run_id: {:?}, tool: {:?}, arguments_json: {:?}, key: {:?}, \
                 canonicalization: {}, lease: {:?}, retention: {:?}, wait: {:?}, principal: {:?} }}",
                cut(&r.run_id),
                cut(&r.tool),
                cut(&r.arguments_json),
                cut(&r.key),
                r.canonicalization,
                r.lease,
                r.retention,
                r.wait,
                cut(&r.principal)
            );
        }
        Call::Complete(r) => {
            let _ = write!(
                out,
                "Complete {{ key: {:?}, claim_token: {:?}, status: {}, result: {}, error: {:?}, \
                 retryable: {} }}",
                cut(&r.key),
                cut(&r.claim_token),
                r.status,
                cut_bytes(&r.result),
                cut(&r.error),
                r.retryable
            );
        }
        Call::Lookup(r) => {
            let _ = write!(
                out,
                "Lookup {{ key: {:?}, run_id: {:?}, tool: {:?}, arguments_json: {:?}, \
                 canonicalization: {} }}",
                cut(&r.key),
                cut(&r.run_id),
                cut(&r.tool),
                cut(&r.arguments_json),
                r.canonicalization
            );
        }
        Call::RenewLease(r) => {
            let _ = write!(
                out,
                "RenewLease {{ key: {:?}, claim_token: {:?}, lease: {:?} }}",
                cut(&r.key),
                cut(&r.claim_token),
                r.lease
            );
        }
        Call::Reconcile(r) => {
            let _ = write!(
                out,
                "Reconcile {{ older_than: {:?}, tool: {:?}, limit: {}, resolutions: [",
                r.older_than,
                cut(&r.tool),
                r.limit
            );
            for res in r.resolutions.iter().take(5) {
                let _ = write!(
                    out,
                    "{{ key: {:?}, status: {}, result: {}, error: {:?}, retryable: {} }}, ",
                    cut(&res.key),
                    res.status,
                    cut_bytes(&res.result),
                    cut(&res.error),
                    res.retryable
                );
            }
            if r.resolutions.len() > 5 {
                let _ = write!(out, "… {} in all", r.resolutions.len());
            }
            out.push_str("] }");
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Generating requests: a sensible request, then a few of its fields replaced with odd values,
// so that odd values also reach the code behind the first validation.

use rand::rngs::Xoshiro256PlusPlus as Rng;
use rand::{Rng as _, RngExt as _, SeedableRng as _, seq::IndexedRandom as _};

/// How many fields of a sensible request to spoil: often none, sometimes several.
/// One of `items`, uniformly (`items` is never empty here).
fn pick<'a, T>(rng: &mut Rng, items: &'a [T]) -> &'a T {
    items.choose(rng).expect("a non-empty list")
}

fn spoils(rng: &mut Rng) -> usize {
    *pick(rng, &[0, 0, 0, 1, 1, 1, 2, 3])
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

const MIB: usize = 1_048_576;
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

/// Characters that make trouble somewhere: controls (C0, DEL, C1), quotes, backslashes, SQL
/// wildcards, Unicode white space, a BOM, non-BMP and the last code point.
const PALETTE: &[char] = &[
    'a',
    'Z',
    '0',
    '-',
    ':',
    '/',
    '_',
    '%',
    '\'',
    '"',
    '\\',
    ';',
    ' ',
    '\0',
    '\u{1}',
    '\t',
    '\n',
    '\r',
    '\u{1b}',
    '\u{1f}',
    '\u{7f}',
    '\u{85}',
    '\u{9f}',
    '\u{a0}',
    'é',
    '€',
    '\u{2028}',
    '\u{200b}',
    '\u{feff}',
    '\u{fffd}',
    '\u{e000}',
    '😀',
    '\u{10ffff}',
];

fn palette_string(rng: &mut Rng, len: usize) -> String {
    (0..len).map(|_| *pick(rng, PALETTE)).collect()
}

/// An odd string for any text field: empty, printable ASCII, odd characters, at and just past
/// the 255/256-byte limits (also with a multi-byte character across the boundary), SQL-ish,
/// 64 hex digits, or huge.
fn text(rng: &mut Rng) -> String {
    match rng.random_range(0..12) {
        0 => String::new(),
        1..=3 => {
            let n = 1 + rng.random_range(0..20);
            (0..n)
                .map(|_| char::from(b'!' + rng.random_range(0..94) as u8))
                .collect()
        }
        4..=6 => {
            let n = 1 + rng.random_range(0..40);
            palette_string(rng, n)
        }
        7 => "a".repeat(*pick(rng, &[255, 256, 257])),
        8 => format!("{}é", "a".repeat(*pick(rng, &[254, 255]))),
        9 => pick(
            rng,
            &[
                "'; DROP TABLE ledger_entries; --",
                "NULL",
                "%",
                "_",
                "*",
                "..",
                "\\x00",
                " k",
                "k ",
            ],
        )
        .to_string(),
        10 => {
            let n = *pick(rng, &[1_000, 70_000, 300_000]);
            palette_string(rng, n)
        }
        _ => format!(
            "{:016x}{:016x}{:016x}{:016x}",
            rng.next_u64(),
            rng.next_u64(),
            rng.next_u64(),
            rng.next_u64()
        ),
    }
}

fn sane_arguments(rng: &mut Rng) -> String {
    if rng.random_ratio(1, 3) {
        random_json(rng, 3)
    } else {
        pick(rng, ARGS).to_string()
    }
}

/// Odd arguments: refusals of every kind, texts at and over the size and depth limits, garbage.
fn odd_arguments(rng: &mut Rng) -> String {
    match rng.random_range(0..5) {
        0 | 1 => pick(
            rng,
            &[
                "",
                " ",
                "[]",
                "\"{}\"",
                "null",
                "{",
                "{\"a\":1,}",
                "\u{feff}{}",
                r#"{"a":1,"a":2}"#,
                r#"{"s":"\ud800"}"#,
                r#"{"n":9007199254740993}"#,
                r#"{"n":1e400}"#,
                r#"{"n":1152921504606846976}"#,
                r#"{"n":1152921504606847000}"#,
                r#"{"a\u0000":"\u0000"}"#,
                r#"{"s":"\u0000\u001f\u2028 😀 "}"#,
            ],
        )
        .to_string(),
        2 => {
            let depth = *pick(rng, &[63, 64, 65, 1000]);
            format!("{{\"a\":{}{}}}", "[".repeat(depth), "]".repeat(depth))
        }
        3 => {
            // At, or one byte over, the 1 MiB limit.
            let total = MIB + rng.random_range(0..2);
            format!("{{\"a\":\"{}\"}}", "x".repeat(total - 8))
        }
        _ => {
            let n = 1 + rng.random_range(0..60);
            palette_string(rng, n)
        }
    }
}

/// A small random JSON object (its numbers may be refused as inexact integers).
fn random_json(rng: &mut Rng, depth: usize) -> String {
    let n = rng.random_range(0..4);
    let mut out = String::from("{");
    for i in 0..n {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "\"k{}\":", rng.random_range(0..5));
        let value = match rng.random_range(0..if depth == 0 { 4 } else { 6 }) {
            0 => "null".to_owned(),
            1 => format!(
                "{}",
                rng.next_u64() as i64 >> (11 + rng.random_range(0..53))
            ),
            2 => format!(
                "{:e}",
                rng.next_u64() as f64 / (rng.next_u64() as f64 + 1.0)
            ),
            3 => format!(
                "{:?}",
                String::from_iter((0..3).map(|_| *pick(rng, &['a', 'é', '😀', ' '])))
            ),
            4 => format!("[{}]", random_json(rng, depth - 1)),
            _ => random_json(rng, depth - 1),
        };
        out.push_str(&value);
    }
    out.push('}');
    out
}

fn odd_enum(rng: &mut Rng) -> i32 {
    let any = rng.next_u64() as i32;
    *pick(rng, &[0, 3, 4, 5, -1, i32::MAX, i32::MIN, any])
}

/// A valid duration of up to `max_secs` seconds.
fn sane_duration(rng: &mut Rng, max_secs: usize) -> Option<ProtoDuration> {
    if rng.random_ratio(1, 2) {
        return None;
    }
    Some(ProtoDuration {
        seconds: (1 + rng.random_range(0..max_secs)) as i64,
        nanos: rng.random_range(0..1_000_000_000),
    })
}

/// Negative, huge, zero, sub-microsecond, just over a maximum, or malformed.
fn odd_duration(rng: &mut Rng) -> Option<ProtoDuration> {
    let any = rng.next_u64() as i64;
    let seconds = *pick(
        rng,
        &[
            0,
            0,
            1,
            3_600,
            3_601,
            30 * 86_400,
            30 * 86_400 + 1,
            -1,
            i64::MAX,
            i64::MIN,
            any,
        ],
    );
    let nanos = *pick(
        rng,
        &[
            0,
            1,
            999,
            1_000,
            999_999_999,
            1_000_000_000,
            -1,
            i32::MAX,
            i32::MIN,
        ],
    );
    Some(ProtoDuration { seconds, nanos })
}

fn odd_result(rng: &mut Rng) -> Vec<u8> {
    match rng.random_range(0..6) {
        0 => Vec::new(),
        1..=3 => (0..rng.random_range(0..300))
            .map(|_| rng.next_u64() as u8)
            .collect(),
        4 => vec![0u8; 4096],
        _ => vec![0xffu8; MIB + rng.random_range(0..2)],
    }
}

fn odd_error(rng: &mut Rng) -> String {
    if rng.random_ratio(1, 8) {
        "e".repeat(MIB + rng.random_range(0..2))
    } else {
        text(rng)
    }
}

/// A key that exists, an explicit-looking one, or any text.
fn any_key(rng: &mut Rng, pool: &Pool) -> String {
    match rng.random_range(0..4) {
        0 | 1 if !pool.keys.is_empty() => pick(rng, &pool.keys).clone(),
        2 => pick(rng, EXPLICIT_KEYS).to_string(),
        _ => text(rng),
    }
}

fn gen_call(rng: &mut Rng, pool: &Pool) -> Call {
    match rng.random_range(0..11) {
        0..=3 => Call::Claim(gen_claim(rng, pool)),
        4..=6 => Call::Complete(gen_complete(rng, pool)),
        7 | 8 => Call::Lookup(gen_lookup(rng, pool)),
        9 => Call::RenewLease(gen_renew(rng, pool)),
        _ => Call::Reconcile(gen_reconcile(rng, pool)),
    }
}

fn gen_renew(rng: &mut Rng, pool: &Pool) -> pb::RenewLeaseRequest {
    let (key, claim_token) = if pool.tokens.is_empty() {
        (any_key(rng, pool), text(rng))
    } else {
        pick(rng, &pool.tokens).clone()
    };
    let mut r = pb::RenewLeaseRequest {
        key,
        claim_token,
        lease: sane_duration(rng, 600),
    };
    for _ in 0..spoils(rng) {
        match rng.random_range(0..3) {
            0 => r.key = any_key(rng, pool),
            1 => r.claim_token = text(rng),
            _ => r.lease = odd_duration(rng),
        }
    }
    r
}

fn gen_claim(rng: &mut Rng, pool: &Pool) -> pb::ClaimRequest {
    let explicit = rng.random_ratio(1, 4);
    let mut r = pb::ClaimRequest {
        run_id: pick(rng, RUNS).to_string(),
        tool: pick(rng, TOOLS).to_string(),
        arguments_json: sane_arguments(rng),
        key: if explicit {
            pick(rng, EXPLICIT_KEYS).to_string()
        } else {
            String::new()
        },
        canonicalization: rng.random_range(0..3),
        lease: sane_duration(rng, 120),
        retention: sane_duration(rng, 2 * 86_400),
        wait: if rng.random_ratio(1, 8) {
            sane_duration(rng, 1)
        } else {
            None
        },
        principal: if rng.random_ratio(1, 2) {
            String::new()
        } else {
            "alice".to_owned()
        },
        // Now and then a call that asks a person first (its next claims then wait for a
        // decision nobody takes here).
        require_approval: rng.random_ratio(1, 16),
        view: rng.random_range(0..3),
    };
    if explicit && rng.random_ratio(1, 2) {
        r.run_id.clear();
    }
    for _ in 0..spoils(rng) {
        match rng.random_range(0..10) {
            0 => r.run_id = text(rng),
            1 => r.tool = text(rng),
            2 => r.arguments_json = odd_arguments(rng),
            3 => r.key = any_key(rng, pool),
            4 => r.canonicalization = odd_enum(rng),
            5 => r.lease = odd_duration(rng),
            6 => r.retention = odd_duration(rng),
            7 => r.wait = odd_duration(rng),
            8 => r.view = odd_enum(rng),
            _ => r.principal = text(rng),
        }
    }
    r
}

fn gen_complete(rng: &mut Rng, pool: &Pool) -> pb::CompleteRequest {
    let (key, claim_token) = if pool.tokens.is_empty() {
        (any_key(rng, pool), text(rng))
    } else {
        pick(rng, &pool.tokens).clone()
    };
    let status = *pick(rng, &[2, 2, 3, 4]);
    let mut r = pb::CompleteRequest {
        key,
        claim_token,
        status,
        result: if status == 2 {
            (0..rng.random_range(0..100))
                .map(|_| rng.next_u64() as u8)
                .collect::<Vec<u8>>()
                .into()
        } else {
            Default::default()
        },
        error: if status == 2 {
            String::new()
        } else {
            "timed out".to_owned()
        },
        retryable: status == 3 && rng.random_ratio(1, 2),
        view: rng.random_range(0..3),
    };
    for _ in 0..spoils(rng) {
        match rng.random_range(0..7) {
            0 => r.key = any_key(rng, pool),
            1 => {
                r.claim_token = match rng.random_range(0..3) {
                    0 if !pool.tokens.is_empty() => pick(rng, &pool.tokens).1.clone(),
                    1 => String::new(),
                    _ => text(rng),
                }
            }
            2 => r.status = odd_enum(rng),
            3 => r.result = odd_result(rng).into(),
            4 => r.error = odd_error(rng),
            5 => r.view = odd_enum(rng),
            _ => r.retryable = !r.retryable,
        }
    }
    r
}

fn gen_lookup(rng: &mut Rng, pool: &Pool) -> pb::LookupRequest {
    let mut r = pb::LookupRequest::default();
    if rng.random_ratio(1, 2) {
        r.key = any_key(rng, pool);
    } else {
        r.run_id = pick(rng, RUNS).to_string();
        r.tool = pick(rng, TOOLS).to_string();
        r.arguments_json = sane_arguments(rng);
        r.canonicalization = rng.random_range(0..3);
    }
    for _ in 0..spoils(rng) {
        match rng.random_range(0..5) {
            0 => r.key = any_key(rng, pool),
            1 => r.run_id = text(rng),
            2 => r.tool = text(rng),
            3 => r.arguments_json = odd_arguments(rng),
            _ => r.canonicalization = odd_enum(rng),
        }
    }
    r
}

fn gen_resolution(rng: &mut Rng, pool: &Pool) -> pb::Resolution {
    let succeeded = rng.random_ratio(1, 2);
    pb::Resolution {
        key: any_key(rng, pool),
        status: if succeeded { 2 } else { 3 },
        result: if succeeded {
            b"found".to_vec().into()
        } else {
            Default::default()
        },
        error: if succeeded {
            String::new()
        } else {
            "not found".to_owned()
        },
        retryable: !succeeded && rng.random_ratio(1, 2),
        // A fence that is usually there (a small attempt, one of a few tokens), now and then
        // missing (an old client's resolution, refused).
        attempt: *pick(rng, &[0, 1, 1, 2, u32::MAX]),
        hold_token: pick(rng, &["", "h", "0123456789abcdef0123456789abcdef"]).to_string(),
    }
}

fn gen_reconcile(rng: &mut Rng, pool: &Pool) -> pb::ReconcileRequest {
    let mut r = pb::ReconcileRequest {
        older_than: sane_duration(rng, 120),
        tool: if rng.random_ratio(1, 2) {
            String::new()
        } else {
            pick(rng, TOOLS).to_string()
        },
        limit: rng.random_range(0..20) as u32,
        resolutions: (0..rng.random_range(0..4))
            .map(|_| gen_resolution(rng, pool))
            .collect(),
        resolve_only: rng.random_ratio(1, 4),
        keys: if rng.random_ratio(1, 3) {
            (0..rng.random_range(0..3))
                .map(|_| any_key(rng, pool))
                .collect()
        } else {
            Vec::new()
        },
        principal: if rng.random_ratio(1, 2) {
            String::new()
        } else {
            "reconciler".to_owned()
        },
    };
    for _ in 0..spoils(rng) {
        match rng.random_range(0..7) {
            5 => r.keys.push(text(rng)),
            6 => r.principal = text(rng),
            0 => r.older_than = odd_duration(rng),
            1 => r.tool = text(rng),
            2 => {
                let any = rng.next_u64() as u32;
                r.limit = *pick(rng, &[1_000, 1_001, u32::MAX, any]);
            }
            3 => {
                // At and over the most resolutions one call takes.
                let n = *pick(rng, &[1_000, 1_001]);
                r.resolutions = (0..n)
                    .map(|i| pb::Resolution {
                        key: format!("k-{i}"),
                        status: 3,
                        ..Default::default()
                    })
                    .collect();
            }
            _ => {
                let mut odd = gen_resolution(rng, pool);
                match rng.random_range(0..6) {
                    0 => odd.key = text(rng),
                    1 => odd.status = odd_enum(rng),
                    2 => odd.result = odd_result(rng).into(),
                    3 => odd.error = odd_error(rng),
                    4 => odd.retryable = !odd.retryable,
                    _ => odd.hold_token = text(rng),
                }
                r.resolutions.push(odd);
            }
        }
    }
    r
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
