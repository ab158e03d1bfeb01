//! The history check: Jepsen's idea at the ledger's scale. Real servers run under a nemesis
//! while clients carry out hot intents against a recorded outside world; every call and answer
//! is recorded, and afterwards the history and the final state are checked key by key.
//!
//! # The system
//!
//! - On PostgreSQL: a cluster of the test's own and three `idempotency-ledger` processes (the
//!   real binary) on one database, each reaching it through a TCP fault proxy of its own
//!   ([`Proxy`]).
//! - On SQLite: one process on a file.
//!
//! # The clients
//!
//! Twelve *workers* run claim, act, complete on a few hot intents:
//! three explicit keys at a time, out of a window that moves on every 250 ms, so many workers
//! meet on one key. Half of the claims wait up to a second for an attempt in flight. Acting is
//! an effect in the *world*, an in-test outside system that records every effect with its key,
//! external_ref, attempt and receipt, and answers "did this happen?" by external_ref, as a
//! tool's own read would. Of the attempts a worker claims, 10 % crash before acting (the token
//! is forgotten, nothing completes), 10 % fail before acting (`FAILED` retryable), 12 % crash
//! after acting (never completing), and the rest complete `SUCCEEDED` with the effect's
//! receipt, retrying on `UNAVAILABLE` or no answer on any server.
//!
//! A worker acts only within [`ACT_WITHIN`] of sending its Claim, less than the lease
//! ([`LEASE`]), and reports a failure only within that time too: a reconciler asks the world
//! only about an attempt whose lease has ended, so what it hears is final. (A worker that acts
//! after its lease can make two effects whatever the ledger does; that is the client's rule to
//! keep, not the ledger's.)
//!
//! Two *reconcilers* run the Reconcile loop: each entry handed out is looked up in the world,
//! and the finding (found: `SUCCEEDED` with the receipt; not found: `FAILED` retryable) goes
//! with the reconciler's next call, fenced by the attempt and hold token the entry was handed
//! out with, and is sent again after a failed call however late. A quarter of the time a
//! reconciler stalls past its hold (`--reconcile-lease`) before sending its findings, so
//! findings arrive after the entry was handed out again or claimed again: the server's fence
//! must answer them stale, never apply them to what they did not see. (Without the fence, a
//! late "not found" about attempt 1 settles an unknown attempt 2 as not done, and attempt 3
//! acts again: the check finds two effects.)
//!
//! # The nemesis
//!
//! One fault at a time, every 0.6 to 1.8 s, the kinds in a shuffled cycle so that each comes
//! up: SIGKILL of a server and its restart on the same port; `pg_ctl stop -m immediate` of
//! PostgreSQL and its start; a reset of every link at the proxies; a cut of one link in the
//! middle of a server message; a cut of a write's answer after it committed; a partition of one
//! link for up to 1.2 s. On SQLite, the kills only.
//!
//! # The check
//!
//! Once the nemesis stopped, the workers and reconcilers stopped, every lease and hold ended,
//! and a final reconcile pass found nothing more to hand out, the history checker
//! ([`testkit::history`]) judges the recorded history; each key must show:
//!
//! - at most one effect in the world for the intent;
//! - nothing in flight: the entry is `SUCCEEDED` or `FAILED` (retryable: nobody reports a
//!   permanent failure);
//! - an effect, if any, as the entry's result, byte for byte, at the effect's attempt; and a
//!   `SUCCEEDED` entry only with an effect;
//! - every acknowledged completion (a Complete answered OK, an entry a Reconcile resolved)
//!   present: the success's result byte for byte, a failure at its attempt or followed by a
//!   later one;
//! - every `REPLAYED` answer carrying that result, and one more Claim replaying it now;
//! - one token per claimed attempt, and no `PREVIOUSLY_FAILED`.
//!
//! And no server answered `INTERNAL` (`UNAVAILABLE` is expected during faults) or panicked.
//! Floors on the calls, effects and faults make sure the run did something.
//!
//! # Running it
//!
//! Each store's test loads for 12 s by default (`HISTORY_SECONDS` changes that), longer (up to
//! three times that) while the run has not yet done what the floors ask, as on a loaded machine
//! that does less in the same time, and must end within 90 s. `HISTORY_SEED=<n>` replays the random choices of a run (the clients', the
//! nemesis's; the interleaving is the machine's); a failure prints its seed and the command:
//!
//! ```sh
//! HISTORY_SEED=<n> cargo nextest run --test api -E 'test(/^history::/)'
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use idempotency_ledger::grpc::pb;
use idempotency_ledger::grpc::pb::ledger_service_client::LedgerServiceClient;
use rand::rngs::Xoshiro256PlusPlus as Rng;
use rand::{
    Rng as _, RngExt as _, SeedableRng as _, seq::IndexedRandom as _, seq::SliceRandom as _,
};
use testkit::history::{Answer, Effect, EntryStatus, Figures, Finals, History, Seen, World, short};
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use crate::support::postgres::{PgCluster, StopMode};
use crate::support::proxy::Proxy;
use crate::support::{ServerProcess, reason};

/// The lease every claim asks for.
const LEASE: Duration = Duration::from_secs(3);
/// How long after sending its Claim a worker may still act, or report that it did not.
const ACT_WITHIN: Duration = Duration::from_secs(2);
/// `--reconcile-lease`: how long an entry handed out stays held for its reconciler.
const HOLD: Duration = Duration::from_secs(2);
/// [`HOLD`] as the flag says it.
const HOLD_FLAG: &str = "2s";
/// The deadline of every call (its `grpc-timeout`); the client gives up a second later.
const CALL_TIMEOUT: Duration = Duration::from_secs(4);
/// How many intents are hot at once.
const HOT: u64 = 3;
/// How often the window of hot intents moves on by one.
const SLIDE: Duration = Duration::from_millis(250);
/// The longest a store's whole run may take.
const BUDGET: Duration = Duration::from_secs(90);
/// How much longer than asked the load may go on for a run that has not yet done enough to be
/// judged (a loaded machine): within [`BUDGET`] at the default load.
const MAX_LOAD_FACTOR: u32 = 3;
const TOOL: &str = "issue_credit";
const RUN: &str = "history";

// ---------------------------------------------------------------------------------------------
// The world outside the ledger

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

// ---------------------------------------------------------------------------------------------
// The recorded history (testkit::history holds the model and the check; here, the ledger's
// answers as it sees them)

/// An entry as an answer showed it.
fn seen_of(entry: &pb::Entry) -> Seen {
    Seen {
        key: entry.key.clone(),
        status: match entry.status() {
            pb::Status::Succeeded => EntryStatus::Succeeded,
            pb::Status::Failed => EntryStatus::Failed,
            other => EntryStatus::Other(other.as_str_name()),
        },
        attempt: entry.attempt,
        result: entry.result.to_vec(),
        retryable: entry.retryable,
        possible_double_effect: entry.possible_double_effect,
    }
}

fn error_answer(result: Option<&Status>) -> Answer {
    match result {
        Some(s) => Answer::Error {
            code: s.code(),
            reason: reason(s),
            message: s.message().to_string(),
        },
        None => Answer::Unanswered,
    }
}

/// A call's answer, `Err(None)` when none came within its deadline and a second more.
async fn within<T>(
    call: impl Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, Option<Status>> {
    match tokio::time::timeout(CALL_TIMEOUT + Duration::from_secs(1), call).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(Some(status)),
        Err(_) => Err(None),
    }
}

fn request<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request
}

fn pb_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration::try_from(d).expect("a short duration")
}

// ---------------------------------------------------------------------------------------------
// The clients

/// What the workers, reconcilers and the checker share.
struct Ctx {
    store: &'static str,
    seed: u64,
    clients: Vec<LedgerServiceClient<Channel>>,
    world: World,
    history: History,
    stop: AtomicBool,
    counts: Counts,
    odds: Odds,
    /// Every finding a reconciler sent, by key: the late mail the nemesis delivers again.
    mailbag: Mutex<BTreeMap<String, Vec<pb::Resolution>>>,
}

#[derive(Default)]
struct Counts {
    crashed_before: AtomicU64,
    failed_before: AtomicU64,
    crashed_after: AtomicU64,
    too_late: AtomicU64,
    gave_up_completing: AtomicU64,
    found: AtomicU64,
    not_found: AtomicU64,
    /// Stalls of a reconciler past its hold, with findings in hand.
    stalls: AtomicU64,
    /// Findings the server answered RESOLUTION_STALE.
    stale: AtomicU64,
    /// Old findings about an earlier attempt delivered again while a later one was unknown.
    redelivered: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

fn intent_key(n: u64) -> String {
    format!("intent-{n:04}")
}

fn intent_args(n: u64) -> String {
    format!(r#"{{"intent":{n},"amount":5,"currency":"EUR"}}"#)
}

impl Ctx {
    fn client(&self, server: usize) -> LedgerServiceClient<Channel> {
        self.clients[server].clone()
    }

    /// One of the intents hot now, or one time in `odds.straggler` a straggler's: an intent a
    /// reconciler found not done, asked again (the agent told it may try again; a run resumed),
    /// so that it is claimed again while old findings about it are still about; an intent of
    /// 2 to 10 s ago when there is none.
    fn hot_intent(&self, rng: &mut Rng) -> u64 {
        let window = self.history.started.elapsed().as_millis() / SLIDE.as_millis();
        let window = u64::try_from(window).unwrap_or(0);
        if !rng.random_ratio(1, self.odds.straggler) {
            return window + rng.random_range(0..HOT);
        }
        let not_done: Vec<u64> = lock(&self.mailbag)
            .iter()
            .filter(|(_, sent)| {
                sent.last()
                    .is_some_and(|f| f.status() == pb::Status::Failed)
            })
            .filter_map(|(key, _)| key.trim_start_matches("intent-").parse().ok())
            .collect();
        match not_done.choose(rng) {
            Some(n) => *n,
            None => window.saturating_sub(rng.random_range(8..40)) + rng.random_range(0..HOT),
        }
    }

    fn claim_request(&self, n: u64, actor: &str, wait: Option<Duration>) -> pb::ClaimRequest {
        pb::ClaimRequest {
            run_id: RUN.into(),
            tool: TOOL.into(),
            arguments_json: intent_args(n),
            key: intent_key(n),
            lease: Some(pb_duration(LEASE)),
            wait: wait.map(pb_duration),
            principal: actor.into(),
            ..Default::default()
        }
    }
}

async fn pause(rng: &mut Rng, from_ms: u64, to_ms: u64) {
    let ms = from_ms + rng.random_range(0..to_ms.saturating_sub(from_ms).max(1));
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

async fn worker(ctx: Arc<Ctx>, id: usize, mut rng: Rng) {
    let actor = format!("w{id}");
    while !ctx.stop.load(Ordering::SeqCst) {
        let n = ctx.hot_intent(&mut rng);
        let key = intent_key(n);
        let server = rng.random_range(0..ctx.clients.len());
        let wait = rng
            .random_ratio(1, 2)
            .then(|| Duration::from_millis(200 + rng.random_range(0..800)));
        let sent = Instant::now();
        let answer = within(
            ctx.client(server)
                .claim(request(ctx.claim_request(n, &actor, wait), CALL_TIMEOUT)),
        )
        .await;
        let record = |answer| {
            ctx.history
                .record(&actor, Some(server), "Claim", &key, sent, answer)
        };
        let claim = match answer {
            Ok(claim) => claim,
            Err(status) => {
                record(error_answer(status.as_ref()));
                pause(&mut rng, 50, 250).await;
                continue;
            }
        };
        let entry = claim.entry.clone().unwrap_or_default();
        let seen = seen_of(&entry);
        match claim.outcome() {
            pb::Outcome::Claimed => {
                record(Answer::Claimed {
                    attempt: entry.attempt,
                    token: claim.claim_token.clone(),
                });
                carry_out(&ctx, &actor, &mut rng, &entry, &claim.claim_token, sent).await;
            }
            pb::Outcome::Replayed => {
                record(Answer::Replayed(seen));
                pause(&mut rng, 20, 100).await;
            }
            pb::Outcome::InProgress => {
                record(Answer::InProgress(seen));
                pause(&mut rng, 50, 250).await;
            }
            pb::Outcome::PreviouslyFailed => {
                record(Answer::PreviouslyFailed(seen));
                pause(&mut rng, 50, 250).await;
            }
            // No claim of the run asks for approval: an answer about one is wrong.
            pb::Outcome::Unspecified | pb::Outcome::AwaitingApproval | pb::Outcome::Denied => {
                record(Answer::Error {
                    code: Code::Ok,
                    reason: "OUTCOME_UNSPECIFIED".into(),
                    message: format!("{claim:?}"),
                });
            }
        }
    }
}

/// What a worker does with an attempt it claimed.
async fn carry_out(
    ctx: &Ctx,
    actor: &str,
    rng: &mut Rng,
    entry: &pb::Entry,
    token: &str,
    claim_sent: Instant,
) {
    let key = &entry.key;
    let fate = rng.random_range(0..100);
    let odds = ctx.odds;
    if fate < odds.crash_before {
        bump(&ctx.counts.crashed_before);
        ctx.history
            .did(actor, key, "crashed before acting".to_string());
        return;
    }
    if fate < odds.crash_before + odds.fail_before {
        bump(&ctx.counts.failed_before);
        let failure = pb::CompleteRequest {
            key: key.clone(),
            claim_token: token.to_string(),
            status: pb::Status::Failed.into(),
            error: "the upstream refused before acting".into(),
            retryable: true,
            ..Default::default()
        };
        complete(ctx, actor, rng, failure, claim_sent + ACT_WITHIN).await;
        return;
    }
    // A receipt of its own per attempt, with bytes of every value (NUL included).
    let mut receipt = format!("receipt {key} attempt {} ", entry.attempt).into_bytes();
    let extra = 1 + rng.random_range(0..300);
    receipt.extend((0..extra).map(|_| (rng.next_u64() & 0xff) as u8));
    // The time limit is checked in the same step as the act: checked before it, a worker
    // descheduled in between (a loaded machine) could act after its lease ended and a
    // reconciler had read "not found", which is the client breaking its rule, not the ledger.
    let acted = ctx.world.act_if(
        || claim_sent.elapsed() < ACT_WITHIN,
        || Effect {
            key: key.clone(),
            external_ref: entry.external_ref.clone(),
            attempt: entry.attempt,
            receipt: receipt.clone(),
            by: actor.to_string(),
            at: ctx.history.started.elapsed(),
        },
    );
    if !acted {
        bump(&ctx.counts.too_late);
        ctx.history
            .did(actor, key, "too late to act: left it".to_string());
        return;
    }
    ctx.history.did(
        actor,
        key,
        format!("acted on attempt {}: {}", entry.attempt, short(&receipt)),
    );
    if fate < odds.crash_before + odds.fail_before + odds.crash_after {
        bump(&ctx.counts.crashed_after);
        ctx.history
            .did(actor, key, "crashed after acting".to_string());
        return;
    }
    let success = pb::CompleteRequest {
        key: key.clone(),
        claim_token: token.to_string(),
        status: pb::Status::Succeeded.into(),
        result: receipt.into(),
        ..Default::default()
    };
    // A success may land late: it says what the world says, as a reconciler would.
    complete(ctx, actor, rng, success, claim_sent + LEASE + CALL_TIMEOUT).await;
}

/// Sends a Complete until it is answered (on any server), or `until` passes.
async fn complete(
    ctx: &Ctx,
    actor: &str,
    rng: &mut Rng,
    completion: pb::CompleteRequest,
    until: Instant,
) {
    let key = completion.key.clone();
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left < Duration::from_millis(100) {
            bump(&ctx.counts.gave_up_completing);
            ctx.history
                .did(actor, &key, "gave up completing".to_string());
            return;
        }
        let server = rng.random_range(0..ctx.clients.len());
        let sent = Instant::now();
        let answer = within(
            ctx.client(server)
                .complete(request(completion.clone(), left.min(CALL_TIMEOUT))),
        )
        .await;
        match answer {
            Ok(done) => {
                let entry = done
                    .entry
                    .as_ref()
                    .map(seen_of)
                    .unwrap_or_else(|| Seen::nothing(&key));
                ctx.history.record(
                    actor,
                    Some(server),
                    "Complete",
                    &key,
                    sent,
                    Answer::Completed {
                        entry,
                        already: done.already_completed,
                    },
                );
                return;
            }
            Err(status) => {
                let settled = status
                    .as_ref()
                    .is_some_and(|s| matches!(s.code(), Code::FailedPrecondition | Code::NotFound));
                ctx.history.record(
                    actor,
                    Some(server),
                    "Complete",
                    &key,
                    sent,
                    error_answer(status.as_ref()),
                );
                if settled {
                    return;
                }
                pause(rng, 100, 300).await;
            }
        }
    }
}

/// The Reconcile loop: hand out, ask the world, send the findings with the next call, each
/// fenced by the attempt and hold token it was handed out with. With `until_settled`, runs
/// until nothing was handed out for longer than a hold (and returns `true`), or 30 s pass
/// (`false`); else until the run stops.
///
/// The nemesis of findings: a quarter of the time a reconciler with findings in hand stalls
/// past its hold before it sends them (a pause, a slow read), and a finding whose call failed
/// is sent again later, however late. The entry may have been handed out again, or claimed
/// again, meanwhile: the fence, not the reconciler, must keep such a finding from settling
/// what it did not see.
async fn reconciler(ctx: Arc<Ctx>, actor: String, mut rng: Rng, until_settled: bool) -> bool {
    let began = Instant::now();
    let mut findings: Vec<pb::Resolution> = Vec::new();
    // Old findings about earlier attempts of entries this reconciler holds now.
    let mut late_mail: Vec<pb::Resolution> = Vec::new();
    let mut quiet_since: Option<Instant> = None;
    loop {
        if until_settled {
            if quiet_since.is_some_and(|q| q.elapsed() > HOLD + Duration::from_millis(300)) {
                return true;
            }
            if began.elapsed() > Duration::from_secs(30) {
                return false;
            }
        } else if ctx.stop.load(Ordering::SeqCst) {
            return true;
        }
        if !until_settled && !findings.is_empty() && rng.random_ratio(1, ctx.odds.stall) {
            bump(&ctx.counts.stalls);
            // Past the hold, and up to past the lease of an attempt claimed meanwhile.
            let stall = HOLD
                + Duration::from_millis(rng.random_range(100..LEASE.as_millis() as u64 + 2000));
            for f in &findings {
                ctx.history.did(
                    &actor,
                    &f.key,
                    format!(
                        "stalled {:.1}s with its finding about attempt {}, past its hold",
                        stall.as_secs_f64(),
                        f.attempt
                    ),
                );
            }
            tokio::time::sleep(stall).await;
        }
        let server = rng.random_range(0..ctx.clients.len());
        // The late mail goes first: a finding about an earlier attempt, delivered again while
        // a later attempt of its entry is unknown (a retried call whose first delivery went
        // through, a queue that redelivers). Without the fence it would settle that later
        // attempt as the earlier one was found.
        let mut resolutions: Vec<pb::Resolution> = std::mem::take(&mut late_mail);
        resolutions.extend(findings.iter().cloned());
        {
            let mut mailbag = lock(&ctx.mailbag);
            for f in &findings {
                mailbag.entry(f.key.clone()).or_default().push(f.clone());
            }
        }
        let keys = resolutions
            .iter()
            .map(|r| r.key.as_str())
            .collect::<Vec<_>>()
            .join(",");
        let sent = Instant::now();
        let answer = within(ctx.client(server).reconcile(request(
            pb::ReconcileRequest {
                limit: 10,
                resolutions,
                principal: actor.clone(),
                ..Default::default()
            },
            CALL_TIMEOUT,
        )))
        .await;
        match answer {
            Ok(out) => {
                // Only what a finding settled counts as acknowledged; the rest changed nothing.
                let mut applied = Vec::new();
                for result in &out.results {
                    match result.result() {
                        pb::ResolutionOutcome::ResolutionApplied => {
                            applied.extend(result.entry.iter().map(seen_of));
                        }
                        pb::ResolutionOutcome::ResolutionStale => bump(&ctx.counts.stale),
                        _ => {}
                    }
                }
                ctx.history.record(
                    &actor,
                    Some(server),
                    "Reconcile",
                    &keys,
                    sent,
                    Answer::Reconciled {
                        pending: out
                            .pending
                            .iter()
                            .map(|e| (e.key.clone(), e.attempt))
                            .collect(),
                        resolved: applied,
                    },
                );
                let settled = findings.is_empty() && out.pending.is_empty();
                findings.clear();
                for entry in &out.pending {
                    if !until_settled
                        && entry.attempt > 1
                        && rng.random_ratio(1, ctx.odds.late_mail)
                    {
                        let earlier: Vec<pb::Resolution> = lock(&ctx.mailbag)
                            .get(&entry.key)
                            .into_iter()
                            .flatten()
                            .filter(|f| f.attempt < entry.attempt)
                            .cloned()
                            .collect();
                        if let Some(old) = earlier.choose(&mut rng) {
                            bump(&ctx.counts.redelivered);
                            ctx.history.did(
                                &actor,
                                &entry.key,
                                format!(
                                    "delivers again its finding about attempt {} while attempt \
                                     {} is unknown",
                                    old.attempt, entry.attempt
                                ),
                            );
                            late_mail.push(old.clone());
                        }
                    }
                    let resolution = match ctx.world.did_it_happen(&entry.external_ref) {
                        Some(receipt) => {
                            bump(&ctx.counts.found);
                            pb::Resolution {
                                key: entry.key.clone(),
                                status: pb::Status::Succeeded.into(),
                                result: receipt.into(),
                                attempt: entry.attempt,
                                hold_token: entry.hold_token.clone(),
                                ..Default::default()
                            }
                        }
                        None => {
                            bump(&ctx.counts.not_found);
                            pb::Resolution {
                                key: entry.key.clone(),
                                status: pb::Status::Failed.into(),
                                error: "not found in the world".into(),
                                retryable: true,
                                attempt: entry.attempt,
                                hold_token: entry.hold_token.clone(),
                                ..Default::default()
                            }
                        }
                    };
                    ctx.history.did(
                        &actor,
                        &entry.key,
                        format!(
                            "asked the world about attempt {} ({}): {}",
                            entry.attempt,
                            entry.external_ref,
                            if resolution.status() == pb::Status::Succeeded {
                                "found"
                            } else {
                                "not found"
                            }
                        ),
                    );
                    findings.push(resolution);
                }
                quiet_since = match (settled, quiet_since) {
                    (true, Some(q)) => Some(q),
                    (true, None) => Some(Instant::now()),
                    (false, _) => None,
                };
            }
            Err(status) => {
                // The findings are sent again with the next call, however late.
                ctx.history.record(
                    &actor,
                    Some(server),
                    "Reconcile",
                    &keys,
                    sent,
                    error_answer(status.as_ref()),
                );
                quiet_since = None;
            }
        }
        pause(&mut rng, 150, if until_settled { 300 } else { 600 }).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The servers and the nemesis

/// The server processes of a run, with the logs of every process started, killed ones too.
struct Fleet {
    /// Each server's database URL (through its own proxy on PostgreSQL).
    urls: Vec<String>,
    /// Each server's port, kept across restarts so that clients find it again.
    ports: Vec<u16>,
    servers: Vec<ServerProcess>,
    logs: Vec<(String, Arc<Mutex<String>>)>,
}

/// A short hold, and no reconcile grace: a worker acts only within [`ACT_WITHIN`] of its
/// Claim, well before its lease ends, so nothing is still landing when a reconciler asks.
fn server_flags() -> [&'static str; 6] {
    [
        "--db-acquire-timeout",
        "2s",
        "--reconcile-lease",
        HOLD_FLAG,
        "--reconcile-grace",
        "0s",
    ]
}

impl Fleet {
    async fn start(urls: Vec<String>) -> Fleet {
        let mut fleet = Fleet {
            ports: Vec::new(),
            servers: Vec::new(),
            logs: Vec::new(),
            urls,
        };
        for i in 0..fleet.urls.len() {
            let server = ServerProcess::start(&fleet.urls[i], &server_flags()).await;
            fleet.ports.push(server.addr.port());
            fleet.keep_log(i, &server);
            fleet.servers.push(server);
        }
        fleet
    }

    fn keep_log(&mut self, i: usize, server: &ServerProcess) {
        // The start-up lines go first, so that what follows reads in order.
        lock(&server.log).insert_str(0, &server.startup_log);
        let name = format!("server {i} (start {})", self.logs.len() + 1);
        self.logs.push((name, server.log.clone()));
    }

    fn addrs(&self) -> Vec<SocketAddr> {
        self.servers.iter().map(|s| s.addr).collect()
    }

    async fn kill(&mut self, i: usize) {
        let child = &mut self.servers[i].child;
        assert!(
            child.try_wait().expect("try_wait").is_none(),
            "server {i} exited before the nemesis killed it"
        );
        child.start_kill().expect("SIGKILL");
        tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .expect("a killed server is gone within 10 s")
            .expect("wait");
    }

    async fn restart(&mut self, i: usize) {
        let server = ServerProcess::start_on(&self.urls[i], self.ports[i], &server_flags()).await;
        self.keep_log(i, &server);
        self.servers[i] = server;
    }

    /// Every line of every server's log that contains one of `needles`.
    fn lines_with(&self, needles: &[&str]) -> Vec<String> {
        let mut lines = Vec::new();
        for (name, log) in &self.logs {
            for line in lock(log).lines() {
                if needles.iter().any(|n| line.contains(n)) {
                    lines.push(format!("{name}: {}", crate::support::plain(line)));
                }
            }
        }
        lines
    }
}

/// What the nemesis can do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    KillServer,
    RestartPostgres,
    ResetLinks,
    CutMidMessage,
    CutAtCommit,
    Partition,
}

/// PostgreSQL and the proxies to it, when the run has them.
struct Postgres {
    cluster: Arc<PgCluster>,
    proxies: Vec<Proxy>,
}

/// Faults, one at a time, until `load` has passed since `started` and the run did `enough`
/// to be judged (a loaded machine does less in the same time), or [`MAX_LOAD_FACTOR`] times
/// `load` passed; returns how many of each.
async fn nemesis(
    fleet: &mut Fleet,
    postgres: Option<&Postgres>,
    rng: &mut Rng,
    started: Instant,
    load: Duration,
    every: (u64, u64),
    enough: impl Fn(&BTreeMap<Fault, u32>) -> bool,
) -> BTreeMap<Fault, u32> {
    let kinds: Vec<Fault> = if postgres.is_some() {
        vec![
            Fault::KillServer,
            Fault::RestartPostgres,
            Fault::ResetLinks,
            Fault::CutMidMessage,
            Fault::CutAtCommit,
            Fault::Partition,
        ]
    } else {
        vec![Fault::KillServer]
    };
    let mut done: BTreeMap<Fault, u32> = BTreeMap::new();
    let mut cycle = Vec::new();
    loop {
        pause(rng, every.0, every.1).await;
        let loaded = started.elapsed();
        if loaded >= load && (loaded >= load * MAX_LOAD_FACTOR || enough(&done)) {
            break;
        }
        if cycle.is_empty() {
            cycle = kinds.clone();
            cycle.shuffle(rng);
        }
        let fault = cycle.pop().expect("a fault");
        let i = rng.random_range(0..fleet.servers.len());
        let proxy = postgres.map(|p| &p.proxies[i]);
        match fault {
            Fault::KillServer => {
                fleet.kill(i).await;
                pause(rng, 200, 800).await;
                fleet.restart(i).await;
            }
            Fault::RestartPostgres => {
                let cluster = postgres.expect("postgres").cluster.clone();
                tokio::task::spawn_blocking(move || cluster.stop(StopMode::Immediate))
                    .await
                    .expect("pg_ctl stop -m immediate");
                pause(rng, 100, 600).await;
                let cluster = postgres.expect("postgres").cluster.clone();
                tokio::task::spawn_blocking(move || cluster.restart())
                    .await
                    .expect("pg_ctl start");
            }
            Fault::ResetLinks => {
                for p in &postgres.expect("postgres").proxies {
                    p.reset_all();
                }
            }
            Fault::CutMidMessage => proxy
                .expect("a proxy")
                .cut_after_server_bytes(rng.random_range(0..4000)),
            Fault::CutAtCommit => proxy
                .expect("a proxy")
                .cut_writes_at_commit(1 + rng.random_range(0..2)),
            Fault::Partition => {
                let proxy = proxy.expect("a proxy");
                proxy.blackhole(true);
                pause(rng, 300, 1200).await;
                proxy.blackhole(false);
            }
        }
        *done.entry(fault).or_default() += 1;
    }
    if let Some(postgres) = postgres {
        for proxy in &postgres.proxies {
            proxy.clear();
        }
    }
    done
}

// ---------------------------------------------------------------------------------------------
// A run

/// How a run goes.
struct Plan {
    store: &'static str,
    workers: usize,
    reconcilers: usize,
    /// How often clients fail, and how often findings come late.
    odds: Odds,
}

/// The clients' odds, in percent (fates) and one-in-N (the rest).
#[derive(Clone, Copy, Debug)]
struct Odds {
    /// Of the attempts a worker claims: crash before acting, fail before acting (FAILED
    /// retryable), crash after acting; the rest complete SUCCEEDED.
    crash_before: u32,
    fail_before: u32,
    crash_after: u32,
    /// One claim in N is a straggler's (an intent of 2 to 10 s ago).
    straggler: u32,
    /// A reconciler with findings in hand stalls past its hold one time in N.
    stall: u32,
    /// Handed a later attempt of an entry it has an older finding about, a reconciler sends
    /// that old finding along one time in N.
    late_mail: u32,
    /// The pause between two faults, from and to, in milliseconds.
    fault_every: (u64, u64),
}

impl Odds {
    /// The mix of the faults runs: most attempts complete; findings come late now and then.
    const MIXED: Odds = Odds {
        crash_before: 10,
        fail_before: 10,
        crash_after: 12,
        straggler: 5,
        stall: 4,
        late_mail: 2,
        fault_every: (600, 1800),
    };

    /// The late-findings run: most attempts end unknown, a straggler claims them again once
    /// settled, and every old finding that can come late does.
    const LATE: Odds = Odds {
        crash_before: 30,
        fail_before: 5,
        crash_after: 35,
        straggler: 2,
        stall: 2,
        late_mail: 1,
        // Fewer outages, so that attempts get claimed, settled and claimed again.
        fault_every: (2000, 3500),
    };
}

/// `HISTORY_SEED`, or the clock.
fn seed() -> u64 {
    std::env::var("HISTORY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        })
}

/// `HISTORY_SECONDS`, or 12 s.
fn load_duration() -> Duration {
    std::env::var("HISTORY_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(Duration::from_secs(12), Duration::from_secs_f64)
}

fn rerun(store: &str, seed: u64) -> String {
    format!(
        "history[{store}] seed={seed}; to re-run it: HISTORY_SEED={seed} cargo nextest run \
         --test api -E 'test(/^history::/)'"
    )
}

/// Runs the load and the nemesis on `fleet`, then the final pass and the check; panics with
/// the seed and what was found.
async fn run(plan: Plan, seed: u64, mut fleet: Fleet, postgres: Option<Postgres>) {
    let began = Instant::now();
    let load = load_duration();
    let mut rng = Rng::seed_from_u64(seed);
    let clients = fleet
        .addrs()
        .iter()
        .map(|addr| {
            let channel = Endpoint::from_shared(format!("http://{addr}"))
                .expect("uri")
                .connect_timeout(Duration::from_secs(1))
                .connect_lazy();
            LedgerServiceClient::new(channel)
        })
        .collect();
    let ctx = Arc::new(Ctx {
        store: plan.store,
        seed,
        clients,
        world: World::default(),
        history: History::new(),
        stop: AtomicBool::new(false),
        counts: Counts::default(),
        odds: plan.odds,
        mailbag: Mutex::default(),
    });
    let workers: Vec<_> = (0..plan.workers)
        .map(|i| tokio::spawn(worker(ctx.clone(), i, Rng::seed_from_u64(rng.next_u64()))))
        .collect();
    let reconcilers: Vec<_> = (0..plan.reconcilers)
        .map(|i| {
            tokio::spawn(reconciler(
                ctx.clone(),
                format!("r{i}"),
                Rng::seed_from_u64(rng.next_u64()),
                false,
            ))
        })
        .collect();

    let faults = nemesis(
        &mut fleet,
        postgres.as_ref(),
        &mut rng,
        ctx.history.started,
        load,
        plan.odds.fault_every,
        |faults| enough_to_judge(&ctx, faults),
    )
    .await;
    ctx.stop.store(true, Ordering::SeqCst);
    let clients_stopped = async {
        for worker in workers {
            worker.await.expect("worker");
        }
        for reconciler in reconcilers {
            reconciler.await.expect("reconciler");
        }
    };
    tokio::time::timeout(Duration::from_secs(30), clients_stopped)
        .await
        .expect("every client stops within 30 s of the end of the load");
    let loaded = ctx.history.started.elapsed();

    // Every lease and every hold ends; then one reconciler settles what is left.
    tokio::time::sleep(LEASE.max(HOLD) + Duration::from_millis(500)).await;
    let settled = reconciler(
        ctx.clone(),
        "final".into(),
        Rng::seed_from_u64(rng.next_u64()),
        true,
    )
    .await;
    let finals = final_state(&ctx).await;
    let report = check(&ctx, &fleet, &faults, &finals, settled);
    let summary = report.summary(&ctx, &faults, loaded, began.elapsed());
    eprintln!("{summary}");
    assert!(
        report.problems.is_empty(),
        "{}\n{summary}\n{} problems:\n{}\n{}",
        rerun(ctx.store, ctx.seed),
        report.problems.len(),
        report.problems.join("\n"),
        report.evidence
    );
    if let Some(postgres) = postgres {
        drop(fleet);
        tokio::task::spawn_blocking(move || drop(postgres))
            .await
            .expect("stop the cluster");
    }
}

/// Looks up every key the history names, and claims again each that succeeded.
async fn final_state(ctx: &Ctx) -> Finals {
    let keys: BTreeSet<String> = ctx
        .history
        .ops()
        .into_iter()
        .filter(|op| op.call == "Claim")
        .map(|op| op.key)
        .collect();
    let mut entries = BTreeMap::new();
    let mut claims = BTreeMap::new();
    for key in keys {
        let n: u64 = key
            .trim_start_matches("intent-")
            .parse()
            .expect("an intent key");
        let looked = until_answered(|| {
            let mut client = ctx.client(0);
            let lookup = pb::LookupRequest {
                key: key.clone(),
                ..Default::default()
            };
            async move { client.lookup(request(lookup, CALL_TIMEOUT)).await }
        })
        .await;
        let seen = match looked {
            Ok(found) => found.entry.as_ref().map(seen_of),
            Err(status) if status.code() == Code::NotFound => None,
            Err(status) => panic!(
                "{}: Lookup of {key} failed after the faults: {status:?}",
                rerun(ctx.store, ctx.seed)
            ),
        };
        ctx.history.record(
            "check",
            Some(0),
            "Lookup",
            &key,
            Instant::now(),
            Answer::Looked(seen.clone()),
        );
        if seen
            .as_ref()
            .is_some_and(|s| s.status == EntryStatus::Succeeded)
        {
            let answer = match until_answered(|| {
                let mut client = ctx.client(0);
                let claim = ctx.claim_request(n, "check", None);
                async move { client.claim(request(claim, CALL_TIMEOUT)).await }
            })
            .await
            {
                Ok(claim) if claim.outcome() == pb::Outcome::Replayed => {
                    Answer::Replayed(seen_of(&claim.entry.unwrap_or_default()))
                }
                Ok(claim) => Answer::Error {
                    code: Code::Ok,
                    reason: format!("{:?}", claim.outcome()),
                    message: format!("{claim:?}"),
                },
                Err(status) => error_answer(Some(&status)),
            };
            claims.insert(key.clone(), answer);
        }
        entries.insert(key, seen);
    }
    Finals { entries, claims }
}

/// Retries a call on UNAVAILABLE or no answer for up to 20 s (the faults are over, but a
/// restarted server may still be warming up).
async fn until_answered<T, F>(mut call: impl FnMut() -> F) -> Result<T, Status>
where
    F: Future<Output = Result<tonic::Response<T>, Status>>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match within(call()).await {
            Ok(answer) => return Ok(answer),
            Err(Some(status))
                if status.code() != Code::Unavailable || Instant::now() >= deadline =>
            {
                return Err(status);
            }
            Err(None) if Instant::now() >= deadline => {
                return Err(Status::deadline_exceeded("no answer within 20 s"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The check

/// What the run has not done yet that it must to be judged, one line each (nothing when it
/// has): floors on the claims answered and claimed, the effects, the calls the faults failed,
/// the faults themselves, and in the late-findings run the late findings answered stale. A
/// loaded machine does less in the same time: the load goes on until these are met (see
/// [`enough_to_judge`]) rather than the run failing them, so a floor that is still not met at
/// the end means the run did too little whatever the machine.
fn too_little(
    figures: &Figures,
    faults: &BTreeMap<Fault, u32>,
    odds: Odds,
    redelivered: u64,
    stale: u64,
) -> Vec<String> {
    let mut problems = Vec::new();
    let claimed = figures.outcomes.get("CLAIMED").copied().unwrap_or(0);
    let answered_claims = figures.outcomes.values().sum::<u64>();
    if answered_claims < 50 || claimed < 10 || figures.effects < 10 {
        problems.push(format!(
            "too little happened to judge: {answered_claims} claims answered, {claimed} \
             claimed, {} effects",
            figures.effects
        ));
    }
    if figures.errors.values().sum::<u64>() == 0 {
        problems.push("no call failed: the faults hit nothing".to_string());
    }
    if faults.values().sum::<u32>() < if odds.late_mail == 1 { 2 } else { 3 } {
        problems.push(format!("only {faults:?} faults were injected"));
    }
    // The late-findings run must have sent late findings, and seen them refused.
    if odds.late_mail == 1 && stale < 2 {
        problems.push(format!(
            "too few late findings to judge: {redelivered} delivered again, {stale} answered \
             stale"
        ));
    }
    problems
}

/// Whether the run so far has done what [`too_little`] asks: the history and the world as
/// they stand, tallied by the check (no key judged yet).
fn enough_to_judge(ctx: &Ctx, faults: &BTreeMap<Fault, u32>) -> bool {
    let figures =
        testkit::history::check(&ctx.history.ops(), &ctx.world.effects(), &Finals::default())
            .figures;
    too_little(
        &figures,
        faults,
        ctx.odds,
        ctx.counts.redelivered.load(Ordering::Relaxed),
        ctx.counts.stale.load(Ordering::Relaxed),
    )
    .is_empty()
}

struct Report {
    problems: Vec<String>,
    /// The history of the keys with problems, and the server log lines that explain them.
    evidence: String,
    figures: Figures,
}

impl Report {
    fn summary(
        &self,
        ctx: &Ctx,
        faults: &BTreeMap<Fault, u32>,
        loaded: Duration,
        took: Duration,
    ) -> String {
        let f = &self.figures;
        let c = &ctx.counts;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "history[{}] seed={} load={:.1}s took={:.1}s calls={:?} outcomes={:?} keys={} \
             effects={} acknowledged={} replays={} crashed_before={} failed_before={} \
             crashed_after={} too_late={} gave_up_completing={} world_found={} \
             world_not_found={} stalls={} redelivered={} stale_findings={} errors={:?} faults={:?} problems={}",
            ctx.store,
            ctx.seed,
            loaded.as_secs_f64(),
            took.as_secs_f64(),
            f.calls,
            f.outcomes,
            f.keys,
            f.effects,
            f.acknowledged,
            f.replays,
            n(&c.crashed_before),
            n(&c.failed_before),
            n(&c.crashed_after),
            n(&c.too_late),
            n(&c.gave_up_completing),
            n(&c.found),
            n(&c.not_found),
            n(&c.stalls),
            n(&c.redelivered),
            n(&c.stale),
            f.errors,
            faults,
            self.problems.len(),
        )
    }
}

/// The history's check (testkit::history::check), then what this run must also show: a final
/// reconcile pass that settled, no server that panicked, floors on what happened and on the
/// faults, and in the late-findings run, late findings answered stale.
fn check(
    ctx: &Ctx,
    fleet: &Fleet,
    faults: &BTreeMap<Fault, u32>,
    finals: &Finals,
    settled: bool,
) -> Report {
    let ops = ctx.history.ops();
    let effects = ctx.world.effects();
    let mut problems = Vec::new();
    if !settled {
        problems.push("the final reconcile pass did not settle within 30 s".to_string());
    }
    let verdict = testkit::history::check(&ops, &effects, finals);
    problems.extend(verdict.problems);
    for line in fleet.lines_with(&["panicked"]) {
        problems.push(format!("a server panicked: {line}"));
    }
    let figures = verdict.figures;

    problems.extend(too_little(
        &figures,
        faults,
        ctx.odds,
        ctx.counts.redelivered.load(Ordering::Relaxed),
        ctx.counts.stale.load(Ordering::Relaxed),
    ));

    let mut evidence = testkit::history::evidence(&ops, &effects, &verdict.suspects);
    let internal = fleet.lines_with(&["ERROR", "internal"]);
    if !internal.is_empty() {
        let _ = writeln!(evidence, "--- server log lines with ERROR or internal ---");
        for line in internal.iter().take(20) {
            let _ = writeln!(evidence, "{line}");
        }
    }
    Report {
        problems,
        evidence,
        figures,
    }
}

// ---------------------------------------------------------------------------------------------
// The two stores

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_servers_on_postgres_keep_each_intent_to_one_effect_under_faults() {
    let seed = seed();
    eprintln!("{}", rerun("postgres", seed));
    let bounded = tokio::time::timeout(BUDGET, async move {
        let cluster = Arc::new(
            tokio::task::spawn_blocking(PgCluster::start)
                .await
                .expect("start a cluster"),
        );
        let db_url = {
            let cluster = cluster.clone();
            tokio::task::spawn_blocking(move || cluster.create_database())
                .await
                .expect("create a database")
        };
        let upstream: SocketAddr = format!("127.0.0.1:{}", cluster.port())
            .parse()
            .expect("addr");
        let mut proxies = Vec::new();
        for _ in 0..3 {
            proxies.push(Proxy::start(upstream).await);
        }
        let urls = proxies.iter().map(|p| p.url_for(&db_url)).collect();
        let fleet = Fleet::start(urls).await;
        run(
            Plan {
                store: "postgres",
                workers: 12,
                reconcilers: 2,
                odds: Odds::MIXED,
            },
            seed,
            fleet,
            Some(Postgres { cluster, proxies }),
        )
        .await;
    })
    .await;
    assert!(
        bounded.is_ok(),
        "{}: the run took longer than {BUDGET:?}",
        rerun("postgres", seed)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_server_on_sqlite_keeps_each_intent_to_one_effect_under_kills() {
    let seed = seed();
    eprintln!("{}", rerun("sqlite", seed));
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let bounded = tokio::time::timeout(BUDGET, async move {
        let fleet = Fleet::start(vec![url]).await;
        run(
            Plan {
                store: "sqlite",
                workers: 12,
                reconcilers: 2,
                odds: Odds::MIXED,
            },
            seed,
            fleet,
            None,
        )
        .await;
    })
    .await;
    assert!(
        bounded.is_ok(),
        "{}: the run took longer than {BUDGET:?}",
        rerun("sqlite", seed)
    );
}

/// The late-findings run, on SQLite: most attempts end unknown, stragglers claim them again
/// once settled, reconcilers stall past their holds and send old findings again whenever they
/// are handed a later attempt of the same entry. Without the fence a late "not found" about
/// attempt 1 settles an unknown attempt 2 (which acted) as not done, and attempt 3 acts again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn late_findings_never_settle_an_attempt_they_did_not_see() {
    let seed = seed();
    eprintln!("{}", rerun("sqlite-late", seed));
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
    let bounded = tokio::time::timeout(BUDGET, async move {
        let fleet = Fleet::start(vec![url]).await;
        run(
            Plan {
                store: "sqlite-late",
                workers: 12,
                reconcilers: 3,
                odds: Odds::LATE,
            },
            seed,
            fleet,
            None,
        )
        .await;
    })
    .await;
    assert!(
        bounded.is_ok(),
        "{}: the run took longer than {BUDGET:?}",
        rerun("sqlite-late", seed)
    );
}
