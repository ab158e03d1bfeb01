//! The server's background tasks: writing the replay counts answered from memory, recording
//! lapsed approvals when they happen, pruning expired entries, and re-reading the credentials
//! and the approval policy on request (SIGHUP).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio_stream::{Stream, StreamExt as _};

use super::health::Readiness;
use tokio::task::JoinHandle;

use super::{ServerTls, Settings, approval_policy};
use crate::credentials::{Credentials, Reload};
use crate::ledger::Ledger;
use crate::observe::Metrics;

/// Starts the server's background tasks: the relay of other servers' announcements (when
/// waiters are woken by LISTEN), the re-reading on `reloads`, the replay counts' writer, the
/// recording of lapsed approvals, and the sweep of expired entries.
pub(super) fn start(
    settings: &Settings,
    ledger: &Ledger,
    metrics: &Arc<Metrics>,
    state: &Arc<Readiness>,
    credentials: &Credentials,
    tls: &Option<Arc<ServerTls>>,
    reloads: impl Stream<Item = ()> + Send + 'static,
) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    if settings.listens()
        && let Some(relay) = ledger.listen_for_announcements()
    {
        tasks.push(relay);
    }
    let policy = settings
        .approval_policy
        .clone()
        .map(|file| (file, ledger.clone()));
    tasks.push(tokio::spawn(reload_loop(
        reloads,
        credentials.clone(),
        tls.clone(),
        policy,
    )));
    tasks.push(tokio::spawn(replay_count_loop(ledger.clone())));
    tasks.push(tokio::spawn(lapse_loop(
        ledger.clone(),
        state.clone(),
        metrics.clone(),
        settings.prune_interval,
        settings.prune_batch_size,
    )));
    tasks.push(tokio::spawn(prune_loop(
        ledger.clone(),
        state.clone(),
        metrics.clone(),
        settings.prune_interval,
        settings.prune_batch_size,
    )));
    tasks
}

/// Records each lapse of a request or an approval when it happens: sleeps until the earliest
/// deadline among the calls awaiting a decision (every server sharing the store does; the
/// write is fenced, so one records it), waking early on this server's approval events (a new
/// request or approval may be due sooner), and at least every `interval` (other servers'
/// events). Reads say a lapse from its moment whatever this loop does; this records it, with
/// its history event, log line and count.
async fn lapse_loop(
    ledger: Ledger,
    state: Arc<Readiness>,
    metrics: Arc<Metrics>,
    interval: std::time::Duration,
    batch: u32,
) {
    // A little after the deadline, so that the database's clock has passed it too.
    const MARGIN: std::time::Duration = std::time::Duration::from_millis(5);
    loop {
        let changed = ledger.approvals().changed();
        let next = if state.migrated.load(Ordering::Acquire) {
            ledger.next_lapse().await.unwrap_or_else(|e| {
                tracing::debug!(error = %e, "the next lapse could not be read; polling");
                None
            })
        } else {
            None
        };
        let sleep = next.map_or(interval, |left| (left + MARGIN).min(interval));
        tokio::select! {
            () = tokio::time::sleep(sleep) => {}
            () = changed => continue,
        }
        if !state.migrated.load(Ordering::Acquire) {
            continue;
        }
        match ledger.expire_lapsed_approvals(batch).await {
            Ok(_) => metrics.approvals_expired(ledger.approvals().take_expired()),
            Err(e) => {
                metrics.call_failed(&e);
                tracing::warn!(error = %e, "recording lapsed approvals failed; retrying next interval");
            }
        }
    }
}

/// Writes the replay counts of repeats answered from memory every
/// [`crate::ledger::REPLAY_COUNT_INTERVAL`]; a failed write keeps them for the next, and is
/// logged once until a write succeeds again.
async fn replay_count_loop(ledger: Ledger) {
    let mut failing = false;
    loop {
        tokio::time::sleep(crate::ledger::REPLAY_COUNT_INTERVAL).await;
        match ledger.flush_replay_counts().await {
            Ok(_) => failing = false,
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, "replay counts could not be written; kept for the next try");
            }
            Err(_) => {}
        }
    }
}

/// Deletes expired finished entries every `interval`, once migrations ran (keeping paused
/// runs' entries first: [`Ledger::prune`]).
async fn prune_loop(
    ledger: Ledger,
    state: Arc<Readiness>,
    metrics: Arc<Metrics>,
    interval: std::time::Duration,
    batch: u32,
) {
    loop {
        tokio::time::sleep(interval).await;
        if !state.migrated.load(Ordering::Acquire) {
            continue;
        }
        match ledger.prune(batch).await {
            Ok(0) => {}
            Ok(n) => {
                metrics.pruned(n);
                tracing::info!(deleted = n, "pruned expired entries");
            }
            Err(e) => {
                metrics.call_failed(&e);
                tracing::warn!(error = %e, "pruning failed; retrying next interval");
            }
        }
    }
}

/// Re-reads the credentials (and the approval policy, when there is one) each time `reloads`
/// yields, until it ends.
async fn reload_loop(
    reloads: impl Stream<Item = ()> + Send + 'static,
    credentials: Credentials,
    tls: Option<Arc<ServerTls>>,
    policy: Option<(std::path::PathBuf, Ledger)>,
) {
    let mut reloads = std::pin::pin!(reloads);
    while reloads.next().await.is_some() {
        // The files are small and local, read once per signal: not worth a blocking thread.
        reload(&credentials, tls.as_deref());
        if let Some((file, ledger)) = &policy {
            match approval_policy(Some(file)) {
                Ok(policy) => {
                    tracing::info!(
                        rules = policy.len(),
                        "reload: the approval policy is in force"
                    );
                    ledger.approvals().set_policy(policy);
                }
                Err(e) => tracing::warn!(
                    error = %e,
                    "reload: the approval policy was not taken; the rules in force are kept"
                ),
            }
        }
    }
}

/// Re-reads the tokens file and the TLS files, each put in force whole or not at all, and
/// logs what became of each (never a token or a key).
fn reload(credentials: &Credentials, tls: Option<&ServerTls>) {
    let tokens = credentials.reload();
    match &tokens {
        Ok(Reload::NotConfigured) => {}
        Ok(Reload::Replaced {
            tenancy,
            added,
            removed,
        }) => tracing::info!(
            tenancy = %tenancy,
            added,
            removed,
            "reload: the tokens file is in force"
        ),
        Err(e) => tracing::warn!(
            error = %e,
            "reload: the tokens file was not taken; the credentials in force are kept"
        ),
    }
    match tls {
        None => {}
        Some(tls) => match tls.reload() {
            Ok(()) => tracing::info!(
                "reload: the TLS certificate and key are in force for new connections"
            ),
            Err(e) => tracing::warn!(
                error = %e,
                "reload: the TLS files were not taken; the certificate in force is kept"
            ),
        },
    }
    if tokens == Ok(Reload::NotConfigured) && tls.is_none() {
        tracing::info!(
            "reload: nothing to re-read (neither --auth-tokens-file nor --tls-cert is set)"
        );
    }
}
