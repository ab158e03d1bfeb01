//! Fault injection: the ledger under load while its process is killed, its database crashes,
//! and the link to the database is slowed, partitioned, reset and cut at the worst moment; then
//! a checker reads the final state and counts what the documented behaviour forbids.
//!
//! # Scenarios
//!
//! | test | fault |
//! | --- | --- |
//! | `faults_kill9_under_load_on_sqlite`, `…_on_postgres` | 12 clients claim and complete fresh and shared keys through the real binary; it is killed with SIGKILL and restarted on the same database and port |
//! | `faults_three_servers_on_postgres_one_killed` | 64 clients sweep 200 shared keys in different orders across three server processes on one database; one server is killed and restarted |
//! | `faults_postgres_immediate_stop_under_load` | `pg_ctl stop -m immediate` of the test's own cluster: health must turn NOT_SERVING, calls fail UNAVAILABLE, and after `restart()` service resumes without touching the ledger server |
//! | `faults_link_latency`, `…_blackhole`, `…_reset`, `…_cut_at_commit`, `…_cut_after_server_bytes` | the server reaches PostgreSQL through [`Proxy`](crate::support::proxy::Proxy), which slows, stops, resets or cuts the link |
//! | `faults_sqlite_kill9_during_writes` | clients complete fresh keys as fast as they can with 2 KiB results; the binary is killed again and again |
//!
//! # What the clients do
//!
//! A client carries out *intents*: a Claim, and after `CLAIMED` a Complete with the same token.
//! A fresh intent's key belongs to one client; a shared key is claimed by every client. Keys
//! whose number is a multiple of 5 fail retryably on attempt 1 (`STATUS_FAILED`, `retryable`),
//! so that attempt 2 is claimed and succeeds; a quarter of shared claims wait up to 1 s for an
//! attempt in flight, so waiters race for attempt 2. A call that gets no answer, `UNAVAILABLE` or
//! `DEADLINE_EXCEEDED` is retried with the same request, with backoff, moving to the next server
//! where there are several (in the link scenarios, an ambiguous Complete is instead left for the
//! checker, to test what Lookup says about it).
//!
//! # What the checker counts
//!
//! - `operations`: Claim and Complete calls of the load that the ledger answered OK (retries
//!   included).
//! - `acknowledged`: completions (key, token) acknowledged OK, by the client or by the
//!   checker's retry of a completion left ambiguous.
//! - `lost`: an acknowledged completion that the final Lookup does not show: a success must be
//!   `SUCCEEDED` with exactly its result and attempt; a retryable failure must be `FAILED`
//!   and retryable at its attempt, or followed by a later attempt. A key that answered
//!   `CLAIMED` and is then `NOT_FOUND` counts too.
//! - `duplicated`: two different tokens answered `CLAIMED` for the same key and attempt (each
//!   extra winner counts one).
//! - `unexpected`: answers the documented behaviour does not allow where they came (each answer counts
//!   once, whatever is wrong with it), namely
//!   - `INTERNAL`, or any error other than `UNAVAILABLE`/`DEADLINE_EXCEEDED`/no answer, to a
//!     well-formed Claim or Complete (except `STALE_CLAIM_TOKEN` for a retried retryable
//!     failure that someone already followed with the next attempt: that failure was recorded);
//!   - `CLAIMED` without a token, not `ATTEMPTING`, with an attempt the key cannot reach
//!     (2 only after a retryable failure of 1 was sent), or after a success of the key was
//!     acknowledged (before this claim was sent);
//!   - `REPLAYED` not `SUCCEEDED`, or with a result no claimant sent, or other than the
//!     acknowledged one;
//!   - `IN_PROGRESS` not `ATTEMPTING`/`UNKNOWN`, or showing an attempt whose outcome was
//!     acknowledged before the claim was sent (a stale read), or for a fresh key whose own
//!     claim had not been ambiguous (nobody else claims it);
//!   - `PREVIOUSLY_FAILED` (nobody records a permanent failure);
//!   - a Complete answered OK with another status, result or attempt than sent, or
//!     `already_completed` on its first try;
//!   - for a completion left ambiguous, with faults removed and the ledger quiet: Lookup shows
//!     our outcome but the retried Complete does not answer `already_completed`; Lookup shows
//!     the attempt unresolved but the retried Complete does not apply it; Lookup shows a later
//!     attempt but the retried retryable failure is not `STALE_CLAIM_TOKEN`; or Lookup shows
//!     anything else at our attempt (another result: a state the UNAVAILABLE answer cannot
//!     explain);
//!   - a `CLAIMED` attempt that the final Lookup no longer shows (an attempt below it);
//!   - a final `replay_count` below the number of `REPLAYED` answers (a replay answered but
//!     not kept), or above it by more than the claims that failed ambiguously (each of those
//!     may have counted one before its answer was lost). A replay's count commits without
//!     waiting for the disk, so a crash of the database may take the counts of its last
//!     moments: the replays answered within [`COUNT_LOSS_WINDOW`] before a crash the scenario
//!     caused may be missing; and a server keeps the counts of its replays in memory for up to
//!     a second before it writes them, so a SIGKILL may take the replays answered within
//!     [`MEMORY_COUNT_LOSS_WINDOW`] before it, and a batch whose write met a crash of the
//!     database or a fault of the link is dropped rather than perhaps written twice (never
//!     outcomes, which the other checks hold). A count above the answers is always a fault.
//!
//! Each test prints one line `fault=<name> operations=N acknowledged=A lost=L duplicated=D
//! unexpected=U` (its other lines start `faults[<name>]`: the seed, the error codes seen,
//! what Lookup found for each ambiguous completion, proxy counters, each problem found),
//! asserts L = D = U = 0, a floor on N and A, and that the fault did hit calls in flight (some
//! call failed).
//!
//! # Length
//!
//! By default each scenario loads for 3 to 4 s with one or two faults, for CI, and then on
//! until it made half as much again as its floors (200 operations, 50 acknowledged
//! completions), for at most 20 s more, so that a slow machine does not fail the floors. The
//! long version loads for 30 s with 3 to 10 kills, outages or fault windows (floors 1000
//! operations and 300 acknowledged completions, 200 for the three-server sweep; each test
//! then takes 40 to 80 s, within nextest's 120 s limit):
//!
//! ```sh
//! FAULTS_FULL=1 cargo nextest run --test api faults
//! ```
//!
//! (The filter `faults` also matches two conformance tests named `…defaults…`; `faults::`
//! selects this module alone.)
//!
//! `FAULTS_SEED=<n>` replays the clients' random choices of a run (each test prints its seed).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use idempotency_ledger::grpc::pb;
use idempotency_ledger::grpc::pb::ledger_service_client::LedgerServiceClient;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_types::StatusExt;

use crate::support::postgres::{PgCluster, StopMode};
use crate::support::proxy::Proxy;
use crate::support::{Backend, ServerProcess, TestDb, claim_req, reason};

/// Flags of every server the scenarios start.
const SERVER_FLAGS: &[&str] = &["--db-acquire-timeout", "2s"];

/// How long a client-side guard waits beyond a call's own deadline before it gives up on it.
const CALL_GUARD: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------------------------
// Length of the run

/// How long and how hard a scenario runs.
#[derive(Clone, Copy, Debug)]
struct Profile {
    full: bool,
    /// Load duration.
    load: Duration,
    /// Kills, outages or fault windows during the load.
    faults: usize,
    /// The least `operations` a run must reach.
    min_operations: u64,
    /// The least `acknowledged` a run must reach.
    min_acknowledged: u64,
}

fn profile(bounded_faults: usize, full_faults: usize) -> Profile {
    if std::env::var("FAULTS_FULL").is_ok_and(|v| v == "1") {
        Profile {
            full: true,
            load: Duration::from_secs(30),
            faults: full_faults,
            min_operations: 1000,
            min_acknowledged: 300,
        }
    } else {
        Profile {
            full: false,
            load: Duration::from_secs(3),
            faults: bounded_faults,
            min_operations: 200,
            min_acknowledged: 50,
        }
    }
}

impl Profile {
    /// A full run's floor of acknowledged completions is `full` instead.
    fn full_acknowledged(mut self, full: u64) -> Profile {
        if self.full {
            self.min_acknowledged = full;
        }
        self
    }

    /// A bounded run's load lasts `load` instead (a full run's stays 30 s).
    fn bounded_load(mut self, load: Duration) -> Profile {
        if !self.full {
            self.load = load;
        }
        self
    }
}

/// The seed of this test's random choices: `FAULTS_SEED`, or the clock.
fn seed(name: &str) -> u64 {
    let seed = std::env::var("FAULTS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    eprintln!("faults[{name}] seed={seed}");
    seed
}

/// Rng: enough randomness for choosing keys and moments.
use rand::rngs::Xoshiro256PlusPlus as Rng;
use rand::{Rng as _, RngExt as _, SeedableRng as _};

// ---------------------------------------------------------------------------------------------
// Intents and the history of what the ledger answered

/// Who may claim a key, and how its attempts end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Class {
    /// One client's own key: succeeds on attempt 1.
    #[default]
    Fresh,
    /// Every client claims it: succeeds on attempt 1.
    Shared,
    /// Every client claims it: attempt 1 fails retryably, attempt 2 succeeds.
    FailFirst,
}

impl Class {
    fn max_attempt(self) -> u32 {
        if self == Class::FailFirst { 2 } else { 1 }
    }
}

/// A tool call a client wants carried out once.
#[derive(Clone, Debug)]
struct Intent {
    /// Names the intent in the history (the server derives the key itself).
    id: String,
    class: Class,
    req: pb::ClaimRequest,
}

fn fresh_intent(client: usize, n: u64) -> Intent {
    Intent {
        id: format!("c{client}/n{n}"),
        class: Class::Fresh,
        req: claim_req(
            &format!("client-{client}"),
            "issue_credit",
            &format!(r#"{{"n":{n}}}"#),
        ),
    }
}

fn shared_intent(generation: u64, k: u64) -> Intent {
    Intent {
        id: format!("g{generation}/k{k}"),
        class: if k.is_multiple_of(5) {
            Class::FailFirst
        } else {
            Class::Shared
        },
        req: claim_req(
            &format!("shared-{generation}"),
            "open_ticket",
            &format!(r#"{{"k":{k}}}"#),
        ),
    }
}

/// The outcome a claimant reports.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Done {
    Succeeded(Vec<u8>),
    FailedRetryable(String),
}

impl Done {
    fn request(&self, key: &str, token: &str) -> pb::CompleteRequest {
        match self {
            Done::Succeeded(result) => pb::CompleteRequest {
                key: key.into(),
                claim_token: token.into(),
                status: pb::Status::Succeeded.into(),
                result: result.clone().into(),
                ..Default::default()
            },
            Done::FailedRetryable(error) => pb::CompleteRequest {
                key: key.into(),
                claim_token: token.into(),
                status: pb::Status::Failed.into(),
                error: error.clone(),
                retryable: true,
                ..Default::default()
            },
        }
    }

    /// Whether `entry` records exactly this outcome (its attempt is compared by the caller).
    fn shown_by(&self, entry: &pb::Entry) -> bool {
        match self {
            Done::Succeeded(result) => {
                entry.status() == pb::Status::Succeeded && entry.result[..] == result[..]
            }
            Done::FailedRetryable(error) => {
                entry.status() == pb::Status::Failed && entry.retryable && entry.error == *error
            }
        }
    }
}

/// A completion sent for (attempt, token).
#[derive(Clone, Debug)]
struct Sent {
    attempt: u32,
    token: String,
    done: Done,
}

/// A completion known to be recorded, and since when.
#[derive(Clone, Debug)]
struct Ack {
    attempt: u32,
    token: String,
    done: Done,
    at: Instant,
}

/// Everything the ledger answered about one intent's key.
#[derive(Clone, Debug, Default)]
struct KeyLog {
    class: Class,
    /// The server's key, once an answer named it.
    key: String,
    /// Every `CLAIMED` answer: (attempt, token).
    claimed: Vec<(u32, String)>,
    /// Every completion sent.
    sent: Vec<Sent>,
    /// Completions known recorded.
    acked: Vec<Ack>,
    /// Completions left ambiguous, for the checker.
    pending: Vec<Sent>,
    /// `REPLAYED` answers.
    replayed: u64,
    /// When each `REPLAYED` answer arrived.
    replayed_at: Vec<Instant>,
    /// Claim tries that failed ambiguously (each may have counted a replay).
    ambiguous_claims: u64,
}

/// The shared record of a run.
#[derive(Default)]
struct History {
    keys: HashMap<String, KeyLog>,
    /// See the module comment.
    operations: u64,
    acknowledged: u64,
    /// Errors seen, by call and code/reason ("transport" when the ledger did not answer).
    errors: BTreeMap<String, u64>,
    unexpected: u64,
    /// The first unexpected answers, described.
    unexpected_log: Vec<String>,
    /// Ambiguous completions the checker resolved by Lookup and a retried Complete, by what
    /// Lookup found: recorded already, not recorded (the retry recorded it), or recorded and
    /// followed by the next attempt.
    truth_checks: BTreeMap<&'static str, u64>,
    /// Claims answered IN_PROGRESS because the client's own earlier try had committed.
    orphans: u64,
    /// When a replay's count may have been lost: from the loss window before a crash of the
    /// database or a server's SIGKILL was begun to just after it was done.
    count_losses: Vec<(Instant, Instant)>,
}

impl History {
    fn unexpected(&mut self, what: String) {
        self.unexpected += 1;
        if self.unexpected_log.len() < 30 {
            self.unexpected_log.push(what);
        }
    }

    fn note_error(&mut self, rpc: &str, status: &Status) {
        let reason = reason(status);
        let what = if reason.is_empty() {
            format!("{rpc}:{:?}/transport", status.code())
        } else {
            format!("{rpc}:{:?}/{reason}", status.code())
        };
        *self.errors.entry(what).or_default() += 1;
    }

    fn errors_seen(&self) -> u64 {
        self.errors.values().sum()
    }

    fn key(&mut self, intent: &Intent) -> &mut KeyLog {
        self.keys
            .entry(intent.id.clone())
            .or_insert_with(|| KeyLog {
                class: intent.class,
                ..KeyLog::default()
            })
    }

    /// Checks a Claim's answer (see the module comment); returns (key, attempt, token) when
    /// it is the caller's to complete.
    fn on_claim(
        &mut self,
        intent: &Intent,
        resp: &pb::ClaimResponse,
        sent_at: Instant,
        after_ambiguity: bool,
    ) -> Option<(String, u32, String)> {
        self.operations += 1;
        let id = &intent.id;
        let Some(entry) = resp.entry.as_ref() else {
            self.unexpected(format!("{id}: {:?} without an entry", resp.outcome()));
            return None;
        };
        let mut problems = Vec::new();
        let log = self.key(intent);
        if log.key.is_empty() {
            log.key = entry.key.clone();
        } else if log.key != entry.key {
            problems.push(format!("key {} after {}", entry.key, log.key));
        }
        // The latest outcome acknowledged before this claim left: it must be visible.
        let seen_before = log
            .acked
            .iter()
            .filter(|a| a.at < sent_at)
            .max_by_key(|a| a.attempt)
            .cloned();
        let stale = |attempt: u32| -> Option<String> {
            match &seen_before {
                Some(Ack {
                    done: Done::Succeeded(_),
                    attempt: a,
                    ..
                }) => Some(format!("after the success of attempt {a} was acknowledged")),
                Some(Ack {
                    done: Done::FailedRetryable(_),
                    attempt: a,
                    ..
                }) if attempt <= *a => Some(format!(
                    "showing attempt {attempt} after the failure of attempt {a} was acknowledged"
                )),
                _ => None,
            }
        };
        let attempt = entry.attempt;
        let mut mine = None;
        match resp.outcome() {
            pb::Outcome::Claimed => {
                if resp.claim_token.is_empty() {
                    problems.push("CLAIMED without a token".into());
                }
                if entry.status() != pb::Status::Attempting {
                    problems.push(format!("CLAIMED with status {:?}", entry.status()));
                }
                if attempt == 0 || attempt > log.class.max_attempt() {
                    problems.push(format!("CLAIMED attempt {attempt}"));
                }
                if attempt > 1
                    && !log.sent.iter().any(|s| {
                        s.attempt == attempt - 1 && matches!(s.done, Done::FailedRetryable(_))
                    })
                {
                    problems.push(format!(
                        "CLAIMED attempt {attempt} with no retryable failure of attempt {} sent",
                        attempt - 1
                    ));
                }
                if let Some(why) = stale(attempt) {
                    problems.push(format!("CLAIMED {why}"));
                }
                log.claimed.push((attempt, resp.claim_token.clone()));
                if !resp.claim_token.is_empty() {
                    mine = Some((entry.key.clone(), attempt, resp.claim_token.clone()));
                }
            }
            pb::Outcome::Replayed => {
                log.replayed += 1;
                log.replayed_at.push(Instant::now());
                if entry.status() != pb::Status::Succeeded {
                    problems.push(format!("REPLAYED with status {:?}", entry.status()));
                }
                let sent = log.sent.iter().any(|s| {
                    s.attempt == attempt
                        && matches!(&s.done, Done::Succeeded(r) if r[..] == entry.result[..])
                });
                if !sent {
                    problems.push(format!(
                        "REPLAYED a result no claimant of attempt {attempt} sent"
                    ));
                }
                if let Some(acked) = log
                    .acked
                    .iter()
                    .find(|a| matches!(a.done, Done::Succeeded(_)))
                    && !acked.done.shown_by(entry)
                {
                    problems.push("REPLAYED another result than the acknowledged one".into());
                }
            }
            pb::Outcome::InProgress => {
                if !matches!(entry.status(), pb::Status::Attempting | pb::Status::Unknown) {
                    problems.push(format!("IN_PROGRESS with status {:?}", entry.status()));
                }
                if let Some(why) = stale(attempt) {
                    problems.push(format!("IN_PROGRESS {why}"));
                }
                if log.class == Class::Fresh {
                    if after_ambiguity {
                        self.orphans += 1;
                    } else {
                        problems.push(
                            "IN_PROGRESS for a fresh key whose only claim was not ambiguous".into(),
                        );
                    }
                }
            }
            other => problems.push(format!("{other:?}")),
        }
        // One unexpected answer counts once, whatever is wrong with it.
        if !problems.is_empty() {
            self.unexpected(format!(
                "{id} ({}): {}",
                short(&entry.key),
                problems.join("; ")
            ));
        }
        mine
    }
}

fn short(key: &str) -> &str {
    key.get(..12).unwrap_or(key)
}

type Log = Arc<Mutex<History>>;

fn lock(log: &Log) -> MutexGuard<'_, History> {
    log.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------------------------------------
// Clients

/// How a call failed.
#[derive(Debug, PartialEq, Eq)]
enum Failure {
    /// No answer from the ledger (transport error, refused or reset connection, client guard),
    /// or its `UNAVAILABLE`/`DEADLINE_EXCEEDED`: the call may or may not have taken effect.
    Ambiguous,
    /// `INTERNAL` from the ledger: unexpected under these faults, and as ambiguous.
    Internal,
    /// `RESOURCE_EXHAUSTED`: shed by admission control before anything was done; retried.
    Shed,
    /// Any other answer from the ledger: definitive.
    Refused,
}

fn classify(status: &Status) -> Failure {
    let reason = reason(status);
    match (status.code(), reason.as_str()) {
        // The ledger sends ErrorInfo with every error: without it, the transport answered.
        (_, "") => Failure::Ambiguous,
        // STORE_BUSY ran nothing, but is as safe to treat as ambiguous: it is retried.
        (Code::Unavailable, "STORE_UNAVAILABLE" | "STORE_BUSY")
        | (Code::DeadlineExceeded, "DEADLINE_EXCEEDED") => Failure::Ambiguous,
        (Code::Internal, _) => Failure::Internal,
        (Code::ResourceExhausted, _) => Failure::Shed,
        _ => Failure::Refused,
    }
}

/// The lazily connecting client of a server: connects (again) at its first call after a
/// failure, so it survives the server's restarts.
fn lazy_client(addr: SocketAddr) -> LedgerServiceClient<Channel> {
    LedgerServiceClient::new(lazy_channel(addr))
}

fn lazy_channel(addr: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .connect_lazy()
}

/// Tells clients when to stop taking new intents, and when to stop retrying.
#[derive(Default)]
struct Control {
    stop: AtomicBool,
    give_up: AtomicBool,
    /// Calls made by all clients (answered or not), to tell that the load is running.
    calls: AtomicU64,
}

#[derive(Clone, Copy, Debug)]
struct ClientOpts {
    call_timeout: Duration,
    /// Leave an ambiguous Complete to the checker instead of retrying it.
    defer_ambiguous: bool,
    /// Size of a success's result.
    result_bytes: usize,
}

impl Default for ClientOpts {
    fn default() -> Self {
        ClientOpts {
            call_timeout: Duration::from_secs(5),
            defer_ambiguous: false,
            result_bytes: 64,
        }
    }
}

/// Where a client's intents come from.
#[derive(Clone, Debug)]
enum Plan {
    /// Fresh keys of its own with probability `fresh_per_mille`, else one of `shared` keys.
    Mixed { fresh_per_mille: u64, shared: u64 },
    /// Every one of `keys` shared keys once per generation, from `offset` on, block after
    /// block of `order.len()` keys, each block in the client's own `order`: clients with the
    /// same offset move through the same keys at about the same time, each in its own order.
    /// The i-th key goes to server `client + i` (then the next on failure); `once` stops after
    /// the first sweep.
    Sweep {
        keys: u64,
        offset: u64,
        order: Vec<u64>,
        once: bool,
    },
}

struct Client {
    id: usize,
    servers: Vec<LedgerServiceClient<Channel>>,
    prefer: usize,
    log: Log,
    control: Arc<Control>,
    opts: ClientOpts,
    rng: Rng,
}

impl Client {
    async fn run(mut self, plan: Plan) {
        let mut fresh = 0u64;
        let mut position = 0u64;
        while !self.control.stop.load(Ordering::SeqCst) {
            let intent = match &plan {
                Plan::Mixed {
                    fresh_per_mille,
                    shared,
                } => {
                    if self.rng.random_range(0..1000) < *fresh_per_mille {
                        fresh += 1;
                        fresh_intent(self.id, fresh)
                    } else {
                        let k = self.rng.random_range(0..*shared);
                        self.maybe_waiting(shared_intent(0, k))
                    }
                }
                Plan::Sweep {
                    keys,
                    offset,
                    order,
                    once,
                } => {
                    let generation = position / keys;
                    if *once && generation > 0 {
                        break;
                    }
                    let block = order.len() as u64;
                    let at = position % keys;
                    let k = (offset + at / block * block + order[(at % block) as usize]) % keys;
                    self.prefer = self.id + usize::try_from(position).unwrap_or(0);
                    position += 1;
                    self.maybe_waiting(shared_intent(generation, k))
                }
            };
            self.carry_out(&intent).await;
        }
    }

    /// A quarter of shared claims wait up to a second for an attempt in flight, so that
    /// waiters race for the next attempt after a retryable failure (on other servers too).
    fn maybe_waiting(&mut self, mut intent: Intent) -> Intent {
        if self.rng.random_range(0..4) == 0 {
            intent.req.wait = Some(prost_types::Duration {
                seconds: 1,
                nanos: 0,
            });
        }
        intent
    }

    async fn carry_out(&mut self, intent: &Intent) {
        let Some((resp, sent_at, after_ambiguity)) = self.claim(intent).await else {
            return;
        };
        let mine = lock(&self.log).on_claim(intent, &resp, sent_at, after_ambiguity);
        if let Some((key, attempt, token)) = mine {
            let done = if intent.class == Class::FailFirst && attempt == 1 {
                Done::FailedRetryable(format!("try again ({token})"))
            } else {
                let mut result = format!("{}:{token}:", intent.id).into_bytes();
                let mut fill = 0u8;
                while result.len() < self.opts.result_bytes {
                    result.push(b'a' + fill % 26);
                    fill = fill.wrapping_add(1);
                }
                Done::Succeeded(result)
            };
            self.complete(intent, &key, attempt, &token, done).await;
        }
    }

    fn server(&mut self) -> &mut LedgerServiceClient<Channel> {
        let n = self.servers.len();
        &mut self.servers[self.prefer % n]
    }

    async fn backoff(&mut self, tries: &mut u32) {
        let base = 20u64 << (*tries).min(5);
        let jitter = self.rng.random_range(0..base);
        *tries += 1;
        tokio::time::sleep(Duration::from_millis(base.min(400) + jitter.min(100))).await;
    }

    /// Claims until the ledger answers, retrying what may or may not have happened; returns
    /// the answer, when the answered try was sent, and whether an earlier try was ambiguous.
    async fn claim(&mut self, intent: &Intent) -> Option<(pb::ClaimResponse, Instant, bool)> {
        let mut tries = 0;
        let mut ambiguous = false;
        loop {
            let mut req = tonic::Request::new(intent.req.clone());
            req.set_timeout(self.opts.call_timeout);
            let guard = self.opts.call_timeout + CALL_GUARD;
            self.control.calls.fetch_add(1, Ordering::Relaxed);
            let sent_at = Instant::now();
            let answer = tokio::time::timeout(guard, self.server().claim(req))
                .await
                .unwrap_or_else(|_| Err(Status::cancelled("client guard")));
            let status = match answer {
                Ok(resp) => return Some((resp.into_inner(), sent_at, ambiguous)),
                Err(status) => status,
            };
            {
                let mut log = lock(&self.log);
                log.note_error("claim", &status);
                match classify(&status) {
                    Failure::Ambiguous => {
                        ambiguous = true;
                        log.key(intent).ambiguous_claims += 1;
                    }
                    Failure::Shed => {}
                    Failure::Internal => {
                        log.unexpected(format!("claim of {}: INTERNAL {status:?}", intent.id));
                        ambiguous = true;
                        log.key(intent).ambiguous_claims += 1;
                    }
                    Failure::Refused => {
                        log.unexpected(format!("claim of {} refused: {status:?}", intent.id));
                        return None;
                    }
                }
            }
            if self.control.give_up.load(Ordering::SeqCst) {
                return None;
            }
            self.prefer += 1;
            self.backoff(&mut tries).await;
        }
    }

    /// Completes until the ledger acknowledges it, or leaves it to the checker.
    async fn complete(
        &mut self,
        intent: &Intent,
        key: &str,
        attempt: u32,
        token: &str,
        done: Done,
    ) {
        let sent = Sent {
            attempt,
            token: token.to_string(),
            done: done.clone(),
        };
        lock(&self.log).key(intent).sent.push(sent.clone());
        let mut tries = 0;
        let mut ambiguous = false;
        loop {
            let mut req = tonic::Request::new(done.request(key, token));
            req.set_timeout(self.opts.call_timeout);
            let guard = self.opts.call_timeout + CALL_GUARD;
            self.control.calls.fetch_add(1, Ordering::Relaxed);
            let answer = tokio::time::timeout(guard, self.server().complete(req))
                .await
                .unwrap_or_else(|_| Err(Status::cancelled("client guard")));
            // The guard must not live across the backoff's await (the task must stay Send).
            {
                let mut log = lock(&self.log);
                match answer {
                    Ok(resp) => {
                        let resp = resp.into_inner();
                        log.operations += 1;
                        log.acknowledged += 1;
                        let mut problems = Vec::new();
                        match resp.entry.as_ref() {
                            Some(entry) if done.shown_by(entry) && entry.attempt == attempt => {}
                            other => problems.push(format!("Complete answered OK with {other:?}")),
                        }
                        if resp.already_completed && !ambiguous {
                            problems.push("already_completed on the first try".into());
                        }
                        if !problems.is_empty() {
                            log.unexpected(format!(
                                "{} ({}): {}",
                                intent.id,
                                short(key),
                                problems.join("; ")
                            ));
                        }
                        log.key(intent).acked.push(Ack {
                            attempt,
                            token: token.to_string(),
                            done,
                            at: Instant::now(),
                        });
                        return;
                    }
                    Err(status) => {
                        log.note_error("complete", &status);
                        match classify(&status) {
                            Failure::Ambiguous => ambiguous = true,
                            Failure::Shed => {}
                            Failure::Internal => {
                                log.unexpected(format!(
                                    "complete of {} ({}): INTERNAL {status:?}",
                                    intent.id,
                                    short(key)
                                ));
                                ambiguous = true;
                            }
                            Failure::Refused => {
                                if ambiguous
                                    && matches!(done, Done::FailedRetryable(_))
                                    && reason(&status) == "STALE_CLAIM_TOKEN"
                                {
                                    // Our failure was recorded, and the next attempt has begun.
                                    log.key(intent).acked.push(Ack {
                                        attempt,
                                        token: token.to_string(),
                                        done,
                                        at: Instant::now(),
                                    });
                                } else {
                                    log.unexpected(format!(
                                        "complete of {} ({}) refused: {status:?}",
                                        intent.id,
                                        short(key)
                                    ));
                                }
                                return;
                            }
                        }
                        if ambiguous
                            && (self.opts.defer_ambiguous
                                || self.control.give_up.load(Ordering::SeqCst))
                        {
                            log.key(intent).pending.push(sent);
                            return;
                        }
                        if self.control.give_up.load(Ordering::SeqCst) {
                            // Only shed so far: nothing was recorded.
                            return;
                        }
                    }
                }
            }
            self.prefer += 1;
            self.backoff(&mut tries).await;
        }
    }
}

/// The clients of a run.
struct Load {
    log: Log,
    control: Arc<Control>,
    tasks: Vec<JoinHandle<()>>,
}

impl Load {
    /// Starts `clients` clients, each with its own connection to each of `servers`.
    fn start(
        clients: usize,
        servers: &[SocketAddr],
        opts: ClientOpts,
        seed: u64,
        plan: impl Fn(usize) -> Plan,
    ) -> Load {
        let log: Log = Arc::default();
        let control: Arc<Control> = Arc::default();
        let tasks = (0..clients)
            .map(|id| {
                let client = Client {
                    id,
                    servers: servers.iter().map(|a| lazy_client(*a)).collect(),
                    prefer: id,
                    log: log.clone(),
                    control: control.clone(),
                    opts,
                    rng: Rng::seed_from_u64(seed ^ (id as u64).wrapping_mul(0x2545_F491_4F6C_DD1D)),
                };
                tokio::spawn(client.run(plan(id)))
            })
            .collect();
        Load {
            log,
            control,
            tasks,
        }
    }

    fn calls(&self) -> u64 {
        self.control.calls.load(Ordering::Relaxed)
    }

    /// Waits until the clients made `more` calls beyond now (or `within` passed): a fault
    /// then surely meets calls in flight.
    async fn wait_for_calls(&self, more: u64, within: Duration) {
        let target = self.calls() + more;
        let deadline = Instant::now() + within;
        while self.calls() < target && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Lets the load run to `profile.load` after `started`, and on until it made half as much
    /// again as the floors ask (a loaded machine is slow), for at most 20 s more.
    async fn run_out(&self, started: Instant, profile: &Profile) {
        tokio::time::sleep_until(started + profile.load).await;
        let cap = Instant::now() + Duration::from_secs(20);
        while Instant::now() < cap {
            let (operations, acknowledged) = {
                let h = lock(&self.log);
                (h.operations, h.acknowledged)
            };
            if operations >= profile.min_operations * 3 / 2
                && acknowledged >= profile.min_acknowledged * 3 / 2
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Lets the clients finish the intent in hand (retrying for up to `grace`), then stop.
    async fn stop(self, grace: Duration) -> Log {
        self.control.stop.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + grace;
        for mut task in self.tasks {
            if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
                self.control.give_up.store(true, Ordering::SeqCst);
                task.await.expect("client task");
            }
        }
        self.log
    }
}

// ---------------------------------------------------------------------------------------------
// The checker

/// What a run counted.
#[derive(Debug, Default)]
struct Report {
    name: String,
    operations: u64,
    acknowledged: u64,
    lost: u64,
    duplicated: u64,
    unexpected: u64,
    errors_seen: u64,
    unexpected_log: Vec<String>,
}

impl Report {
    /// The assertions every scenario makes.
    fn assert_clean(&self, profile: &Profile) {
        assert!(
            self.lost == 0 && self.duplicated == 0 && self.unexpected == 0,
            "faults[{}]: lost={} duplicated={} unexpected={}:\n  {}",
            self.name,
            self.lost,
            self.duplicated,
            self.unexpected,
            self.unexpected_log.join("\n  ")
        );
        assert!(
            self.operations >= profile.min_operations,
            "faults[{}]: only {} operations (floor {})",
            self.name,
            self.operations,
            profile.min_operations
        );
        assert!(
            self.acknowledged >= profile.min_acknowledged,
            "faults[{}]: only {} acknowledged completions (floor {})",
            self.name,
            self.acknowledged,
            profile.min_acknowledged
        );
        assert!(
            self.errors_seen > 0,
            "faults[{}]: no call failed, so the fault met no call in flight",
            self.name
        );
    }
}

/// Calls `f` until the ledger answers something other than "ambiguous", for up to 30 s.
async fn until_answered<T, Fut>(mut f: impl FnMut() -> Fut) -> Result<T, Status>
where
    Fut: std::future::Future<Output = Result<T, Status>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = tokio::time::timeout(Duration::from_secs(7), f())
            .await
            .unwrap_or_else(|_| Err(Status::cancelled("client guard")));
        match answer {
            Err(status) if classify(&status) == Failure::Ambiguous && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => return other,
        }
    }
}

async fn lookup(
    client: &mut LedgerServiceClient<Channel>,
    key: &str,
) -> Result<Option<pb::Entry>, Status> {
    let answer = until_answered(|| {
        let mut client = client.clone();
        let mut req = tonic::Request::new(pb::LookupRequest {
            key: key.to_string(),
            ..Default::default()
        });
        req.set_timeout(Duration::from_secs(5));
        async move { client.lookup(req).await }
    })
    .await;
    match answer {
        Ok(resp) => Ok(resp.into_inner().entry),
        Err(status) if status.code() == Code::NotFound => Ok(None),
        Err(status) => Err(status),
    }
}

/// A retried Complete of an ambiguous completion, checked against what Lookup said just
/// before: returns whether the completion is recorded now, or the contradiction.
async fn truth_check(
    client: &mut LedgerServiceClient<Channel>,
    key: &str,
    sent: &Sent,
) -> Result<&'static str, String> {
    let before = lookup(client, key)
        .await
        .map_err(|s| format!("Lookup failed: {s:?}"))?
        .ok_or("Lookup says NOT_FOUND for a claimed key")?;
    let retried = until_answered(|| {
        let mut client = client.clone();
        let mut req = tonic::Request::new(sent.done.request(key, &sent.token));
        req.set_timeout(Duration::from_secs(5));
        async move { client.complete(req).await }
    })
    .await
    .map(tonic::Response::into_inner);
    let unresolved = matches!(
        before.status(),
        pb::Status::Attempting | pb::Status::Unknown
    );
    let applied = |r: &pb::CompleteResponse| {
        r.entry
            .as_ref()
            .is_some_and(|e| sent.done.shown_by(e) && e.attempt == sent.attempt)
    };
    let (found, consistent) = if before.attempt == sent.attempt && sent.done.shown_by(&before) {
        // Recorded already: the retry must say so.
        (
            "recorded",
            matches!(&retried, Ok(r) if r.already_completed && applied(r)),
        )
    } else if before.attempt == sent.attempt && unresolved {
        // Not recorded: the retry records it.
        (
            "not_recorded",
            matches!(&retried, Ok(r) if !r.already_completed && applied(r)),
        )
    } else if before.attempt > sent.attempt && matches!(sent.done, Done::FailedRetryable(_)) {
        // Recorded, and the next attempt has begun since.
        (
            "recorded_then_next_attempt",
            matches!(&retried, Err(status) if reason(status) == "STALE_CLAIM_TOKEN"),
        )
    } else {
        // Anything else at our attempt is a state the ambiguous answer cannot explain.
        ("contradiction", false)
    };
    if consistent {
        return Ok(found);
    }
    Err(format!(
        "Lookup said {:?} attempt {} (result {:?}) and the retried Complete of attempt {} answered {:?}",
        before.status(),
        before.attempt,
        String::from_utf8_lossy(&before.result),
        sent.attempt,
        retried.map(|r| (
            r.already_completed,
            r.entry.map(|e| (e.status(), e.attempt))
        ))
    ))
}

/// How long before a database crash a replay's count may not have reached the disk: PostgreSQL's
/// WAL writer flushes commits that do not wait for it within three `wal_writer_delay`s (600 ms
/// at the default), with margin for the answer's way back to the client.
const COUNT_LOSS_WINDOW: Duration = Duration::from_secs(1);

/// How long before a server's SIGKILL a replay's count may still have been in its memory: the
/// server writes the counts every second, and the write itself takes a while on a loaded
/// machine (its own commit waits for nothing).
const MEMORY_COUNT_LOSS_WINDOW: Duration = Duration::from_secs(3);

/// The answers a crash from `began` to `done` may have taken the count of: those within
/// `window` before it began, to its end.
fn count_loss(began: Instant, done: Instant, window: Duration) -> (Instant, Instant) {
    (began.checked_sub(window).unwrap_or(began), done)
}

/// What the final Lookup of one key found wrong: (lost, unexpected descriptions). `crashes`
/// are when replays' counts may have been lost (see [`History::count_losses`]).
fn final_problems(
    log: &KeyLog,
    entry: Option<&pb::Entry>,
    crashes: &[(Instant, Instant)],
) -> (Vec<String>, Vec<String>) {
    let mut lost = Vec::new();
    let mut unexpected = Vec::new();
    let Some(entry) = entry else {
        for ack in &log.acked {
            lost.push(format!(
                "{:?} of attempt {} is NOT_FOUND",
                ack.done, ack.attempt
            ));
        }
        if log.acked.is_empty() && !log.claimed.is_empty() {
            unexpected.push("a CLAIMED key is NOT_FOUND".into());
        }
        return (lost, unexpected);
    };
    for ack in &log.acked {
        let kept = match ack.done {
            Done::Succeeded(_) => entry.attempt == ack.attempt && ack.done.shown_by(entry),
            Done::FailedRetryable(_) => {
                entry.attempt > ack.attempt
                    || (entry.attempt == ack.attempt && ack.done.shown_by(entry))
            }
        };
        if !kept {
            lost.push(format!(
                "{:?} of attempt {} (token {}) acknowledged, but the entry is {:?} attempt {} with {:?}",
                ack.done,
                ack.attempt,
                short(&ack.token),
                entry.status(),
                entry.attempt,
                String::from_utf8_lossy(&entry.result)
            ));
        }
    }
    // Every REPLAYED answer counted one replay; a claim that failed ambiguously may have too.
    // A database crash may take the counts of the replays answered just before it.
    let replays = entry.replay_count;
    let at_a_crash = log
        .replayed_at
        .iter()
        .filter(|at| {
            crashes
                .iter()
                .any(|(from, to)| **at >= *from && **at <= *to)
        })
        .count() as u64;
    if replays + at_a_crash < log.replayed || replays > log.replayed + log.ambiguous_claims {
        unexpected.push(format!(
            "replay_count {replays} after {} REPLAYED answers ({at_a_crash} of them just \
             before a crash) and {} ambiguous claims",
            log.replayed, log.ambiguous_claims
        ));
    }
    if let Some(max) = log.claimed.iter().map(|(a, _)| *a).max()
        && entry.attempt < max
    {
        unexpected.push(format!(
            "CLAIMED attempt {max}, but the entry is at attempt {}",
            entry.attempt
        ));
    }
    (lost, unexpected)
}

/// Counts the extra winners: different tokens answered `CLAIMED` for one key and attempt.
fn duplicates(h: &History) -> (u64, Vec<String>) {
    let mut duplicated = 0;
    let mut doubles = Vec::new();
    for (id, k) in &h.keys {
        let mut by_attempt: HashMap<u32, Vec<&str>> = HashMap::new();
        for (attempt, token) in &k.claimed {
            let tokens = by_attempt.entry(*attempt).or_default();
            if !tokens.contains(&token.as_str()) {
                tokens.push(token);
            }
        }
        for (attempt, tokens) in by_attempt {
            if tokens.len() > 1 {
                duplicated += tokens.len() as u64 - 1;
                doubles.push(format!(
                    "{id} ({}): attempt {attempt} CLAIMED by {} tokens",
                    short(&k.key),
                    tokens.len()
                ));
            }
        }
    }
    (duplicated, doubles)
}

/// Reads the final state through `client` (a healthy server, faults removed, clients stopped)
/// and counts; prints the `fault=` line.
async fn check(name: &str, log: &Log, client: LedgerServiceClient<Channel>) -> Report {
    // Every server writes the replay counts it holds within a second; the final Lookups go to
    // one server, which adds only its own.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // 1. Completions left ambiguous: Lookup, then the retried Complete must agree with it.
    let pending: Vec<(String, String, Sent)> = {
        let mut h = lock(log);
        h.keys
            .iter_mut()
            .flat_map(|(id, k)| {
                let key = k.key.clone();
                std::mem::take(&mut k.pending)
                    .into_iter()
                    .map(move |s| (id.clone(), key.clone(), s))
            })
            .collect()
    };
    for (id, key, sent) in pending {
        let mut c = client.clone();
        let outcome = truth_check(&mut c, &key, &sent).await;
        let mut h = lock(log);
        match outcome {
            Ok(found) => {
                *h.truth_checks.entry(found).or_default() += 1;
                h.acknowledged += 1;
                h.keys.get_mut(&id).expect("logged").acked.push(Ack {
                    attempt: sent.attempt,
                    token: sent.token,
                    done: sent.done,
                    at: Instant::now(),
                });
            }
            Err(why) => h.unexpected(format!("{id} ({}): {why}", short(&key))),
        }
    }

    // 2. The final state of every key that was claimed or completed, 8 lookups at a time.
    let keys: Vec<(String, KeyLog)> = lock(log)
        .keys
        .iter()
        .filter(|(_, k)| !k.key.is_empty() && (!k.claimed.is_empty() || !k.acked.is_empty()))
        .map(|(id, k)| (id.clone(), k.clone()))
        .collect();
    let keys = Arc::new(keys);
    let crashes = Arc::new(lock(log).count_losses.clone());
    let mut readers = Vec::new();
    for part in 0..8 {
        let keys = keys.clone();
        let crashes = crashes.clone();
        let mut client = client.clone();
        readers.push(tokio::spawn(async move {
            let mut lost = Vec::new();
            let mut unexpected = Vec::new();
            for (id, k) in keys.iter().skip(part).step_by(8) {
                match lookup(&mut client, &k.key).await {
                    Ok(entry) => {
                        let (l, u) = final_problems(k, entry.as_ref(), &crashes);
                        let tag = |p: String| format!("{id} ({}): {p}", short(&k.key));
                        lost.extend(l.into_iter().map(tag));
                        unexpected.extend(u.into_iter().map(tag));
                    }
                    Err(status) => {
                        unexpected.push(format!("{id}: final Lookup failed: {status:?}"))
                    }
                }
            }
            (lost, unexpected)
        }));
    }
    let mut lost = Vec::new();
    for reader in readers {
        let (l, u) = reader.await.expect("reader");
        lost.extend(l);
        let mut h = lock(log);
        for u in u {
            h.unexpected(u);
        }
    }

    // 3. Two winners of one attempt.
    let h = lock(log);
    let (duplicated, doubles) = duplicates(&h);

    let report = Report {
        name: name.to_string(),
        operations: h.operations,
        acknowledged: h.acknowledged,
        lost: lost.len() as u64,
        duplicated,
        unexpected: h.unexpected,
        errors_seen: h.errors_seen(),
        unexpected_log: lost
            .iter()
            .map(|l| format!("lost: {l}"))
            .chain(doubles.iter().map(|d| format!("duplicated: {d}")))
            .chain(h.unexpected_log.iter().map(|u| format!("unexpected: {u}")))
            .take(40)
            .collect(),
    };
    eprintln!(
        "fault={name} operations={} acknowledged={} lost={} duplicated={} unexpected={}",
        report.operations, report.acknowledged, report.lost, report.duplicated, report.unexpected
    );
    eprintln!(
        "faults[{name}] details: keys={} ambiguous_completions_checked={:?} orphaned_claims={} errors={:?}",
        h.keys.len(),
        h.truth_checks,
        h.orphans,
        h.errors
    );
    for line in &report.unexpected_log {
        eprintln!("faults[{name}]   {line}");
    }
    report
}

// ---------------------------------------------------------------------------------------------
// Servers, health, databases

async fn kill9(server: &mut ServerProcess) {
    assert!(
        server.child.try_wait().expect("try_wait").is_none(),
        "the server exited on its own before the kill"
    );
    server.child.start_kill().expect("SIGKILL");
    tokio::time::timeout(Duration::from_secs(10), server.child.wait())
        .await
        .expect("the killed server is gone within 10 s")
        .expect("wait");
}

async fn health(channel: &Channel) -> Option<ServingStatus> {
    let mut health = HealthClient::new(channel.clone());
    let mut req = tonic::Request::new(HealthCheckRequest {
        service: String::new(),
    });
    req.set_timeout(Duration::from_secs(1));
    match tokio::time::timeout(Duration::from_secs(2), health.check(req)).await {
        Ok(Ok(resp)) => Some(resp.into_inner().status()),
        _ => None,
    }
}

/// Polls health until it reports `want`; returns how long that took, or panics after `within`.
async fn wait_for_health(channel: &Channel, want: ServingStatus, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let got = health(channel).await;
        if got == Some(want) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "health did not become {want:?} within {within:?}; last: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until no statement of the ledger runs in `url`'s database (sampled three times in a
/// row), so that a late commit cannot change an entry between the checker's Lookup and its
/// retried Complete.
async fn wait_for_quiet_database(url: &str) {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .expect("connect to check for running statements");
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut quiet = 0;
    while quiet < 3 {
        let running: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND pid <> pg_backend_pid() AND state <> 'idle' AND query <> 'SELECT 1' \
             AND query NOT LIKE 'LISTEN%'",
        )
        .fetch_one(&pool)
        .await
        .expect("pg_stat_activity");
        quiet = if running == 0 { quiet + 1 } else { 0 };
        assert!(
            Instant::now() < deadline,
            "statements still running 15 s after the faults ended"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    pool.close().await;
}

fn mixed(_: usize) -> Plan {
    Plan::Mixed {
        fresh_per_mille: 600,
        shared: 48,
    }
}

fn fresh_only(_: usize) -> Plan {
    Plan::Mixed {
        fresh_per_mille: 1000,
        shared: 1,
    }
}

// ---------------------------------------------------------------------------------------------
// 1 and 5: kill -9 of the binary under load

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn faults_kill9_under_load_on_sqlite() {
    kill9_under_load(
        "kill9-sqlite",
        Backend::Sqlite,
        mixed,
        ClientOpts::default(),
        1,
        5,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn faults_kill9_under_load_on_postgres() {
    kill9_under_load(
        "kill9-postgres",
        Backend::Postgres,
        mixed,
        ClientOpts::default(),
        1,
        5,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn faults_sqlite_kill9_during_writes() {
    let opts = ClientOpts {
        result_bytes: 2048,
        ..ClientOpts::default()
    };
    kill9_under_load(
        "kill9-sqlite-writes",
        Backend::Sqlite,
        fresh_only,
        opts,
        2,
        10,
    )
    .await;
}

/// 12 clients on one server process; `faults` times: SIGKILL at a random moment of the load,
/// 200 ms down, restart on the same database and port.
async fn kill9_under_load(
    name: &str,
    backend: Backend,
    plan: fn(usize) -> Plan,
    opts: ClientOpts,
    bounded_kills: usize,
    full_kills: usize,
) {
    let profile = profile(bounded_kills, full_kills);
    let mut rng = Rng::seed_from_u64(seed(name));
    let db = TestDb::new(backend);
    let mut server = ServerProcess::start(&db.url, SERVER_FLAGS).await;
    // Restarts come back on the port the kernel gave the first start.
    let port = server.addr.port();
    let load = Load::start(12, &[server.addr], opts, rng.next_u64(), plan);
    let started = Instant::now();
    let slot = profile.load / u32::try_from(profile.faults + 1).expect("few faults");
    for i in 0..profile.faults {
        // Somewhere in the middle half of the i-th slot.
        let jitter = Duration::from_millis(rng.random_range(0..slot.as_millis() as u64 / 2));
        tokio::time::sleep_until(
            started + slot * u32::try_from(i + 1).expect("few") - slot / 4 + jitter,
        )
        .await;
        load.wait_for_calls(50, Duration::from_secs(10)).await;
        let killed = Instant::now();
        kill9(&mut server).await;
        lock(&load.log).count_losses.push(count_loss(
            killed,
            Instant::now(),
            MEMORY_COUNT_LOSS_WINDOW,
        ));
        tokio::time::sleep(Duration::from_millis(200)).await;
        server = ServerProcess::start_on(&db.url, port, SERVER_FLAGS).await;
    }
    load.run_out(started, &profile).await;
    let log = load.stop(Duration::from_secs(20)).await;
    let report = check(name, &log, lazy_client(server.addr)).await;
    report.assert_clean(&profile);
}

// ---------------------------------------------------------------------------------------------
// 2: three servers on one PostgreSQL, one killed

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn faults_three_servers_on_postgres_one_killed() {
    let name = "three-servers-kill9";
    // Most answers here are IN_PROGRESS or REPLAYED: a sweep of all 64 clients over the 200
    // keys completes about 240 of them, and a full run makes one or two sweeps.
    let profile = profile(1, 3).full_acknowledged(200);
    let mut rng = Rng::seed_from_u64(seed(name));
    let db = TestDb::new(Backend::Postgres);
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(ServerProcess::start(&db.url, SERVER_FLAGS).await);
    }
    // Restarts come back on the ports the kernel gave the first starts.
    let ports: Vec<u16> = servers.iter().map(|s| s.addr.port()).collect();
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr).collect();
    // Four groups of 16 clients; a group's clients sweep the same blocks of 8 keys together,
    // each block in a different order, on different servers.
    const KEYS: u64 = 200;
    const BLOCK: u64 = 8;
    let once = !profile.full;
    let orders = rng.next_u64();
    let load = Load::start(64, &addrs, ClientOpts::default(), rng.next_u64(), |id| {
        let mut order: Vec<u64> = (0..BLOCK).collect();
        let mut shuffle = Rng::seed_from_u64(orders ^ id as u64);
        for i in (1..order.len()).rev() {
            order.swap(i, shuffle.random_range(0..i as u64 + 1) as usize);
        }
        Plan::Sweep {
            keys: KEYS,
            offset: (id as u64 % 4) * (KEYS / 4),
            order,
            once,
        }
    });
    let started = Instant::now();
    let slot = profile.load / u32::try_from(profile.faults + 1).expect("few faults");
    for i in 0..profile.faults {
        tokio::time::sleep_until(started + slot * u32::try_from(i + 1).expect("few")).await;
        load.wait_for_calls(200, Duration::from_secs(10)).await;
        let victim = (1 + i) % servers.len();
        let killed = Instant::now();
        kill9(&mut servers[victim]).await;
        lock(&load.log).count_losses.push(count_loss(
            killed,
            Instant::now(),
            MEMORY_COUNT_LOSS_WINDOW,
        ));
        tokio::time::sleep(Duration::from_millis(300)).await;
        servers[victim] = ServerProcess::start_on(&db.url, ports[victim], SERVER_FLAGS).await;
    }
    load.run_out(started, &profile).await;
    // In the bounded run each client sweeps once; let the sweeps finish.
    let log = load.stop(Duration::from_secs(30)).await;
    let report = check(name, &log, lazy_client(addrs[0])).await;
    report.assert_clean(&profile);
}

// ---------------------------------------------------------------------------------------------
// 3: pg_ctl stop -m immediate under load

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn faults_postgres_immediate_stop_under_load() {
    let name = "postgres-immediate-stop";
    let profile = profile(1, 4);
    let mut rng = Rng::seed_from_u64(seed(name));
    let cluster = Arc::new(
        tokio::task::spawn_blocking(PgCluster::start)
            .await
            .expect("cluster"),
    );
    let url = {
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || cluster.create_database())
            .await
            .expect("database")
    };
    let server = ServerProcess::start(&url, SERVER_FLAGS).await;
    let channel = lazy_channel(server.addr);
    let load = Load::start(
        8,
        &[server.addr],
        ClientOpts::default(),
        rng.next_u64(),
        mixed,
    );
    let started = Instant::now();
    let slot = profile.load / u32::try_from(profile.faults + 1).expect("few faults");
    for i in 0..profile.faults {
        tokio::time::sleep_until(started + slot * u32::try_from(i + 1).expect("few") - slot / 2)
            .await;
        load.wait_for_calls(50, Duration::from_secs(10)).await;
        let stopped = Instant::now();
        {
            let cluster = cluster.clone();
            tokio::task::spawn_blocking(move || cluster.stop(StopMode::Immediate))
                .await
                .expect("stop");
        }
        let noticed =
            wait_for_health(&channel, ServingStatus::NotServing, Duration::from_secs(5)).await;
        // A claim now fails UNAVAILABLE with the ledger's reason and a retry delay.
        let mut probe = LedgerServiceClient::new(channel.clone());
        let mut req = tonic::Request::new(claim_req(
            "outage-probe",
            "open_ticket",
            &format!(r#"{{"outage":{i}}}"#),
        ));
        req.set_timeout(Duration::from_secs(10));
        let err = probe
            .claim(req)
            .await
            .expect_err("a claim while the database is down");
        assert_eq!(err.code(), Code::Unavailable, "{err:?}");
        assert_eq!(reason(&err), "STORE_UNAVAILABLE", "{err:?}");
        assert!(err.get_details_retry_info().is_some(), "{err:?}");
        // Down for at least a second, then back on the same port and data.
        tokio::time::sleep_until(stopped + Duration::from_secs(1)).await;
        {
            let cluster = cluster.clone();
            tokio::task::spawn_blocking(move || cluster.restart())
                .await
                .expect("restart");
        }
        let recovered =
            wait_for_health(&channel, ServingStatus::Serving, Duration::from_secs(15)).await;
        // The counts of the replays answered before the crash that had not reached the disk,
        // and those whose batch met the outage (dropped as perhaps committed), until the
        // server wrote again.
        lock(&load.log).count_losses.push(count_loss(
            stopped,
            Instant::now() + Duration::from_secs(2),
            MEMORY_COUNT_LOSS_WINDOW,
        ));
        let mut req = tonic::Request::new(claim_req(
            "outage-probe",
            "open_ticket",
            &format!(r#"{{"after":{i}}}"#),
        ));
        req.set_timeout(Duration::from_secs(10));
        let claimed = probe
            .claim(req)
            .await
            .expect("claims work again without restarting the ledger server")
            .into_inner();
        assert_eq!(claimed.outcome(), pb::Outcome::Claimed);
        eprintln!(
            "faults[{name}] outage {i}: NOT_SERVING after {noticed:?}, SERVING {recovered:?} after the restart"
        );
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    load.run_out(started, &profile).await;
    let log = load.stop(Duration::from_secs(20)).await;
    let report = check(name, &log, lazy_client(server.addr)).await;
    report.assert_clean(&profile);
    drop(server);
}

// ---------------------------------------------------------------------------------------------
// 4: the link between server and PostgreSQL

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LinkFault {
    /// 20 ms per chunk for the first half of the window (slow, within deadlines), 600 ms for
    /// the second (a round trip takes 1.2 s, so every call that reaches the database outlives
    /// its 1 s deadline while its statements go on).
    Latency,
    /// Nothing passes for the whole window (longer than the pool's acquire timeout).
    Blackhole,
    /// Every connection reset every 250 ms.
    Reset,
    /// One write statement at a time cut at its commit, re-armed every 50 ms.
    CutAtCommit,
    /// A cut after a random 0 to 4000 server bytes, re-armed every 100 ms.
    CutAfterServerBytes,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn faults_link_latency() {
    through_proxy("link-latency", LinkFault::Latency).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn faults_link_blackhole() {
    through_proxy("link-blackhole", LinkFault::Blackhole).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn faults_link_reset() {
    through_proxy("link-reset", LinkFault::Reset).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn faults_link_cut_at_commit() {
    through_proxy("link-cut-at-commit", LinkFault::CutAtCommit).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn faults_link_cut_after_server_bytes() {
    through_proxy(
        "link-cut-after-server-bytes",
        LinkFault::CutAfterServerBytes,
    )
    .await;
}

/// 8 clients on a server that reaches the shared cluster through a proxy; `faults` windows of
/// the fault, each followed by a clean stretch; ambiguous completions are left to the checker,
/// which runs once the faults are off and the database is quiet.
async fn through_proxy(name: &str, fault: LinkFault) {
    // A clean start, the fault for 2.7 s (3 s for the blackhole), a clean end.
    let profile = profile(1, 6).bounded_load(Duration::from_secs(4));
    let mut rng = Rng::seed_from_u64(seed(name));
    let direct = PgCluster::shared().create_database();
    let upstream: SocketAddr = format!("127.0.0.1:{}", PgCluster::shared().port())
        .parse()
        .expect("addr");
    let proxy = Proxy::start(upstream).await;
    let server = ServerProcess::start(&proxy.url_for(&direct), SERVER_FLAGS).await;
    let channel = lazy_channel(server.addr);
    let opts = ClientOpts {
        // Short enough that calls stuck on the slow or silent link outlive their deadline
        // while their statements finish later.
        call_timeout: match fault {
            LinkFault::Latency => Duration::from_secs(1),
            LinkFault::Blackhole => Duration::from_secs(2),
            _ => Duration::from_secs(5),
        },
        defer_ambiguous: true,
        ..ClientOpts::default()
    };
    let load = Load::start(8, &[server.addr], opts, rng.next_u64(), mixed);
    let started = Instant::now();
    let slot = profile.load / u32::try_from(profile.faults).expect("faults");
    let mut not_serving_seen = false;
    for i in 0..profile.faults {
        // The window: from a sixth into the slot to five sixths; then a clean stretch.
        let from = started + slot * u32::try_from(i).expect("few") + slot / 6;
        let until = from + slot * 2 / 3;
        tokio::time::sleep_until(from).await;
        load.wait_for_calls(50, Duration::from_secs(10)).await;
        match fault {
            LinkFault::Latency => {
                proxy.set_latency(Duration::from_millis(20));
                tokio::time::sleep_until(from + (until - from) / 2).await;
                proxy.set_latency(Duration::from_millis(600));
                tokio::time::sleep_until(until).await;
            }
            LinkFault::Blackhole => {
                proxy.blackhole(true);
                // Longer than the 2 s acquire timeout and the 1 s probe timeout.
                let until = until.max(Instant::now() + Duration::from_millis(3000));
                while Instant::now() < until {
                    not_serving_seen |= health(&channel).await == Some(ServingStatus::NotServing);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            LinkFault::Reset => {
                while Instant::now() < until {
                    proxy.reset_all();
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
            LinkFault::CutAtCommit => {
                while Instant::now() < until {
                    if proxy.armed_write_cuts() == 0 {
                        proxy.cut_writes_at_commit(1);
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            LinkFault::CutAfterServerBytes => {
                while Instant::now() < until {
                    if !proxy.byte_cut_armed() {
                        proxy.cut_after_server_bytes(rng.random_range(0..4000));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        proxy.clear();
        // A batch of replay counts whose write met the fault may have been dropped (perhaps
        // committed, so never written twice): the replays answered up to a batch before the
        // window, to a batch after it.
        lock(&load.log).count_losses.push(count_loss(
            from,
            Instant::now() + Duration::from_secs(2),
            MEMORY_COUNT_LOSS_WINDOW,
        ));
    }
    // A clean stretch, then the checker on a healthy, quiet ledger.
    tokio::time::sleep(Duration::from_millis(700)).await;
    load.run_out(started, &profile).await;
    let log = load.stop(Duration::from_secs(20)).await;
    wait_for_health(&channel, ServingStatus::Serving, Duration::from_secs(15)).await;
    // Past the acquire timeout, no request can still wait for a connection in the server.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    wait_for_quiet_database(&direct).await;
    let report = check(name, &log, lazy_client(server.addr)).await;
    let stats = proxy.stats();
    eprintln!("faults[{name}] details: proxy {stats:?}");
    match fault {
        LinkFault::Latency => {}
        LinkFault::Blackhole => assert!(
            not_serving_seen,
            "health never turned NOT_SERVING while the link was down"
        ),
        LinkFault::Reset => assert!(stats.resets > 0, "{stats:?}"),
        LinkFault::CutAtCommit => assert!(stats.commit_cuts > 0, "{stats:?}"),
        LinkFault::CutAfterServerBytes => assert!(stats.byte_cuts > 0, "{stats:?}"),
    }
    report.assert_clean(&profile);
    drop(server);
}

// ---------------------------------------------------------------------------------------------
// The checker itself: it must count what it claims to count, or every run above passes vacuously.

#[test]
fn faults_checker_counts_duplicates_stale_reads_bad_replays_and_lost_completions() {
    fn entry(status: pb::Status, attempt: u32, result: &[u8]) -> pb::Entry {
        pb::Entry {
            key: "k".repeat(64),
            status: status.into(),
            attempt,
            result: result.to_vec().into(),
            ..Default::default()
        }
    }
    fn answer(outcome: pb::Outcome, token: &str, entry: pb::Entry) -> pb::ClaimResponse {
        pb::ClaimResponse {
            outcome: outcome.into(),
            entry: Some(entry),
            claim_token: token.into(),
            ..Default::default()
        }
    }
    let shared = shared_intent(0, 1);
    let fresh = fresh_intent(0, 1);
    let mut h = History::default();
    let t0 = Instant::now();

    // A clean history: one winner, an acknowledged success, a replay of it.
    let won = answer(
        pb::Outcome::Claimed,
        "tok-a",
        entry(pb::Status::Attempting, 1, b""),
    );
    assert!(h.on_claim(&shared, &won, t0, false).is_some());
    let result = b"r-a".to_vec();
    h.key(&shared).sent.push(Sent {
        attempt: 1,
        token: "tok-a".into(),
        done: Done::Succeeded(result.clone()),
    });
    let acked_at = Instant::now();
    h.key(&shared).acked.push(Ack {
        attempt: 1,
        token: "tok-a".into(),
        done: Done::Succeeded(result.clone()),
        at: acked_at,
    });
    let replay = answer(
        pb::Outcome::Replayed,
        "",
        entry(pb::Status::Succeeded, 1, &result),
    );
    h.on_claim(&shared, &replay, acked_at + Duration::from_millis(1), false);
    assert_eq!(
        (h.unexpected, duplicates(&h).0),
        (0, 0),
        "{:?}",
        h.unexpected_log
    );
    let log = h.keys[&shared.id].clone();
    let mut kept = entry(pb::Status::Succeeded, 1, &result);
    kept.replay_count = 1;
    let (lost, unexpected) = final_problems(&log, Some(&kept), &[]);
    assert!(lost.is_empty() && unexpected.is_empty(), "{unexpected:?}");
    // A replay answered but not counted, or counted without an answer.
    for count in [0, 2] {
        kept.replay_count = count;
        assert_eq!(final_problems(&log, Some(&kept), &[]).1.len(), 1, "{count}");
    }
    // A database crash just after the replay may have taken its count, not one long after;
    // and it excuses no count without an answer. The same for a server's kill, with its own
    // window.
    let answered = log.replayed_at[0];
    let just_after = [count_loss(
        answered + Duration::from_millis(100),
        answered + Duration::from_millis(200),
        COUNT_LOSS_WINDOW,
    )];
    let long_after = [count_loss(
        answered + COUNT_LOSS_WINDOW + Duration::from_millis(1),
        answered + COUNT_LOSS_WINDOW + Duration::from_secs(1),
        COUNT_LOSS_WINDOW,
    )];
    let kill_just_after = [count_loss(
        answered + MEMORY_COUNT_LOSS_WINDOW - Duration::from_millis(1),
        answered + MEMORY_COUNT_LOSS_WINDOW,
        MEMORY_COUNT_LOSS_WINDOW,
    )];
    kept.replay_count = 0;
    assert!(
        final_problems(&log, Some(&kept), &kill_just_after)
            .1
            .is_empty()
    );
    kept.replay_count = 0;
    assert!(final_problems(&log, Some(&kept), &just_after).1.is_empty());
    assert_eq!(final_problems(&log, Some(&kept), &long_after).1.len(), 1);
    kept.replay_count = 2;
    assert_eq!(final_problems(&log, Some(&kept), &just_after).1.len(), 1);

    // A second winner of attempt 1.
    let second = answer(
        pb::Outcome::Claimed,
        "tok-b",
        entry(pb::Status::Attempting, 1, b""),
    );
    h.on_claim(&shared, &second, t0, false);
    assert_eq!(duplicates(&h).0, 1);
    // ... which, claimed after the success was acknowledged, is unexpected too.
    let late = h.unexpected;
    h.on_claim(&shared, &second, acked_at + Duration::from_millis(2), false);
    assert_eq!(h.unexpected, late + 1, "{:?}", h.unexpected_log);

    // A stale read: IN_PROGRESS sent after the success was acknowledged.
    let before = h.unexpected;
    let stale = answer(
        pb::Outcome::InProgress,
        "",
        entry(pb::Status::Attempting, 1, b""),
    );
    h.on_claim(&shared, &stale, acked_at + Duration::from_millis(1), false);
    assert_eq!(h.unexpected, before + 1);
    // ... but not one sent before it.
    h.on_claim(&shared, &stale, t0, false);
    assert_eq!(h.unexpected, before + 1);

    // A replay of a result nobody sent; PREVIOUSLY_FAILED; a fresh key IN_PROGRESS unasked.
    let forged = answer(
        pb::Outcome::Replayed,
        "",
        entry(pb::Status::Succeeded, 1, b"forged"),
    );
    h.on_claim(&shared, &forged, t0, false);
    assert_eq!(h.unexpected, before + 2);
    let failed = answer(
        pb::Outcome::PreviouslyFailed,
        "",
        entry(pb::Status::Failed, 1, b""),
    );
    h.on_claim(&shared, &failed, t0, false);
    assert_eq!(h.unexpected, before + 3);
    let in_flight = answer(
        pb::Outcome::InProgress,
        "",
        entry(pb::Status::Attempting, 1, b""),
    );
    h.on_claim(&fresh, &in_flight, t0, false);
    assert_eq!(h.unexpected, before + 4);
    h.on_claim(&fresh, &in_flight, t0, true);
    assert_eq!((h.unexpected, h.orphans), (before + 4, 1));

    // Lost: the acknowledged success is not what the final Lookup shows.
    for shown in [
        Some(entry(pb::Status::Attempting, 1, b"")),
        Some(entry(pb::Status::Succeeded, 1, b"other")),
        None,
    ] {
        let (lost, _) = final_problems(&log, shown.as_ref(), &[]);
        assert_eq!(lost.len(), 1, "{shown:?}");
    }
    // A CLAIMED attempt the final state no longer shows.
    let mut claimed_only = KeyLog::default();
    claimed_only.claimed.push((2, "tok-c".into()));
    let (_, unexpected) =
        final_problems(&claimed_only, Some(&entry(pb::Status::Failed, 1, b"")), &[]);
    assert_eq!(unexpected.len(), 1);
}
