//! Where the gateway claims its calls: a ledger in this process (on the embedded store or a
//! PostgreSQL database), or a ledger server over gRPC (`--ledger URL`). Both answer in the
//! ledger's own terms, so the gateway governs a call the same way whichever it has.

mod remote;

use std::sync::Arc;
use std::time::Duration;

pub use remote::{Remote, RemoteError};

use super::{McpArgs, McpError};
use crate::domain::time::{AlignedClock, Clock};
use crate::domain::{HoldToken, Key, Principal, Tenant};
use crate::error::LedgerError;
use crate::ledger::{
    ClaimInput, ClaimOutput, CompleteInput, CompleteOutput, DecideInput, Decided, Ledger,
    ReconcileInput, RenewInput, ResolutionInput, ResolutionOutcome,
};
use crate::server::ClockAlignment;
use crate::storage::{self, PoolOptions, redact_url};

/// The ledger the gateway claims its calls in.
pub enum Backend {
    /// In this process: the gateway keeps the store's upkeep (lapses, pruning) and can serve
    /// the console.
    Local(Ledger),
    /// A ledger server: its tenant is the `--ledger-token`'s, and the server keeps its store.
    Remote(Remote),
}

impl Backend {
    /// The ledger in this process, when the gateway has one.
    #[must_use]
    pub fn local(&self) -> Option<&Ledger> {
        match self {
            Backend::Local(ledger) => Some(ledger),
            Backend::Remote(_) => None,
        }
    }

    /// Claims `input` for `tenant`; with `window`, in the run of the call's window of intent
    /// (`input.key` is then replaced by it).
    ///
    /// # Errors
    /// What the ledger refuses, or why it could not be asked.
    pub async fn claim(
        &self,
        tenant: &Tenant,
        input: ClaimInput,
        window: Option<Duration>,
    ) -> Result<ClaimOutput, LedgerError> {
        match (self, window) {
            (Backend::Local(ledger), Some(within)) => {
                ledger.claim_within(tenant, input, within).await
            }
            (Backend::Local(ledger), None) => ledger.claim(tenant, input).await,
            (Backend::Remote(remote), window) => remote.claim(input, window).await,
        }
    }

    /// Records an attempt's outcome.
    ///
    /// # Errors
    /// What the ledger refuses, or why it could not be asked.
    pub async fn complete(
        &self,
        tenant: &Tenant,
        input: CompleteInput,
    ) -> Result<CompleteOutput, LedgerError> {
        match self {
            Backend::Local(ledger) => ledger.complete(tenant, input).await,
            Backend::Remote(remote) => remote.complete(input).await,
        }
    }

    /// Extends an attempt's lease.
    ///
    /// # Errors
    /// `LeaseEnded` or `StaleClaimToken` when the attempt is no longer this one's to extend.
    pub async fn renew_lease(&self, tenant: &Tenant, input: RenewInput) -> Result<(), LedgerError> {
        match self {
            Backend::Local(ledger) => ledger.renew_lease(tenant, input).await.map(|_| ()),
            Backend::Remote(remote) => remote.renew_lease(input).await,
        }
    }

    /// Records a person's decision, taken as `approver` (a ledger server records the
    /// gateway's credential as the approver, and `approver` in the reason).
    ///
    /// # Errors
    /// What the ledger refuses (the request lapsed, was decided, or names other arguments).
    pub async fn decide(
        &self,
        tenant: &Tenant,
        input: DecideInput,
        approver: &Principal,
    ) -> Result<Decided, LedgerError> {
        match self {
            Backend::Local(ledger) => ledger.decide(tenant, input, approver).await,
            Backend::Remote(remote) => remote.decide(input, approver).await,
        }
    }

    /// Takes the entry `key` for a paired read (Reconcile with its key, as `principal`): its
    /// attempt and the hold a finding must name; `None` when it is not handed out (resolved,
    /// or held by another reader).
    ///
    /// # Errors
    /// What the ledger refuses, or why it could not be asked.
    pub async fn take(
        &self,
        tenant: &Tenant,
        key: &Key,
        principal: Principal,
    ) -> Result<Option<(u32, HoldToken)>, LedgerError> {
        let input = ReconcileInput {
            keys: vec![key.clone()],
            limit: 1,
            principal,
            ..ReconcileInput::default()
        };
        let pending = match self {
            Backend::Local(ledger) => ledger.reconcile(tenant, input).await?.pending,
            Backend::Remote(remote) => remote.reconcile(input).await?.0,
        };
        Ok(pending
            .into_iter()
            .find(|e| e.entry.key == *key)
            .map(|e| (e.entry.attempt, e.entry.hold_token)))
    }

    /// Sends one finding of a paired read (as `principal`); whether it settled the entry.
    ///
    /// # Errors
    /// What the ledger refuses, or why it could not be asked.
    pub async fn send_finding(
        &self,
        tenant: &Tenant,
        finding: ResolutionInput,
        principal: Principal,
    ) -> Result<bool, LedgerError> {
        let input = ReconcileInput {
            resolutions: vec![finding],
            resolve_only: true,
            principal,
            ..ReconcileInput::default()
        };
        let first = match self {
            Backend::Local(ledger) => ledger
                .reconcile(tenant, input)
                .await?
                .results
                .first()
                .map(|r| r.outcome == ResolutionOutcome::Applied),
            Backend::Remote(remote) => remote.reconcile(input).await?.1.first().copied(),
        };
        Ok(first.unwrap_or(false))
    }
}

/// The gateway's ledger as the command line names it: a ledger server (`--ledger`), else a
/// store of its own (`--database-url`, else the embedded one), opened and migrated, with the
/// alignment of the clock to its database.
pub(super) async fn open(
    args: &McpArgs,
    clock: &Arc<AlignedClock>,
    policy_lines: usize,
) -> Result<(Backend, Option<(Arc<dyn storage::Store>, ClockAlignment)>), McpError> {
    if let Some(url) = &args.ledger {
        one_tenant_for_the_ledger(args)?;
        let remote = Remote::new(url, args.ledger_token.as_deref(), args.ledger_ca.as_deref())
            .map_err(|e| McpError::Config(e.to_string()))?;
        log_start(args, url, policy_lines);
        return Ok((Backend::Remote(remote), None));
    }
    let url = match &args.database_url {
        Some(url) => url.clone(),
        None => super::default_store()?,
    };
    let store = storage::open(&url, &PoolOptions::default()).await?;
    store.migrate().await?;
    let mut alignment = ClockAlignment::default();
    if let Err(e) = alignment.align(&*store, &**clock).await {
        tracing::warn!(error = %e, "the database's clock could not be read; the local clock is used");
    }
    let ledger = Ledger::new(
        store.clone(),
        clock.clone() as Arc<dyn Clock>,
        super::limits(args.confirm_after),
    );
    log_start(args, &redact_url(&url), policy_lines);
    Ok((Backend::Local(ledger), Some((store, alignment))))
}

/// With `--ledger` every call is the `--ledger-token`'s tenant: a tokens file naming several
/// tenants would put their calls in one, so it is refused.
fn one_tenant_for_the_ledger(args: &McpArgs) -> Result<(), McpError> {
    let Some(file) = &args.auth_tokens_file else {
        return Ok(());
    };
    let tenancy = crate::credentials::Tenancy::from_file(file).map_err(McpError::Config)?;
    if tenancy.tenant_count() > 1 {
        return Err(McpError::Config(format!(
            "{} names {} tenants, but with --ledger every call is recorded for the tenant of \
             --ledger-token: run one gateway per tenant, each with its tenant's tokens",
            file.display(),
            tenancy.tenant_count()
        )));
    }
    Ok(())
}

/// The start-up line: where the calls are claimed, the upstream, the transport, the policy.
fn log_start(args: &McpArgs, ledger: &str, policy_lines: usize) {
    tracing::info!(
        ledger = %ledger,
        upstream = %args.upstream.clone().unwrap_or_else(|| super::shown(&args.command)),
        transport = if args.listen.is_some() { "http" } else { "stdio" },
        policy_lines,
        "idempotency-ledger mcp gateway starting"
    );
}
