//! The ledger's Prometheus families, each registered once in the `prometheus-client` registry
//! of one [`Metrics`], the API that records into them, and the loop that refreshes the
//! gauges read from the store. (Which caller records what: see [`crate::observe`].)
//!
//! - The conventional gRPC server families for the ledger service: `grpc_server_started_total`,
//!   `grpc_server_handled_total` and the `grpc_server_handling_seconds` histogram (recorded by
//!   [`crate::observe::GrpcMetricsLayer`]).
//! - The ledger's own counters: claims by outcome and tool, replays and key-reuse refusals by
//!   tool, stale claim tokens, completions, reconcile resolutions, stale findings by why,
//!   pruned entries, store errors by kind.
//! - Gauges: whether the store answers, the store-wide count of unresolved entries and of
//!   entries marked as a possible double effect (the store's figures, so every server sharing
//!   it reports the same), this server's pool; and the replay-rate window's
//!   ([`crate::observe::replay_rate`]).
//!
//! Series with a fixed label set exist from the start at zero, so that rates exist before the
//! first event; a tool's series appear with its first claim; `grpc_server_handled_total` shows
//! `OK` from the start and other codes once seen; `ledger_unresolved_entries` and
//! `ledger_possible_double_effects` are absent until the store was first read, so a scrape
//! never shows a zero nobody measured.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::Rpc;
use super::replay_rate::{ClaimEvent, ReplayAlarm, ReplayFigures, ReplayHistory};
use crate::domain::time::Clock;
use crate::domain::{Decision, FinalStatus, Tenant};
use crate::error::LedgerError;
use crate::ledger::{ClaimOutput, CompleteOutput, Outcome, ResolutionOutcome, ResolutionResult};
use crate::storage::{PoolStats, Store, StoreError, UnresolvedCount};

mod families;
mod methods;
mod tools;

use methods::{GrpcSeries, handled_labels};
use tools::Tools;

/// The `Content-Type` of what [`Metrics::render`] writes: the Prometheus text format 0.0.4.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Upper bounds of the handling-time histogram, in seconds: from a replay served from cache
/// (well under a millisecond) to a claim that waited its longest (`--max-wait`, 30 s).
pub const BUCKETS: [f64; 15] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Completion statuses as label values: the three a claimant reports, and a repeat of an
/// identical Complete.
const COMPLETIONS: [&str; 4] = ["succeeded", "failed", "unknown", "already_completed"];

/// What a reconciler found, as label values.
const RESOLUTIONS: [&str; 2] = ["succeeded", "failed"];

/// The pool's states as label values, in the order [`Metrics::set_pool`] reads them.
const POOL_STATES: [&str; 3] = ["in_use", "idle", "max"];

/// Why a finding was stale: the label values of `ledger_stale_findings_total`
/// ([`crate::domain::StaleReason::as_str`]).
/// A decision's outcome: the label values of `ledger_approval_decisions_total`.
const DECISIONS: [&str; 2] = ["approved", "denied"];

/// The buckets of `ledger_approval_decide_seconds`: from a minute to a week.
const DECIDE_BUCKETS: [f64; 9] = [
    60.0, 300.0, 900.0, 3600.0, 14_400.0, 43_200.0, 86_400.0, 259_200.0, 604_800.0,
];

const STALE_REASONS: [&str; 4] = [
    "later_attempt",
    "other_attempt",
    "hold_replaced",
    "not_unknown",
];

/// A label set of fixed values.
type Labels<const N: usize> = [(&'static str, &'static str); N];

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

/// The series of a family with one label of fixed values.
fn per_value<const N: usize>(
    family: &Family<Labels<1>, Counter>,
    label: &'static str,
    values: [&'static str; N],
) -> [Counter; N] {
    values.map(|v| family.get_or_create_owned(&[(label, v)]))
}

/// The ledger's metrics: a registry of its own, and handles on its series (cheap to share,
/// updated with atomics).
pub struct Metrics {
    /// Every family, each registered once; what a scrape encodes.
    registry: Registry,
    grpc: GrpcSeries,
    tools: Tools,
    /// Completes refused for a stale or wrong claim token.
    stale_tokens: Counter,
    /// Completes that recorded an outcome, by [`COMPLETIONS`].
    completions: [Counter; 4],
    /// Reconcile resolutions received in calls that succeeded, by [`RESOLUTIONS`].
    resolutions: [Counter; 2],
    /// Findings that changed nothing because they no longer spoke for their entry, by
    /// [`STALE_REASONS`].
    stale_findings: [Counter; 4],
    /// Expired entries deleted.
    pruned: Counter,
    /// Decisions about calls awaiting approval, by [`DECISIONS`].
    decisions: [Counter; 2],
    /// How long a person took to decide, from the request to the decision.
    decide_seconds: Histogram,
    /// Requests that went undecided, and approvals unused, past their deadline.
    approvals_expired: Counter,
    /// Store errors, by [`StoreError::KINDS`].
    store_errors: [Counter; StoreError::KINDS.len()],
    /// Whether the last health probe reached the store.
    store_up: Gauge,
    /// The last store-wide count of unresolved entries, by status; empty before the first.
    unresolved: Family<Labels<1>, Gauge>,
    /// The last store-wide count of entries marked as a possible double effect; empty before
    /// the first.
    double_effects: Family<Labels<0>, Gauge>,
    /// The last store-wide count of calls awaiting a person's decision; empty before the
    /// first.
    awaiting_approval: Family<Labels<0>, Gauge>,
    /// The last pool snapshot, by [`POOL_STATES`].
    pool: [Gauge; 3],
    /// The replay-rate window and alarm.
    replay: Arc<ReplayAlarm>,
    /// The replay rate per tenant and tool over the last hour (the console's picture and the
    /// `ReplayRate` RPC).
    history: ReplayHistory,
    /// The ledger's clock, for the store-wide count.
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// New metrics, all zero, whose replay window slides on `clock`.
    pub fn new(clock: Arc<dyn Clock>, options: &MetricsOptions) -> Arc<Metrics> {
        let mut registry = Registry::default();
        // The registry adds the `_total` of counters, the unit's suffix, and a full stop to
        // each help text.
        let grpc = GrpcSeries::register(&mut registry);

        let tools = Tools::register(&mut registry, options.max_tools);
        let outcomes = families::Outcomes::register(&mut registry);
        let stores = families::Stores::register(&mut registry);
        // Computed when scraped, so it follows the clock between claims; encoded after the
        // families above.
        let replay = Arc::new(ReplayAlarm::new(
            clock.clone(),
            options.alarm_window,
            options.alarm_min_claims,
        ));
        registry.register_collector(Box::new(replay.clone()));
        let history = ReplayHistory::new(
            clock.clone(),
            options.max_tools,
            options.alarm_window,
            options.alarm_min_claims,
        );

        Arc::new(Metrics {
            registry,
            grpc,
            tools,
            stale_tokens: outcomes.stale_tokens,
            completions: per_value(&outcomes.completions, "status", COMPLETIONS),
            resolutions: per_value(&outcomes.resolutions, "status", RESOLUTIONS),
            stale_findings: per_value(&outcomes.stale_findings, "reason", STALE_REASONS),
            pruned: outcomes.pruned,
            decisions: per_value(&outcomes.decisions, "outcome", DECISIONS),
            decide_seconds: outcomes.decide_seconds,
            approvals_expired: outcomes.approvals_expired,
            store_errors: per_value(&stores.store_errors, "kind", StoreError::KINDS),
            store_up: stores.store_up,
            unresolved: stores.unresolved,
            double_effects: stores.double_effects,
            awaiting_approval: stores.awaiting_approval,
            pool: POOL_STATES.map(|state| stores.pool.get_or_create_owned(&[("state", state)])),
            replay,
            history,
            clock,
        })
    }

    /// Counts a Claim's result for `tool` (the request's) by `tenant`: its outcome (and the
    /// replay window and history), or a key-reuse refusal. Other errors concern no claim
    /// answered; a store error is counted by [`Metrics::call_failed`].
    pub fn claim(&self, tenant: &Tenant, tool: &str, result: &Result<ClaimOutput, LedgerError>) {
        match result {
            Ok(out) => {
                let series = self.tools.get(tool);
                let replayed = out.outcome == Outcome::Replayed;
                series.claims[outcome_index(out.outcome)].inc();
                if replayed {
                    series.replays.inc();
                }
                self.replay.record(replayed);
                self.history
                    .record(tenant, tool, ClaimEvent::Answered { replayed });
            }
            Err(LedgerError::KeyReused) => {
                self.tools.get(tool).key_reused.inc();
                self.history.record(tenant, tool, ClaimEvent::KeyReused);
            }
            Err(_) => {}
        }
    }

    /// Counts one answer of the MCP gateway to a `tools/call` of `tool` (`<upstream>/<tool>`).
    pub fn mcp_call(&self, tool: &str, answer: &'static str) {
        self.tools.gateway_call(tool, answer);
    }

    /// `tenant`'s replay rate on this server over the last hour: its total and each tool's
    /// (only `tool`'s when given).
    pub fn replay_figures(&self, tenant: &Tenant, tool: Option<&str>) -> ReplayFigures {
        self.history.read(tenant, tool)
    }

    /// Counts a Complete's result: the status it recorded, a repeat, or a stale token.
    pub fn complete(&self, status: FinalStatus, result: &Result<CompleteOutput, LedgerError>) {
        match result {
            Ok(out) => {
                let i = match (out.already_completed, status) {
                    (true, _) => 3,
                    (false, FinalStatus::Succeeded) => 0,
                    (false, FinalStatus::Failed) => 1,
                    (false, FinalStatus::Unknown) => 2,
                };
                self.completions[i].inc();
            }
            Err(LedgerError::StaleClaimToken) => {
                self.stale_tokens.inc();
            }
            Err(_) => {}
        }
    }

    /// Counts the resolutions of a Reconcile call that succeeded, by the status each reported.
    pub fn resolutions(&self, statuses: impl IntoIterator<Item = FinalStatus>) {
        for status in statuses {
            self.resolutions[usize::from(status != FinalStatus::Succeeded)].inc();
        }
    }

    /// Counts the findings of a Reconcile (or of the console's form) that were stale, by why.
    pub fn findings(&self, results: &[ResolutionResult]) {
        for result in results {
            if let ResolutionOutcome::Stale(reason) = result.outcome
                && let Some(i) = STALE_REASONS.iter().position(|r| *r == reason.as_str())
            {
                self.stale_findings[i].inc();
            }
        }
    }

    /// Counts a decision that changed its entry, and how long the person took.
    pub fn decided(&self, decision: Decision, changed: bool, took: Option<Duration>) {
        if !changed {
            return;
        }
        self.decisions[usize::from(decision == Decision::Deny)].inc();
        if let Some(took) = took {
            self.decide_seconds.observe(took.as_secs_f64());
        }
    }

    /// Counts lapsed requests and approvals.
    pub fn approvals_expired(&self, n: u64) {
        self.approvals_expired.inc_by(n);
    }

    /// Counts expired entries deleted.
    pub fn pruned(&self, n: u64) {
        self.pruned.inc_by(n);
    }

    /// Counts a store error by its kind.
    pub fn store_error(&self, error: &StoreError) {
        self.count_kind(error.kind());
    }

    fn count_kind(&self, kind: &str) {
        if let Some(i) = StoreError::KINDS.iter().position(|k| *k == kind) {
            self.store_errors[i].inc();
        }
    }

    /// Counts a call's error when it is the store's (by the store's kind), or a bug of the
    /// server's own (as `internal`). Every other error is the caller's or a refusal, which
    /// the gRPC families count by its code.
    pub fn call_failed(&self, error: &LedgerError) {
        match error {
            LedgerError::Store(e) => self.store_error(e),
            LedgerError::Internal(_) => self.count_kind("internal"),
            _ => {}
        }
    }

    /// Records whether the store answered the last probe.
    pub fn set_store_up(&self, up: bool) {
        self.store_up.set(i64::from(up));
    }

    /// Records the store-wide count of unresolved entries.
    pub fn set_unresolved(&self, count: UnresolvedCount) {
        for (status, n) in [("unknown", count.unknown), ("attempting", count.attempting)] {
            self.unresolved.get_or_create(&[("status", status)]).set(n);
        }
        self.double_effects
            .get_or_create(&[])
            .set(count.possible_double_effect);
        self.awaiting_approval
            .get_or_create(&[])
            .set(count.awaiting_approval);
    }

    /// Records a snapshot of the store's pool.
    pub fn set_pool(&self, stats: PoolStats) {
        for (gauge, n) in self.pool.iter().zip([stats.in_use, stats.idle, stats.max]) {
            gauge.set(i64::from(n));
        }
    }

    /// A call of `rpc` arrived.
    pub(super) fn grpc_started(&self, rpc: Rpc) {
        self.grpc.started[rpc.index()].inc();
    }

    /// A call of `rpc` produced its response (or was dropped) after `elapsed`.
    pub(super) fn grpc_responded(&self, rpc: Rpc, elapsed: Duration) {
        self.grpc.seconds[rpc.index()].observe(elapsed.as_secs_f64());
    }

    /// A call of `rpc` ended with `code`.
    pub(super) fn grpc_handled(&self, rpc: Rpc, code: tonic::Code) {
        if code == tonic::Code::Ok {
            self.grpc.handled_ok[rpc.index()].inc();
        } else {
            self.grpc
                .handled
                .get_or_create(&handled_labels(rpc, code))
                .inc();
        }
    }

    /// Logs the replay alarm's warning, once per window while it stays on; returns whether it
    /// warned.
    pub fn warn_if_alarm(&self) -> bool {
        self.replay.warn_if_on()
    }

    /// Every family in the Prometheus text format ([`CONTENT_TYPE`]).
    ///
    /// # Errors
    /// A family could not be encoded (a bug: writing to a string does not fail).
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::with_capacity(16 * 1024);
        prometheus_text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// The place of `outcome` in [`Outcome::ALL`].
fn outcome_index(outcome: Outcome) -> usize {
    outcome as usize
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::time::SystemClock;
    use crate::observe::SERVICE;

    #[test]
    fn every_outcome_counts_in_its_own_series() {
        for (i, o) in Outcome::ALL.into_iter().enumerate() {
            assert_eq!(outcome_index(o), i, "{o:?}");
        }
    }

    fn metrics(max_tools: usize) -> Arc<Metrics> {
        Metrics::new(
            Arc::new(SystemClock),
            &MetricsOptions {
                max_tools,
                ..MetricsOptions::default()
            },
        )
    }

    fn render(m: &Metrics) -> String {
        m.render().expect("render")
    }

    #[test]
    fn every_family_is_exported_once_under_todays_names() {
        let m = metrics(50);
        m.set_unresolved(UnresolvedCount::default());
        let text = render(&m);
        let types: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .collect();
        assert_eq!(
            types,
            [
                "grpc_server_started_total counter",
                "grpc_server_handled_total counter",
                "grpc_server_handling_seconds histogram",
                "ledger_claims_total counter",
                "ledger_replays_total counter",
                "ledger_key_reuse_refusals_total counter",
                "ledger_stale_claim_tokens_total counter",
                "ledger_completions_total counter",
                "ledger_reconcile_resolutions_total counter",
                "ledger_stale_findings_total counter",
                "ledger_approval_decisions_total counter",
                "ledger_approval_decide_seconds histogram",
                "ledger_approvals_expired_total counter",
                "ledger_pruned_entries_total counter",
                "ledger_store_errors_total counter",
                "ledger_store_up gauge",
                "ledger_unresolved_entries gauge",
                "ledger_possible_double_effects gauge",
                "ledger_approvals_awaiting gauge",
                "ledger_store_pool_connections gauge",
                "ledger_replay_window_claims gauge",
                "ledger_replay_window_replays gauge",
                "ledger_replay_ratio gauge",
                "ledger_replay_alarm gauge",
            ],
            "{text}"
        );
        // One help line per family, ending with one full stop.
        assert_eq!(text.matches("# HELP ").count(), types.len(), "{text}");
        assert!(
            text.lines()
                .filter(|l| l.starts_with("# HELP "))
                .all(|l| l.ends_with('.') && !l.ends_with("..")),
            "{text}"
        );
        assert!(!text.contains("# EOF"), "{text}");
    }

    #[test]
    fn the_unresolved_gauge_is_absent_until_the_store_was_read() {
        let m = metrics(50);
        assert!(!render(&m).contains("ledger_unresolved_entries"));
        assert!(!render(&m).contains("ledger_possible_double_effects "));
        m.set_unresolved(UnresolvedCount {
            unknown: 3,
            attempting: 1,
            awaiting_approval: 4,
            possible_double_effect: 2,
        });
        let text = render(&m);
        assert!(
            text.contains("ledger_unresolved_entries{status=\"unknown\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("ledger_unresolved_entries{status=\"attempting\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("\nledger_possible_double_effects 2\n"),
            "{text}"
        );
    }

    #[test]
    fn a_histogram_renders_cumulative_buckets_sum_and_count() {
        let m = metrics(50);
        for d in [
            Duration::from_micros(300),
            Duration::from_millis(3),
            Duration::from_secs(60),
        ] {
            m.grpc_responded(Rpc::Lookup, d);
        }
        let text = render(&m);
        let series = |suffix: &str, extra: &str| {
            format!(
                "grpc_server_handling_seconds_{suffix}{{grpc_type=\"unary\",grpc_service=\"{SERVICE}\",grpc_method=\"Lookup\"{extra}}}"
            )
        };
        for (line, want) in [
            (series("bucket", ",le=\"0.0005\""), "1"),
            (series("bucket", ",le=\"0.005\""), "2"),
            (series("bucket", ",le=\"1\""), "2"),
            (series("bucket", ",le=\"30\""), "2"),
            (series("bucket", ",le=\"+Inf\""), "3"),
            (series("count", ""), "3"),
            (series("sum", ""), "60.0033"),
        ] {
            let line = format!("{line} {want}\n");
            assert!(text.contains(&line), "no {line:?} in:\n{text}");
        }
        let buckets = text
            .lines()
            .filter(|l| l.contains("_bucket{") && l.contains("\"Lookup\""))
            .count();
        assert_eq!(buckets, BUCKETS.len() + 1, "{text}");
    }

    #[test]
    fn ok_is_shown_from_the_start_and_other_codes_once_seen() {
        let m = metrics(50);
        let text = render(&m);
        for rpc in Rpc::all() {
            let ok = format!("grpc_method=\"{}\",grpc_code=\"OK\"}} 0\n", rpc.name());
            assert!(text.contains(&ok), "no {ok:?} in:\n{text}");
        }
        assert!(!text.contains("UNAVAILABLE"), "{text}");
        m.grpc_started(Rpc::Claim);
        m.grpc_handled(Rpc::Claim, tonic::Code::Unavailable);
        m.grpc_started(Rpc::Claim);
        m.grpc_handled(Rpc::Claim, tonic::Code::Ok);
        let text = render(&m);
        for line in [
            "grpc_server_started_total{grpc_type=\"unary\",grpc_service=\"idempotency.v1.LedgerService\",grpc_method=\"Claim\"} 2\n",
            "grpc_method=\"Claim\",grpc_code=\"UNAVAILABLE\"} 1\n",
            "grpc_method=\"Claim\",grpc_code=\"OK\"} 1\n",
        ] {
            assert!(text.contains(line), "no {line:?} in:\n{text}");
        }
    }

    #[test]
    fn tools_beyond_the_limit_fold_into_other() {
        let m = metrics(2);
        for tool in ["a", "b", "c", "d", "a"] {
            m.claim(
                &Tenant::default_tenant(),
                tool,
                &Err(LedgerError::KeyReused),
            );
        }
        let text = render(&m);
        for line in [
            "ledger_key_reuse_refusals_total{tool=\"a\"} 2\n",
            "ledger_key_reuse_refusals_total{tool=\"b\"} 1\n",
            "ledger_key_reuse_refusals_total{tool=\"other\"} 2\n",
            // A named tool's every outcome is shown, at zero until counted.
            "ledger_claims_total{outcome=\"previously_failed\",tool=\"a\"} 0\n",
            "ledger_replays_total{tool=\"b\"} 0\n",
        ] {
            assert!(text.contains(line), "no {line:?} in:\n{text}");
        }
        assert!(!text.contains("tool=\"c\""), "{text}");
    }

    #[test]
    fn a_tool_named_other_counts_as_other_and_takes_no_place() {
        let m = metrics(1);
        m.claim(
            &Tenant::default_tenant(),
            "other",
            &Err(LedgerError::KeyReused),
        );
        m.claim(&Tenant::default_tenant(), "a", &Err(LedgerError::KeyReused));
        let text = render(&m);
        assert!(
            text.contains("ledger_key_reuse_refusals_total{tool=\"other\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("ledger_key_reuse_refusals_total{tool=\"a\"} 1\n"),
            "{text}"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let m = metrics(50);
        m.claim(
            &Tenant::default_tenant(),
            "a\"b\\c\nd",
            &Err(LedgerError::KeyReused),
        );
        let text = render(&m);
        assert!(
            text.contains("ledger_key_reuse_refusals_total{tool=\"a\\\"b\\\\c\\nd\"} 1\n"),
            "{text}"
        );
    }

    #[test]
    fn store_errors_count_by_the_stores_kind_and_bugs_as_internal() {
        let m = metrics(50);
        m.call_failed(&LedgerError::Store(StoreError::Unavailable("down".into())));
        m.call_failed(&LedgerError::Internal("a bug".into()));
        // Refusals are the caller's: no store error.
        m.call_failed(&LedgerError::KeyReused);
        m.call_failed(&LedgerError::NotFound);
        let text = render(&m);
        for kind in StoreError::KINDS {
            let want = u8::from(kind == "unavailable" || kind == "internal");
            let line = format!("ledger_store_errors_total{{kind=\"{kind}\"}} {want}\n");
            assert!(text.contains(&line), "no {line:?} in:\n{text}");
        }
    }
}
