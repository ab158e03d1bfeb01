//! What the ledger did, as Prometheus metrics on the optional text endpoint
//! (`--metrics-listen`, `GET /metrics`, text format 0.0.4), and the replay-rate alarm.
//!
//! A hand-written registry of atomics: the families are fixed, so a metrics crate would add a
//! dependency and a global registry (tests run many servers in one process) for no gain.
//!
//! - The conventional gRPC server families (`grpc_server_started_total`,
//!   `grpc_server_handled_total`, `grpc_server_handling_seconds`) for the ledger service,
//!   counted by [`GrpcMetricsLayer`] around the service, so that calls refused before a handler
//!   runs (authentication, not yet migrated, undecodable messages) are counted too.
//! - The ledger's own families, counted by the handlers: claims by outcome and tool, replays,
//!   key-reuse refusals, stale claim tokens, completions, reconcile resolutions, pruned
//!   entries, store errors; and gauges refreshed from the store by [`refresh_loop`]: unresolved
//!   entries (the store's figure, so every server sharing it reports the same) and pool use.
//! - The replay-rate alarm ([`ReplayWindow`]): the replay ratio over a sliding window, and a
//!   gauge that turns 1 when the window has traffic and no replay at all, which usually means
//!   callers regenerate keys on retry and the ledger deduplicates nothing.
//!
//! Labels are bounded: methods, codes and outcomes are enums; tool names fold into `other`
//! beyond `--metrics-max-tools`; keys, runs, tenants and their tokens are never labels.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::domain::Micros;
use crate::domain::time::Clock;
use crate::error::{LedgerError, code_name};
use crate::ledger::{ClaimOutput, CompleteOutput, Outcome};
use crate::storage::{PoolStats, Store, StoreError, UnresolvedCount};

/// How many gRPC codes there are (0 = OK .. 16 = UNAUTHENTICATED): one counter each.
const CODE_COUNT: usize = 17;

/// The RPCs counted, in the order of [`Rpc`].
const RPCS: [&str; 6] = [
    "Claim",
    "Complete",
    "Lookup",
    "Reconcile",
    "ListEntries",
    "RenewLease",
];

/// The service the gRPC families describe.
const SERVICE: &str = "idempotency.v1.LedgerService";

/// Upper bounds of the handling-time histogram, in seconds: from a replay served from cache
/// (well under a millisecond) to a claim that waited its longest (`--max-wait`, 30 s).
const BUCKETS: [f64; 15] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Claim outcomes, in the order of [`Outcome`], as label values.
const OUTCOMES: [&str; 4] = ["claimed", "replayed", "in_progress", "previously_failed"];

/// Completion statuses as label values: the three a claimant reports, and a repeat of an
/// identical Complete.
const COMPLETIONS: [&str; 4] = ["succeeded", "failed", "unknown", "already_completed"];

/// The label value tool names fold into beyond `--metrics-max-tools`.
const OTHER_TOOL: &str = "other";

/// How many slices the replay window is cut into: it slides by 1/60 of its length.
const WINDOW_SLICES: usize = 60;

/// One of the ledger's RPCs.
#[derive(Clone, Copy, Debug)]
pub enum Rpc {
    /// `Claim`.
    Claim = 0,
    /// `Complete`.
    Complete = 1,
    /// `Lookup`.
    Lookup = 2,
    /// `Reconcile`.
    Reconcile = 3,
    /// `ListEntries`.
    ListEntries = 4,
    /// `RenewLease`.
    RenewLease = 5,
}

impl Rpc {
    /// The RPC a request path (`/idempotency.v1.LedgerService/Claim`) names, if any.
    fn from_path(path: &str) -> Option<Rpc> {
        let method = path
            .strip_prefix('/')?
            .strip_prefix(SERVICE)?
            .strip_prefix('/')?;
        Some(match method {
            "Claim" => Rpc::Claim,
            "Complete" => Rpc::Complete,
            "Lookup" => Rpc::Lookup,
            "Reconcile" => Rpc::Reconcile,
            "ListEntries" => Rpc::ListEntries,
            "RenewLease" => Rpc::RenewLease,
            _ => return None,
        })
    }
}

/// What the metrics are configured with (`--metrics-*`, `--replay-alarm-*`).
#[derive(Clone, Debug)]
pub struct MetricsOptions {
    /// Distinct tool names that get their own label value; later ones count as `other`.
    pub max_tools: usize,
    /// The replay-rate window.
    pub alarm_window: Duration,
    /// Claims the window must hold before zero replays raise the alarm (0: never).
    pub alarm_min_claims: u64,
}

impl Default for MetricsOptions {
    fn default() -> Self {
        MetricsOptions {
            max_tools: 50,
            alarm_window: Duration::from_secs(15 * 60),
            alarm_min_claims: 100,
        }
    }
}

/// A cumulative histogram of durations, with fixed [`BUCKETS`].
#[derive(Debug, Default)]
struct Histogram {
    /// Observations per bucket (not cumulative; the last is above every bound).
    counts: [AtomicU64; BUCKETS.len() + 1],
    /// Sum of the observations, in nanoseconds.
    sum_nanos: AtomicU64,
}

impl Histogram {
    fn observe(&self, d: Duration) {
        let seconds = d.as_secs_f64();
        let i = BUCKETS
            .iter()
            .position(|&le| seconds <= le)
            .unwrap_or(BUCKETS.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (i, n) in self.counts.iter().enumerate() {
            cumulative += n.load(Ordering::Relaxed);
            let le = BUCKETS
                .get(i)
                .map_or_else(|| "+Inf".to_string(), f64::to_string);
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
        }
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
        let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
    }
}

/// The gRPC families of one method.
#[derive(Debug, Default)]
struct MethodStats {
    /// Calls received.
    started: AtomicU64,
    /// Calls answered, by code.
    handled: [AtomicU64; CODE_COUNT],
    /// Time from the request to the response headers (for a unary call, the handler's time).
    seconds: Histogram,
}

/// Counters kept per tool label value.
#[derive(Debug, Default)]
struct ToolStats {
    /// Claims answered, by [`OUTCOMES`].
    claims: [AtomicU64; 4],
    /// Explicit keys refused for a different request.
    key_reused: AtomicU64,
}

/// Tool names to their counters; at most `max` names, then everything else is `other`.
#[derive(Debug)]
struct Tools {
    max: usize,
    named: RwLock<HashMap<String, Arc<ToolStats>>>,
    other: Arc<ToolStats>,
}

impl Tools {
    fn get(&self, tool: &str) -> Arc<ToolStats> {
        // A poisoned lock only means a panic elsewhere mid-insert; the map is still usable.
        if let Some(stats) = self
            .named
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(tool)
        {
            return stats.clone();
        }
        let mut named = self
            .named
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(stats) = named.get(tool) {
            return stats.clone();
        }
        if named.len() >= self.max || tool == OTHER_TOOL {
            return self.other.clone();
        }
        let stats = Arc::new(ToolStats::default());
        named.insert(tool.to_string(), stats.clone());
        stats
    }

    /// Every label value and its counters, sorted by name, `other` last.
    fn snapshot(&self) -> Vec<(String, Arc<ToolStats>)> {
        let mut all: Vec<_> = self
            .named
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all.push((OTHER_TOOL.to_string(), self.other.clone()));
        all
    }
}

/// Claims and replays over a sliding window of the clock's time, cut into
/// [`WINDOW_SLICES`] slices: the window holds the current slice and the ones before it.
#[derive(Debug)]
pub struct ReplayWindow {
    /// Length of one slice, in microseconds (at least 1).
    slice: i64,
    /// Ring of (slice number, claims, replays).
    slices: [(i64, u64, u64); WINDOW_SLICES],
    /// When the alarm's warning was last logged; `None` while the alarm is off.
    warned_at: Option<Micros>,
}

/// What the replay window holds now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowTotals {
    /// Claims answered in the window (every outcome).
    pub claims: u64,
    /// Of them, replays.
    pub replays: u64,
}

impl WindowTotals {
    /// Replays per claim answered; 0 with no claim.
    pub fn ratio(self) -> f64 {
        if self.claims == 0 {
            0.0
        } else {
            self.replays as f64 / self.claims as f64
        }
    }
}

impl ReplayWindow {
    /// An empty window of `length`.
    pub fn new(length: Duration) -> ReplayWindow {
        let slice = (Micros::from_duration(length).0 / WINDOW_SLICES as i64).max(1);
        ReplayWindow {
            slice,
            slices: [(i64::MIN, 0, 0); WINDOW_SLICES],
            warned_at: None,
        }
    }

    fn length(&self) -> Micros {
        Micros(self.slice * WINDOW_SLICES as i64)
    }

    /// Counts a claim answered at `now`.
    pub fn record(&mut self, now: Micros, replayed: bool) {
        let n = now.0.div_euclid(self.slice);
        let slot = &mut self.slices[n.rem_euclid(WINDOW_SLICES as i64) as usize];
        if slot.0 != n {
            *slot = (n, 0, 0);
        }
        slot.1 += 1;
        slot.2 += u64::from(replayed);
    }

    /// The claims and replays in the window that ends at `now`.
    pub fn totals(&self, now: Micros) -> WindowTotals {
        let n = now.0.div_euclid(self.slice);
        let first = n - WINDOW_SLICES as i64 + 1;
        self.slices
            .iter()
            .filter(|s| (first..=n).contains(&s.0))
            .fold(WindowTotals::default(), |t, s| WindowTotals {
                claims: t.claims + s.1,
                replays: t.replays + s.2,
            })
    }
}

/// The ledger's metrics; cheap to share, updated with relaxed atomics.
pub struct Metrics {
    /// The ledger's clock: the replay window slides on it (tests move it by hand).
    clock: Arc<dyn Clock>,
    /// Claims needed in the window before zero replays raise the alarm; 0 turns it off.
    alarm_min_claims: u64,
    /// The gRPC families, by [`Rpc`].
    methods: [MethodStats; RPCS.len()],
    /// Claims and key-reuse refusals, by tool.
    tools: Tools,
    /// Completes refused for a stale or wrong claim token.
    stale_tokens: AtomicU64,
    /// Completes that recorded an outcome, by [`COMPLETIONS`].
    completions: [AtomicU64; 4],
    /// Reconcile resolutions received in calls that succeeded, by reported status
    /// (succeeded, failed).
    resolutions: [AtomicU64; 2],
    /// Expired entries deleted.
    pruned: AtomicU64,
    /// Store errors: unavailable, internal.
    store_errors: [AtomicU64; StoreError::KINDS.len()],
    /// Whether the last health probe reached the store.
    store_up: AtomicBool,
    /// The last store-wide count of unresolved entries (unknown, attempting); -1 before the
    /// first read, so a scrape never reports a zero nobody measured.
    unresolved: [AtomicI64; 2],
    /// The last pool snapshot: in use, idle, max.
    pool: [AtomicU64; 3],
    /// The replay-rate window.
    window: Mutex<ReplayWindow>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// New metrics, all zero, whose replay window slides on `clock`.
    pub fn new(clock: Arc<dyn Clock>, options: &MetricsOptions) -> Arc<Metrics> {
        Arc::new(Metrics {
            clock,
            alarm_min_claims: options.alarm_min_claims,
            methods: Default::default(),
            tools: Tools {
                max: options.max_tools,
                named: RwLock::default(),
                other: Arc::default(),
            },
            stale_tokens: AtomicU64::new(0),
            completions: Default::default(),
            resolutions: Default::default(),
            pruned: AtomicU64::new(0),
            store_errors: Default::default(),
            store_up: AtomicBool::new(false),
            unresolved: [AtomicI64::new(-1), AtomicI64::new(-1)],
            pool: Default::default(),
            window: Mutex::new(ReplayWindow::new(options.alarm_window)),
        })
    }

    /// Counts a Claim's result for `tool` (the request's): its outcome, or a key-reuse refusal.
    /// Other errors concern no claim answered and are left to the gRPC families.
    pub fn claim(&self, tool: &str, result: &Result<ClaimOutput, LedgerError>) {
        match result {
            Ok(out) => {
                let i = match out.outcome {
                    Outcome::Claimed => 0,
                    Outcome::Replayed => 1,
                    Outcome::InProgress => 2,
                    Outcome::PreviouslyFailed => 3,
                };
                self.tools.get(tool).claims[i].fetch_add(1, Ordering::Relaxed);
                self.lock_window()
                    .record(self.clock.now(), out.outcome == Outcome::Replayed);
            }
            Err(LedgerError::KeyReused) => {
                self.tools
                    .get(tool)
                    .key_reused
                    .fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {}
        }
    }

    /// Counts a Complete's result: the status it recorded, a repeat, or a stale token.
    pub fn complete(
        &self,
        status: crate::domain::FinalStatus,
        result: &Result<CompleteOutput, LedgerError>,
    ) {
        use crate::domain::FinalStatus;
        match result {
            Ok(out) => {
                let i = match (out.already_completed, status) {
                    (true, _) => 3,
                    (false, FinalStatus::Succeeded) => 0,
                    (false, FinalStatus::Failed) => 1,
                    (false, FinalStatus::Unknown) => 2,
                };
                self.completions[i].fetch_add(1, Ordering::Relaxed);
            }
            Err(LedgerError::StaleClaimToken) => {
                self.stale_tokens.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {}
        }
    }

    /// Counts the resolutions of a Reconcile call that succeeded, by the status each reported.
    pub fn resolutions(&self, statuses: impl IntoIterator<Item = crate::domain::FinalStatus>) {
        for status in statuses {
            let i = usize::from(status != crate::domain::FinalStatus::Succeeded);
            self.resolutions[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts expired entries deleted.
    pub fn pruned(&self, n: u64) {
        self.pruned.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts a store error by its kind.
    pub fn store_error(&self, error: &StoreError) {
        let kind = error.kind();
        if let Some(i) = StoreError::KINDS.iter().position(|k| *k == kind) {
            self.store_errors[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a call's error when it is the store's (by the store's kind), or a bug of the
    /// server's own (as `internal`).
    pub fn call_failed(&self, error: &LedgerError) {
        match error {
            LedgerError::Store(e) => self.store_error(e),
            LedgerError::Internal(_) => {
                // `internal` is the last kind.
                self.store_errors[StoreError::KINDS.len() - 1].fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    /// Records whether the store answered the last probe.
    pub fn set_store_up(&self, up: bool) {
        self.store_up.store(up, Ordering::Relaxed);
    }

    /// Records the store-wide count of unresolved entries.
    pub fn set_unresolved(&self, count: UnresolvedCount) {
        self.unresolved[0].store(count.unknown, Ordering::Relaxed);
        self.unresolved[1].store(count.attempting, Ordering::Relaxed);
    }

    /// Records a snapshot of the store's pool.
    pub fn set_pool(&self, stats: PoolStats) {
        for (gauge, v) in self.pool.iter().zip([stats.in_use, stats.idle, stats.max]) {
            gauge.store(u64::from(v), Ordering::Relaxed);
        }
    }

    /// A call of `rpc` arrived.
    fn started(&self, rpc: Rpc) {
        self.methods[rpc as usize]
            .started
            .fetch_add(1, Ordering::Relaxed);
    }

    /// A call of `rpc` produced its response after `elapsed`.
    fn responded(&self, rpc: Rpc, elapsed: Duration) {
        self.methods[rpc as usize].seconds.observe(elapsed);
    }

    /// A call of `rpc` ended with `code`.
    fn handled(&self, rpc: Rpc, code: usize) {
        self.methods[rpc as usize].handled[code.min(CODE_COUNT - 1)]
            .fetch_add(1, Ordering::Relaxed);
    }

    fn lock_window(&self) -> std::sync::MutexGuard<'_, ReplayWindow> {
        // A poisoned window only means a panic elsewhere mid-update of plain counters.
        self.window
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The replay window's totals now, and whether the alarm is on: at least
    /// `--replay-alarm-min-claims` claims and not one replay.
    pub fn replay_alarm(&self) -> (WindowTotals, bool) {
        let totals = self.lock_window().totals(self.clock.now());
        let on = self.alarm_min_claims > 0
            && totals.claims >= self.alarm_min_claims
            && totals.replays == 0;
        (totals, on)
    }

    /// Logs the alarm's warning if it is on and was not logged within the last window, so an
    /// alarm that stays on warns once per window. Returns whether it warned.
    pub fn warn_if_alarm(&self) -> bool {
        let (totals, on) = self.replay_alarm();
        let now = self.clock.now();
        let mut window = self.lock_window();
        if !on {
            window.warned_at = None;
            return false;
        }
        let length = window.length();
        if window.warned_at.is_some_and(|at| now.minus(at) < length) {
            return false;
        }
        window.warned_at = Some(now);
        drop(window);
        tracing::warn!(
            claims = totals.claims,
            replays = totals.replays,
            window = ?length.to_duration(),
            "replay alarm: claims in the window but not one replay; callers may be \
             regenerating keys on retry, so the ledger deduplicates nothing"
        );
        true
    }

    /// The Prometheus text exposition of every family.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        self.render_grpc(&mut out);
        self.render_ledger(&mut out);
        self.render_gauges(&mut out);
        out
    }

    fn render_grpc(&self, out: &mut String) {
        let labels = |method: &str| {
            format!("grpc_type=\"unary\",grpc_service=\"{SERVICE}\",grpc_method=\"{method}\"")
        };
        header(
            out,
            "grpc_server_started_total",
            "counter",
            "Ledger calls received, by method (including calls refused before the handler).",
        );
        for (method, m) in RPCS.iter().zip(&self.methods) {
            let _ = writeln!(
                out,
                "grpc_server_started_total{{{}}} {}",
                labels(method),
                m.started.load(Ordering::Relaxed)
            );
        }
        header(
            out,
            "grpc_server_handled_total",
            "counter",
            "Ledger calls completed, by method and gRPC code.",
        );
        for (method, m) in RPCS.iter().zip(&self.methods) {
            for (i, n) in m.handled.iter().enumerate() {
                let code = code_name(tonic::Code::from(i32::try_from(i).unwrap_or(2)));
                let n = n.load(Ordering::Relaxed);
                // OK is always shown so that rates exist from the start; other codes once seen.
                if n > 0 || i == 0 {
                    let _ = writeln!(
                        out,
                        "grpc_server_handled_total{{{},grpc_code=\"{code}\"}} {n}",
                        labels(method)
                    );
                }
            }
        }
        header(
            out,
            "grpc_server_handling_seconds",
            "histogram",
            "Time from a ledger call's request to its response, by method.",
        );
        for (method, m) in RPCS.iter().zip(&self.methods) {
            m.seconds
                .render(out, "grpc_server_handling_seconds", &labels(method));
        }
    }

    fn render_ledger(&self, out: &mut String) {
        let tools = self.tools.snapshot();
        header(
            out,
            "ledger_claims_total",
            "counter",
            "Claims answered, by outcome and tool (tools beyond --metrics-max-tools are \"other\").",
        );
        for (tool, stats) in &tools {
            for (outcome, n) in OUTCOMES.iter().zip(&stats.claims) {
                let _ = writeln!(
                    out,
                    "ledger_claims_total{{outcome=\"{outcome}\",tool=\"{}\"}} {}",
                    escape(tool),
                    n.load(Ordering::Relaxed)
                );
            }
        }
        header(
            out,
            "ledger_replays_total",
            "counter",
            "Claims answered with the stored result (ledger_claims_total{outcome=\"replayed\"}), by tool.",
        );
        for (tool, stats) in &tools {
            let _ = writeln!(
                out,
                "ledger_replays_total{{tool=\"{}\"}} {}",
                escape(tool),
                stats.claims[1].load(Ordering::Relaxed)
            );
        }
        header(
            out,
            "ledger_key_reuse_refusals_total",
            "counter",
            "Claims refused because an explicit key came with another tool or other arguments (KEY_REUSED_WITH_DIFFERENT_REQUEST), by tool.",
        );
        for (tool, stats) in &tools {
            let _ = writeln!(
                out,
                "ledger_key_reuse_refusals_total{{tool=\"{}\"}} {}",
                escape(tool),
                stats.key_reused.load(Ordering::Relaxed)
            );
        }
        counter(
            out,
            "ledger_stale_claim_tokens_total",
            "Completes refused because the claim token is not the current attempt's (STALE_CLAIM_TOKEN).",
            self.stale_tokens.load(Ordering::Relaxed),
        );
        header(
            out,
            "ledger_completions_total",
            "counter",
            "Completes that succeeded, by the status recorded, or already_completed for an identical repeat.",
        );
        for (status, n) in COMPLETIONS.iter().zip(&self.completions) {
            let _ = writeln!(
                out,
                "ledger_completions_total{{status=\"{status}\"}} {}",
                n.load(Ordering::Relaxed)
            );
        }
        header(
            out,
            "ledger_reconcile_resolutions_total",
            "counter",
            "Reconcile resolutions received in calls that succeeded, by the status the reconciler found.",
        );
        for (status, n) in ["succeeded", "failed"].iter().zip(&self.resolutions) {
            let _ = writeln!(
                out,
                "ledger_reconcile_resolutions_total{{status=\"{status}\"}} {}",
                n.load(Ordering::Relaxed)
            );
        }
        counter(
            out,
            "ledger_pruned_entries_total",
            "Finished entries deleted after their retention.",
            self.pruned.load(Ordering::Relaxed),
        );
        header(
            out,
            "ledger_store_errors_total",
            "counter",
            "Store errors, by kind: unavailable (cannot be reached, busy), io_error, full (out of disk space), contention (deadlocks past the retries), read_only (a standby), corrupt, or internal (a bug).",
        );
        for (kind, n) in StoreError::KINDS.iter().zip(&self.store_errors) {
            let _ = writeln!(
                out,
                "ledger_store_errors_total{{kind=\"{kind}\"}} {}",
                n.load(Ordering::Relaxed)
            );
        }
    }

    fn render_gauges(&self, out: &mut String) {
        header(
            out,
            "ledger_store_up",
            "gauge",
            "Whether the last health probe reached the store.",
        );
        let _ = writeln!(
            out,
            "ledger_store_up {}",
            u8::from(self.store_up.load(Ordering::Relaxed))
        );
        let unknown = self.unresolved[0].load(Ordering::Relaxed);
        let attempting = self.unresolved[1].load(Ordering::Relaxed);
        if unknown >= 0 && attempting >= 0 {
            header(
                out,
                "ledger_unresolved_entries",
                "gauge",
                "Unresolved entries in the whole store (every tenant, every server), by status: unknown (reported, or past its lease: to reconcile) and attempting (in its lease).",
            );
            let _ = writeln!(
                out,
                "ledger_unresolved_entries{{status=\"unknown\"}} {unknown}"
            );
            let _ = writeln!(
                out,
                "ledger_unresolved_entries{{status=\"attempting\"}} {attempting}"
            );
        }
        header(
            out,
            "ledger_store_pool_connections",
            "gauge",
            "This server's store connections, by state: in_use, idle, and max (the pool's limit).",
        );
        for (state, n) in ["in_use", "idle", "max"].iter().zip(&self.pool) {
            let _ = writeln!(
                out,
                "ledger_store_pool_connections{{state=\"{state}\"}} {}",
                n.load(Ordering::Relaxed)
            );
        }
        let (totals, on) = self.replay_alarm();
        header(
            out,
            "ledger_replay_window_claims",
            "gauge",
            "Claims answered on this server in the replay window (--replay-alarm-window).",
        );
        let _ = writeln!(out, "ledger_replay_window_claims {}", totals.claims);
        header(
            out,
            "ledger_replay_window_replays",
            "gauge",
            "Of them, replays.",
        );
        let _ = writeln!(out, "ledger_replay_window_replays {}", totals.replays);
        header(
            out,
            "ledger_replay_ratio",
            "gauge",
            "Replays per claim answered in the replay window (0 when there was no claim).",
        );
        let _ = writeln!(out, "ledger_replay_ratio {}", totals.ratio());
        header(
            out,
            "ledger_replay_alarm",
            "gauge",
            "1 when the replay window holds at least --replay-alarm-min-claims claims and not one replay: callers may be regenerating keys on retry.",
        );
        let _ = writeln!(out, "ledger_replay_alarm {}", u8::from(on));
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    header(out, name, "counter", help);
    let _ = writeln!(out, "{name} {value}");
}

/// A label value escaped as the text format requires (tool names may hold `"` or `\`).
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Refreshes the gauges read from the store every `interval` (the store-wide unresolved
/// count once `ready` says the store is migrated, and the pool snapshot), and logs the replay
/// alarm's warning. Runs only when metrics are enabled.
pub async fn refresh_loop(
    metrics: Arc<Metrics>,
    store: Arc<dyn Store>,
    ready: impl Fn() -> bool + Send + 'static,
    interval: Duration,
) {
    loop {
        metrics.set_pool(store.pool_stats());
        let migrated = ready();
        if migrated {
            match store.count_unresolved(metrics.clock.now()).await {
                Ok(count) => metrics.set_unresolved(count),
                Err(e) => {
                    metrics.store_error(&e);
                    tracing::debug!(error = %e, "cannot count unresolved entries for metrics");
                }
            }
        }
        metrics.warn_if_alarm();
        // Until migrations ran, look again soon, so the first count follows start-up closely.
        let pause = if migrated {
            interval
        } else {
            interval.min(Duration::from_millis(100))
        };
        tokio::time::sleep(pause).await;
    }
}

/// Serves `GET /metrics` on `listener` until the task is dropped. One small request per
/// connection; anything else gets 404.
pub async fn serve_metrics(listener: TcpListener, metrics: Arc<Metrics>) {
    // Backs off (and says so) when descriptors run out, instead of spinning on accept.
    let mut backoff = crate::connections::Backoff::default();
    loop {
        let mut socket = backoff.accept(&listener, None).await;
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            // A scraper that connects and says nothing does not hold the task for ever.
            let Ok(Ok(n)) = tokio::time::timeout(METRICS_READ_TIMEOUT, socket.read(&mut buf)).await
            else {
                return;
            };
            let request = String::from_utf8_lossy(&buf[..n]);
            let response = if request.starts_with("GET /metrics ") {
                let body = metrics.render();
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
            } else {
                "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    .to_string()
            };
            let _ = socket.write_all(response.as_bytes()).await;
            let _ = socket.shutdown().await;
        });
    }
}

/// How long the metrics endpoint waits for a scraper's request.
const METRICS_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Binds the metrics endpoint.
///
/// # Errors
/// The address cannot be bound.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// A tower layer that counts the gRPC families around the ledger service: it sits outside the
/// auth interceptor, so refused calls are counted with the code the caller got.
#[derive(Clone, Debug)]
pub struct GrpcMetricsLayer {
    /// Where the counts go.
    metrics: Arc<Metrics>,
}

impl GrpcMetricsLayer {
    /// Counts into `metrics`.
    pub fn new(metrics: Arc<Metrics>) -> GrpcMetricsLayer {
        GrpcMetricsLayer { metrics }
    }
}

impl<S> tower::Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcMetricsService {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// The service [`GrpcMetricsLayer`] makes.
#[derive(Clone, Debug)]
pub struct GrpcMetricsService<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for GrpcMetricsService<S> {
    const NAME: &'static str = S::NAME;
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> tower::Service<http::Request<tonic::body::Body>> for GrpcMetricsService<S>
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<B>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<tonic::codegen::StdError>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let rpc = Rpc::from_path(request.uri().path());
        // The readied service handles this call; a clone takes its place for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let metrics = self.metrics.clone();
        if let Some(rpc) = rpc {
            metrics.started(rpc);
        }
        let started = Instant::now();
        Box::pin(async move {
            let response = inner.call(request).await?;
            let Some(rpc) = rpc else {
                return Ok(response.map(tonic::body::Body::new));
            };
            metrics.responded(rpc, started.elapsed());
            // Already rewritten (crate::grpc::rewrite_library_errors, inside this layer): the
            // code counted is the code the caller gets.
            let response = response.map(tonic::body::Body::new);
            if let Some(code) = grpc_status(response.headers()) {
                // Trailers-only: an error before any message.
                metrics.handled(rpc, code);
                return Ok(response);
            }
            Ok(response.map(|body| {
                tonic::body::Body::new(CountTrailers {
                    inner: body,
                    rpc,
                    metrics: Some(metrics),
                })
            }))
        })
    }
}

/// The `grpc-status` a header map carries, as a code number.
fn grpc_status(headers: &http::HeaderMap) -> Option<usize> {
    headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// A response body that counts the call's code when its trailers pass (or CANCELLED if the
/// body is dropped before them: the caller went away).
struct CountTrailers {
    inner: tonic::body::Body,
    rpc: Rpc,
    /// Taken once the code is counted.
    metrics: Option<Arc<Metrics>>,
}

impl http_body::Body for CountTrailers {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(trailers) = frame.trailers_ref()
            && let Some(code) = grpc_status(trailers)
            && let Some(metrics) = self.metrics.take()
        {
            metrics.handled(self.rpc, code);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for CountTrailers {
    fn drop(&mut self) {
        if let Some(metrics) = self.metrics.take() {
            metrics.handled(self.rpc, tonic::Code::Cancelled as usize);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::time::SystemClock;

    #[test]
    fn a_histogram_renders_cumulative_buckets_sum_and_count() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(300));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(60));
        let mut out = String::new();
        h.render(&mut out, "x_seconds", "m=\"a\"");
        assert!(
            out.contains("x_seconds_bucket{m=\"a\",le=\"0.0005\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("x_seconds_bucket{m=\"a\",le=\"0.005\"} 2\n"),
            "{out}"
        );
        assert!(
            out.contains("x_seconds_bucket{m=\"a\",le=\"30\"} 2\n"),
            "{out}"
        );
        assert!(
            out.contains("x_seconds_bucket{m=\"a\",le=\"+Inf\"} 3\n"),
            "{out}"
        );
        assert!(out.contains("x_seconds_count{m=\"a\"} 3\n"), "{out}");
        assert!(out.contains("x_seconds_sum{m=\"a\"} 60.0033\n"), "{out}");
    }

    #[test]
    fn tools_beyond_the_limit_fold_into_other() {
        let m = Metrics::new(
            Arc::new(SystemClock),
            &MetricsOptions {
                max_tools: 2,
                ..MetricsOptions::default()
            },
        );
        for tool in ["a", "b", "c", "d", "a"] {
            m.tools.get(tool).key_reused.fetch_add(1, Ordering::Relaxed);
        }
        let text = m.render();
        assert!(
            text.contains("ledger_key_reuse_refusals_total{tool=\"a\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("ledger_key_reuse_refusals_total{tool=\"b\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("ledger_key_reuse_refusals_total{tool=\"other\"} 2\n"),
            "{text}"
        );
        assert!(!text.contains("tool=\"c\""), "{text}");
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn the_replay_window_slides_and_forgets_old_slices() {
        let mut w = ReplayWindow::new(Duration::from_secs(60));
        let t0 = Micros(1_000_000_000);
        w.record(t0, false);
        w.record(t0, true);
        w.record(t0.plus(Micros(30_000_000)), false);
        let at = |s: i64| w.totals(t0.plus(Micros(s * 1_000_000)));
        assert_eq!(
            at(30),
            WindowTotals {
                claims: 3,
                replays: 1
            }
        );
        // 60 s later the first slice has left the window; the claim at 30 s has not.
        assert_eq!(
            at(60),
            WindowTotals {
                claims: 1,
                replays: 0
            }
        );
        assert_eq!(at(120), WindowTotals::default());
        assert!(
            (WindowTotals {
                claims: 4,
                replays: 1
            }
            .ratio()
                - 0.25)
                .abs()
                < 1e-12
        );
    }

    #[test]
    fn grpc_paths_name_the_ledger_methods_only() {
        assert!(matches!(
            Rpc::from_path("/idempotency.v1.LedgerService/Claim"),
            Some(Rpc::Claim)
        ));
        assert!(Rpc::from_path("/grpc.health.v1.Health/Check").is_none());
        assert!(Rpc::from_path("/idempotency.v1.LedgerService/Nope").is_none());
    }
}
