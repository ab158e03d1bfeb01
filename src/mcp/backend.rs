//! Where the gateway claims its calls: a ledger in this process (on the embedded store or a
//! PostgreSQL database), or a ledger server over gRPC (`--ledger URL`). Both answer in the
//! ledger's own terms, so the gateway governs a call the same way whichever it has.

mod remote;

use std::time::Duration;

pub use remote::{Remote, RemoteError};

use crate::domain::{HoldToken, Key, Principal, Tenant};
use crate::error::LedgerError;
use crate::ledger::{
    ClaimInput, ClaimOutput, CompleteInput, CompleteOutput, DecideInput, Decided, Ledger,
    ReconcileInput, RenewInput, ResolutionInput, ResolutionOutcome,
};

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
