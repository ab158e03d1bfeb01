//! What a person does with evidence: reads an entry's history, sees the entries marked as a
//! possible double effect, and acknowledges a mark once dealt with.

use super::{EntryView, Ledger};
use crate::domain::Tenant;
use crate::domain::fields::Principal;
use crate::domain::key::Key;
use crate::domain::{EventKind, HistoryEvent};
use crate::error::LedgerError;

/// The longest note a person may leave with an acknowledgement.
pub const MAX_NOTE_BYTES: usize = 1024;

/// An acknowledgement of a possible double effect, its key and principal parsed where it
/// arrived.
#[derive(Clone, Debug)]
pub struct AcknowledgeInput {
    /// The entry's key.
    pub key: Key,
    /// What the person found or did; kept in the history.
    pub note: String,
    /// Who acknowledges.
    pub principal: Principal,
}

impl Ledger {
    /// The history of the entry `key` (oldest first); empty for an entry without one.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed key; `Unavailable`/`Internal` from the store.
    pub async fn history(
        &self,
        tenant: &Tenant,
        key: &Key,
    ) -> Result<Vec<HistoryEvent>, LedgerError> {
        Ok(self.store.history(tenant, key).await?)
    }

    /// Up to `limit` of the tenant's entries marked as a possible double effect, oldest first,
    /// with the arguments kept for audit.
    ///
    /// # Errors
    /// `Unavailable`/`Internal` from the store.
    pub async fn double_effects(
        &self,
        tenant: &Tenant,
        limit: u32,
    ) -> Result<Vec<EntryView>, LedgerError> {
        let now = self.clock.now();
        let entries = self.store.double_effects(tenant, limit).await?;
        Ok(entries
            .into_iter()
            .map(|e| self.audit_view(self.with_unwritten_replays(tenant, e), now))
            .collect())
    }

    /// Clears the entry's mark of a possible double effect and keeps the acknowledgement (who,
    /// when, the note) in its history, in one transaction.
    ///
    /// # Errors
    /// `InvalidArgument` for a note over 1 KiB or with control characters; `NotFound` when
    /// there is no entry; `NotMarked` when it carries no mark; `Unavailable`/`Internal` from
    /// the store. None of them changes anything.
    pub async fn acknowledge_double_effect(
        &self,
        tenant: &Tenant,
        input: AcknowledgeInput,
    ) -> Result<EntryView, LedgerError> {
        let AcknowledgeInput { key, principal, .. } = input;
        if input.note.len() > MAX_NOTE_BYTES {
            return Err(LedgerError::invalid(
                "note",
                format!("is {} bytes; at most {MAX_NOTE_BYTES}", input.note.len()),
            ));
        }
        if input.note.chars().any(|c| c.is_control() && c != '\n') {
            return Err(LedgerError::invalid(
                "note",
                "must not hold control characters",
            ));
        }
        let now = self.clock.now();
        let Some(existing) = self.store.get(tenant, &key).await? else {
            return Err(LedgerError::NotFound);
        };
        if existing.is_expired(now) {
            return Err(LedgerError::NotFound);
        }
        let note = HistoryEvent {
            at: now,
            attempt: existing.attempt,
            kind: EventKind::DoubleEffectAcknowledged,
            principal: principal.clone(),
            detail: input.note,
        };
        match self
            .store
            .acknowledge_double_effect(tenant, &key, &note)
            .await?
        {
            Some(entry) => {
                tracing::info!(
                    key = key.log_prefix(),
                    attempt = entry.attempt,
                    principal = %principal,
                    "a possible double effect was acknowledged"
                );
                Ok(self.audit_view(self.with_unwritten_replays(tenant, entry), now))
            }
            None => Err(LedgerError::NotMarked),
        }
    }
}
