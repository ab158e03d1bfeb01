//! RenewLease: the holder of the current claim extends its lease while its action runs.

use std::time::Duration;

use super::{EntryView, Ledger, bounded};
use crate::domain::Tenant;
use crate::domain::fields::ClaimToken;
use crate::domain::key::Key;
use crate::domain::{Micros, RenewDecision, decide_renew};
use crate::error::LedgerError;

/// A RenewLease, its key and token parsed where it arrived.
#[derive(Clone, Debug)]
pub struct RenewInput {
    /// The entry's key.
    pub key: Key,
    /// The token of the claim that holds the attempt.
    pub claim_token: ClaimToken,
    /// The new lease, from now; `None` for the server's default.
    pub lease: Option<Duration>,
}

impl Ledger {
    /// Extends the lease of the caller's own attempt to `lease` from now, while that lease has
    /// not ended.
    ///
    /// # Errors
    /// `InvalidArgument` for a lease above `--max-lease`; `NotFound`;
    /// `StaleClaimToken` when the token is not the current attempt's; `LeaseEnded` when the
    /// entry is resolved, reported UNKNOWN or past its lease (nothing changes); store errors.
    pub async fn renew_lease(
        &self,
        tenant: &Tenant,
        input: RenewInput,
    ) -> Result<EntryView, LedgerError> {
        let RenewInput {
            key,
            claim_token: token,
            ..
        } = input;
        let lease = bounded(
            "lease",
            input.lease,
            self.limits.default_lease,
            self.limits.max_lease,
        )?;
        let now = self.clock.now();
        let until = now.plus(Micros::from_duration(lease));
        // The common case in one statement; a read only to say why it did not apply.
        if let Some(entry) = self.store.renew(tenant, &key, &token, until, now).await? {
            return Ok(self.view(entry, now));
        }
        let Some(existing) = self.store.get(tenant, &key).await? else {
            return Err(LedgerError::NotFound);
        };
        let now = self.clock.now();
        match decide_renew(&existing, &token, now) {
            RenewDecision::NotFound => Err(LedgerError::NotFound),
            RenewDecision::StaleToken => Err(LedgerError::StaleClaimToken),
            RenewDecision::LeaseEnded => Err(LedgerError::LeaseEnded(
                existing.effective_status(now).as_str(),
            )),
            // The statement did not apply, yet the entry read afterwards would: only a clock
            // that went backwards between the two explains it.
            RenewDecision::Apply => Err(LedgerError::Internal(format!(
                "renewal of {key} did not apply to an attempt in its lease"
            ))),
        }
    }
}
