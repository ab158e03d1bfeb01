//! The families of the ledger's outcomes and of its store, registered once by
//! [`Metrics::new`](super::Metrics::new): their names and help texts.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use super::{DECIDE_BUCKETS, Labels};

/// The ledger's outcome families, as registered.
pub(super) struct Outcomes {
    pub stale_tokens: Counter,
    pub completions: Family<Labels<1>, Counter>,
    pub resolutions: Family<Labels<1>, Counter>,
    pub stale_findings: Family<Labels<1>, Counter>,
    pub decisions: Family<Labels<1>, Counter>,
    pub decide_seconds: Histogram,
    pub approvals_expired: Counter,
    pub pruned: Counter,
}

impl Outcomes {
    /// Registers the outcome families in `registry`.
    pub fn register(registry: &mut Registry) -> Outcomes {
        let stale_tokens = Counter::default();
        registry.register(
            "ledger_stale_claim_tokens",
            "Completes refused because the claim token is not the current attempt's \
             (STALE_CLAIM_TOKEN)",
            stale_tokens.clone(),
        );
        let completions = Family::<Labels<1>, Counter>::default();
        registry.register(
            "ledger_completions",
            "Completes that succeeded, by the status recorded, or already_completed for an \
             identical repeat",
            completions.clone(),
        );
        let resolutions = Family::<Labels<1>, Counter>::default();
        registry.register(
            "ledger_reconcile_resolutions",
            "Reconcile resolutions received in calls that succeeded, by the status the \
             reconciler found",
            resolutions.clone(),
        );
        let stale_findings = Family::<Labels<1>, Counter>::default();
        registry.register(
            "ledger_stale_findings",
            "Reconcile findings that changed nothing because they no longer spoke for their \
             entry (RESOLUTION_STALE), by reason: later_attempt (a later attempt was started), \
             other_attempt, hold_replaced (the entry was handed out again since), not_unknown \
             (its attempt was in its lease)",
            stale_findings.clone(),
        );
        let decisions = Family::<Labels<1>, Counter>::default();
        registry.register(
            "ledger_approval_decisions",
            "Decisions about calls awaiting a person's approval, by outcome (a repeated decision \
             that changed nothing is not counted)",
            decisions.clone(),
        );
        let decide_seconds = Histogram::new(DECIDE_BUCKETS);
        registry.register_with_unit(
            "ledger_approval_decide",
            "Time from a call's approval request to the person's decision",
            Unit::Seconds,
            decide_seconds.clone(),
        );
        let approvals_expired = Counter::default();
        registry.register(
            "ledger_approvals_expired",
            "Approval requests that went undecided past their decide_by, and approvals unused \
             past their execute_by (nothing was done; the next claim asks again)",
            approvals_expired.clone(),
        );
        let pruned = Counter::default();
        registry.register(
            "ledger_pruned_entries",
            "Finished entries deleted after their retention",
            pruned.clone(),
        );

        Outcomes {
            stale_tokens,
            completions,
            resolutions,
            stale_findings,
            decisions,
            decide_seconds,
            approvals_expired,
            pruned,
        }
    }
}

/// The store's families, as registered.
pub(super) struct Stores {
    pub store_errors: Family<Labels<1>, Counter>,
    pub store_up: Gauge,
    pub unresolved: Family<Labels<1>, Gauge>,
    pub double_effects: Family<Labels<0>, Gauge>,
    pub awaiting_approval: Family<Labels<0>, Gauge>,
    pub pool: Family<Labels<1>, Gauge>,
}

impl Stores {
    /// Registers the store's families in `registry`.
    pub fn register(registry: &mut Registry) -> Stores {
        let store_errors = Family::<Labels<1>, Counter>::default();
        registry.register(
            "ledger_store_errors",
            "Store errors, by kind: unavailable (cannot be reached), busy (no connection or \
             lock came free in time), io_error, full (out \
             of disk space), contention (deadlocks past the retries), read_only (a standby), \
             corrupt, misconfigured (the store does not fit the settings), or internal (a \
             failed statement, or a bug)",
            store_errors.clone(),
        );

        let store_up = Gauge::default();
        registry.register(
            "ledger_store_up",
            "Whether the last health probe reached the store",
            store_up.clone(),
        );
        let unresolved = Family::<Labels<1>, Gauge>::default();
        registry.register(
            "ledger_unresolved_entries",
            "Unresolved entries in the whole store (every tenant, every server), by status: \
             unknown (reported, or past its lease: to reconcile) and attempting (in its lease)",
            unresolved.clone(),
        );
        let double_effects = Family::<Labels<0>, Gauge>::default();
        registry.register(
            "ledger_possible_double_effects",
            "Entries in the whole store marked as a possible double effect (a finding said an \
             earlier attempt's effect exists while a later attempt was started) that no person \
             has acknowledged yet",
            double_effects.clone(),
        );
        let awaiting_approval = Family::<Labels<0>, Gauge>::default();
        registry.register(
            "ledger_approvals_awaiting",
            "Calls in the whole store awaiting a person's decision",
            awaiting_approval.clone(),
        );
        let pool = Family::<Labels<1>, Gauge>::default();
        registry.register(
            "ledger_store_pool_connections",
            "This server's store connections, by state: in_use, idle, and max (the pool's limit)",
            pool.clone(),
        );
        Stores {
            store_errors,
            store_up,
            unresolved,
            double_effects,
            awaiting_approval,
            pool,
        }
    }
}
