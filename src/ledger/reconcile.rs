//! Reconcile: apply what reconcilers found about unknown outcomes, then hand out the next
//! unresolved entries, held for the caller.

use std::time::Duration;

use super::{EntryView, Ledger, MAX_RACES};
use crate::domain::Tenant;
use crate::domain::key::{ExplicitKey, Key, Principal, ToolName};
use crate::domain::{Completion, Entry, FinalStatus, Micros, Status};
use crate::error::LedgerError;
use crate::storage::UnresolvedQuery;

/// What a reconciler found out about one entry.
#[derive(Clone, Debug)]
pub struct ResolutionInput {
    /// The entry's key.
    pub key: String,
    /// `Succeeded` when the effect was found, `Failed` when it was not.
    pub status: FinalStatus,
    /// The result found, with `Succeeded`.
    pub result: Vec<u8>,
    /// What was (not) found, with `Failed`.
    pub error: String,
    /// With `Failed`: may the intent be tried again.
    pub retryable: bool,
}

/// A Reconcile: which unresolved entries to hand out, and the answers about earlier ones.
#[derive(Clone, Debug, Default)]
pub struct ReconcileInput {
    /// Only entries whose attempt started at least this long ago.
    pub older_than: Option<Duration>,
    /// Only entries of this tool; empty for all.
    pub tool: String,
    /// How many to hand out; 0 for the server's default.
    pub limit: u32,
    /// Findings to apply first.
    pub resolutions: Vec<ResolutionInput>,
    /// Apply the resolutions only: hand out (and hold) nothing new.
    pub resolve_only: bool,
    /// Hand out only these keys (each if unresolved and not held by another reconciler);
    /// empty for any unresolved entry.
    pub keys: Vec<String>,
    /// Who reconciles: recorded as `resolved_by` on every entry a resolution settles.
    pub principal: String,
}

/// The answer to a Reconcile.
#[derive(Clone, Debug)]
pub struct ReconcileOutput {
    /// Unresolved entries, oldest first, now held for the caller.
    pub pending: Vec<EntryView>,
    /// The entries the resolutions named, as they stand afterwards.
    pub resolved: Vec<EntryView>,
}

impl Ledger {
    /// Applies what reconcilers found, then hands out up to `limit` unresolved entries, oldest
    /// first, holding each for this caller for the reconcile lease.
    ///
    /// A resolution applies only to an entry whose outcome is unknown; an entry already
    /// resolved (by its claimant's late Complete, or another reconciler) is returned as it
    /// stands, and a key that does not exist for this tenant is left out of `resolved`.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed request (checked whole before anything is written);
    /// `Unavailable`/`Internal` from the store.
    pub async fn reconcile(
        &self,
        tenant: &Tenant,
        input: ReconcileInput,
    ) -> Result<ReconcileOutput, LedgerError> {
        let max = self.limits.reconcile_max_limit;
        if input.resolutions.len() > max as usize {
            return Err(LedgerError::invalid(
                "resolutions",
                format!(
                    "{} resolutions; at most {max} per call",
                    input.resolutions.len()
                ),
            ));
        }
        let tool = if input.tool.is_empty() {
            None
        } else {
            Some(ToolName::parse(&input.tool)?)
        };
        let principal = Principal::parse(&input.principal)?;
        if input.keys.len() > max as usize {
            return Err(LedgerError::invalid(
                "keys",
                format!("{} keys; at most {max} per call", input.keys.len()),
            ));
        }
        let mut keys = Vec::with_capacity(input.keys.len());
        for (i, k) in input.keys.iter().enumerate() {
            let key = ExplicitKey::parse(k)
                .map_err(|e| LedgerError::invalid("keys", format!("[{i}]: {}", e.message)))?;
            let key = Key::from(key);
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        let mut checked = Vec::with_capacity(input.resolutions.len());
        for (i, r) in input.resolutions.into_iter().enumerate() {
            let key = ExplicitKey::parse(&r.key).map_err(|e| {
                LedgerError::invalid("resolutions", format!("[{i}].key: {}", e.message))
            })?;
            if r.status == FinalStatus::Unknown {
                return Err(LedgerError::invalid(
                    "resolutions",
                    format!("[{i}].status must be STATUS_SUCCEEDED or STATUS_FAILED"),
                ));
            }
            let completion = Completion::new(r.status, r.result, r.error, r.retryable)
                .map_err(LedgerError::from)
                .and_then(|c| self.check_size(&c).map(|()| c))
                .map_err(|e| match e {
                    LedgerError::InvalidArgument {
                        reason,
                        message,
                        field,
                    } => LedgerError::InvalidArgument {
                        field: "resolutions",
                        reason,
                        message: format!("[{i}].{field} {message}"),
                    },
                    other => other,
                })?;
            checked.push((Key::from(key), completion));
        }

        let mut resolved = Vec::with_capacity(checked.len());
        for (key, completion) in checked {
            if let Some(view) = self
                .resolve_one(tenant, &key, &completion, &principal)
                .await?
            {
                resolved.push(view);
            }
        }

        if input.resolve_only {
            return Ok(ReconcileOutput {
                pending: Vec::new(),
                resolved,
            });
        }
        let now = self.clock.now();
        let limit = match input.limit {
            0 if !keys.is_empty() => max,
            0 => self.limits.reconcile_default_limit,
            n => n.min(max),
        };
        keys.truncate(limit as usize);
        let older_than = input
            .older_than
            .map(Micros::from_duration)
            .unwrap_or_default();
        let query = UnresolvedQuery {
            now,
            started_before: now.minus(older_than),
            tool,
            limit,
            hold_until: now.plus(Micros::from_duration(self.limits.reconcile_lease)),
            keys,
        };
        let pending = self
            .store
            .take_unresolved(tenant, &query)
            .await?
            .into_iter()
            .map(|e| self.view(e, now))
            .collect();
        Ok(ReconcileOutput { pending, resolved })
    }

    /// Applies one resolution, re-reading when a concurrent writer changed the entry.
    async fn resolve_one(
        &self,
        tenant: &Tenant,
        key: &Key,
        completion: &Completion,
        principal: &Principal,
    ) -> Result<Option<EntryView>, LedgerError> {
        for _ in 0..MAX_RACES {
            let now = self.clock.now();
            let Some(existing) = self.store.get(tenant, key).await? else {
                return Ok(None);
            };
            if existing.is_expired(now) {
                return Ok(None);
            }
            if existing.effective_status(now) != Status::Unknown {
                // Resolved already, or an attempt still in flight: nothing to reconcile.
                let existing = self.with_unwritten_replays(tenant, existing);
                return Ok(Some(self.view(existing, now)));
            }
            let done = Entry {
                resolved_by: principal.clone(),
                ..completion.apply_to(&existing, now)
            };
            if let Some(has_waiters) = self.store.resolve(tenant, &done, now).await? {
                self.memory.remember(tenant, &done);
                self.changed(tenant, key, has_waiters).await;
                return Ok(Some(self.view(done, now)));
            }
        }
        Err(LedgerError::Internal(format!(
            "resolution of {key} lost {MAX_RACES} races in a row"
        )))
    }
}
