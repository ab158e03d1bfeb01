//! Health: the probe that runs the migrations, then checks the store every interval (reachable,
//! writable, not a standby, with room on its disk), aligns the server's clock to a shared
//! store's, reports SERVING or NOT_SERVING, and logs each change with its cause.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::domain::Micros;
use crate::domain::time::Clock;
use crate::observe::Metrics;
use crate::storage::{Store, StoreError, StoreResult};

/// What the probe learned, shared with the interceptor and the shutdown.
#[derive(Default)]
pub(super) struct Readiness {
    /// Set once migrations ran; before that the ledger answers UNAVAILABLE.
    pub(super) migrated: AtomicBool,
    /// Set when shutdown begins; the probe then never reports SERVING again.
    pub(super) draining: AtomicBool,
}

/// Runs migrations until they succeed, then pings the store every `interval` and reports
/// SERVING only while it answers and has room for writes: after a write failed for want of
/// disk space, each probe also tries a write ([`Store::probe_write`]) until one commits. On a
/// store several servers share, each probe also measures the database's clock and aligns
/// `clock` to it (before the first call is served). Logs each change of health, and each
/// change of the cause while it is not serving, in the database's own words. A store that
/// does not fit the settings ([`StoreError::Misconfigured`]) ends the probe with the reason
/// sent on `fatal`.
pub(super) async fn probe_loop(
    store: Arc<dyn Store>,
    reporter: HealthReporter,
    state: Arc<Readiness>,
    metrics: Arc<Metrics>,
    clock: Arc<dyn Clock>,
    interval: std::time::Duration,
    fatal: tokio::sync::oneshot::Sender<String>,
) {
    let mut serving = false;
    let mut last_cause: Option<String> = None;
    let mut alignment = ClockAlignment::default();
    loop {
        let migrated = state.migrated.load(Ordering::Acquire);
        // A ping answers in milliseconds; migrations may take longer on a loaded machine (and
        // wait up to their lock timeout), and are not to be cut off half way.
        let bound = if migrated {
            interval.max(std::time::Duration::from_secs(1))
        } else {
            MIGRATION_BOUND
        };
        let check = async {
            if migrated {
                store.ping().await?;
                if store.is_full() {
                    store.probe_write().await?;
                }
                alignment.align(&*store, &*clock).await
            } else {
                store.migrate().await?;
                // Aligned before the first call is let in.
                alignment.align(&*store, &*clock).await?;
                state.migrated.store(true, Ordering::Release);
                tracing::info!(backend = store.backend(), "store migrated");
                Ok(())
            }
        };
        let healthy = match tokio::time::timeout(bound, check).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Unavailable(format!(
                "the health probe got no answer within {bound:?}"
            ))),
        };
        if let Err(StoreError::Misconfigured(reason)) = &healthy {
            tracing::error!(error = %reason, store = %store.location(), "the server's settings do not fit its store");
            let _ = fatal.send(reason.clone());
            return;
        }
        metrics.set_store_up(healthy.is_ok());
        let cause = match &healthy {
            Ok(()) => None,
            Err(e) => Some(explain(&*store, e).await),
        };
        let now_serving = healthy.is_ok() && !state.draining.load(Ordering::Acquire);
        if now_serving != serving || (cause.is_some() && cause != last_cause) {
            match (&cause, &healthy) {
                (None, _) => tracing::info!("store reachable and writable: health SERVING"),
                (Some(cause), Err(e)) => tracing::warn!(
                    error = %cause,
                    kind = e.kind(),
                    store = %store.location(),
                    "store not ready for calls: health NOT_SERVING"
                ),
                (Some(_), Ok(())) => {}
            }
        }
        last_cause = cause;
        if now_serving != serving {
            let status = if now_serving {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            set_health(&reporter, status).await;
            serving = now_serving;
        }
        tokio::time::sleep(interval).await;
    }
}

/// The longest one attempt at migrating may take before the probe counts it as failed (and
/// tries again).
const MIGRATION_BOUND: std::time::Duration = std::time::Duration::from_secs(120);

/// What a probe's failure says, in the database's own words: a pool that timed out opening a
/// connection says only that ([`StoreError::Unreachable`]), so a connection of the store's
/// own is opened to learn why (refused, a wrong password, a missing database, a TLS failure,
/// a pooler's refusal).
async fn explain(store: &dyn Store, error: &StoreError) -> String {
    if let StoreError::Unreachable(_) = error
        && let Some(cause) = store.unreachable_cause().await
    {
        return cause;
    }
    error.to_string()
}

/// The clock's alignment to the database's, and what was logged of it (the health probe's,
/// and the MCP gateway's, which shares a database with servers as one of them).
#[derive(Debug, Default)]
pub(crate) struct ClockAlignment {
    /// The offset last reported in the log, if any was far enough to say.
    reported: Option<Micros>,
}

impl ClockAlignment {
    /// A round trip slower than this says too little about when the database read its clock.
    const MAX_ROUND_TRIP: std::time::Duration = std::time::Duration::from_millis(250);

    /// An offset this large is logged (and again when it moves by as much).
    const WORTH_SAYING: Micros = Micros(1_000_000);

    /// Measures the database's clock against this machine's and has `clock` follow it.
    pub(crate) async fn align(&mut self, store: &dyn Store, clock: &dyn Clock) -> StoreResult<()> {
        let sent = Micros::now();
        let started = std::time::Instant::now();
        let Some(database) = store.database_now().await? else {
            return Ok(());
        };
        let round_trip = started.elapsed();
        if round_trip > Self::MAX_ROUND_TRIP {
            return Ok(());
        }
        // The database read its clock about halfway through the round trip.
        let local = sent.plus(Micros::from_duration(round_trip / 2));
        let offset = database.minus(local);
        clock.follow(offset);
        let far = offset.0.abs() >= Self::WORTH_SAYING.0;
        let moved = self
            .reported
            .is_none_or(|r| (r.0 - offset.0).abs() >= Self::WORTH_SAYING.0);
        if far && moved {
            tracing::warn!(
                offset_ms = offset.0 / 1000,
                "this server's clock is far from the database's: the ledger follows the \
                 database's clock (leases, reconciliation, retention and every timestamp), but \
                 check this machine's time synchronisation"
            );
            self.reported = Some(offset);
        } else if !far && self.reported.is_some() {
            tracing::info!(
                offset_ms = offset.0 / 1000,
                "this server's clock is close to the database's again"
            );
            self.reported = None;
        }
        Ok(())
    }
}

pub(super) async fn set_health(reporter: &HealthReporter, status: ServingStatus) {
    reporter.set_service_status("", status).await;
    reporter
        .set_service_status(super::LEDGER_SERVICE, status)
        .await;
}
