//! The window of intent, for a call that names no run (the MCP gateway's): an identical call
//! (same tenant, tool and canonical arguments) less than the window after the last one is the
//! same intent, concurrent first calls are one intent, and a call after a quiet window is a new
//! one; a call whose last intent is still unresolved (in flight, unknown, awaiting a decision)
//! is that intent whatever the time, so that an outcome nobody knows is never acted on again.

use std::time::Duration;

use super::Ledger;
use crate::domain::canonical::Canonicalization;
use crate::domain::{Key, Micros, RunId, Status, Tenant, ToolName};
use crate::error::LedgerError;

impl Ledger {
    /// The run of a call of `tool` with `arguments_json` that names none: `window-<call>-<n>`,
    /// the `n`th intent of that call, counted as the module says with `within` as the window.
    ///
    /// # Errors
    /// `InvalidArgument` for arguments that are not a JSON object (as Claim refuses them);
    /// `Unavailable`/`Internal` from the store.
    pub async fn window_run(
        &self,
        tenant: &Tenant,
        tool: &ToolName,
        arguments_json: &str,
        within: Duration,
    ) -> Result<RunId, LedgerError> {
        let mode = Canonicalization::Jcs;
        let (fingerprint, canonical, _) = self.canonical_request(tool, arguments_json, mode)?;
        let now = self.clock.now();
        let unresolved = match self
            .store
            .current_intent_generation(tenant, &fingerprint)
            .await?
        {
            Some(generation) => {
                let key = Key::derive(
                    &window_run_id(&fingerprint, generation),
                    tool,
                    &canonical,
                    mode,
                );
                self.store
                    .get(tenant, &key)
                    .await?
                    .map(|e| e.as_of(now))
                    .is_some_and(|e| {
                        matches!(
                            e.status,
                            Status::Attempting | Status::Unknown | Status::AwaitingApproval
                        )
                    })
            }
            None => false,
        };
        let generation = self
            .store
            .intent_generation(
                tenant,
                &fingerprint,
                now,
                Micros::from_duration(within),
                unresolved,
            )
            .await?;
        Ok(window_run_id(&fingerprint, generation))
    }
}

impl Ledger {
    /// Claims a call that names no run (`input.key` is replaced) in the run of its window of
    /// intent ([`Ledger::window_run`] with `within`): one request of a client that cannot keep
    /// the window itself (the gateway in front of a ledger server).
    ///
    /// # Errors
    /// `InvalidArgument` (field `same_intent_within`) for a window of zero or longer than the
    /// longest retention, and what [`Ledger::window_run`] and [`Ledger::claim`] refuse.
    pub async fn claim_within(
        &self,
        tenant: &Tenant,
        mut input: super::ClaimInput,
        within: Duration,
    ) -> Result<super::ClaimOutput, LedgerError> {
        if within.is_zero() || within > self.limits.max_retention {
            return Err(LedgerError::invalid(
                "same_intent_within",
                format!(
                    "must be more than 0 and at most the longest retention ({})",
                    crate::defaults::shown(self.limits.max_retention)
                ),
            ));
        }
        let run = self
            .window_run(tenant, &input.tool, &input.arguments_json, within)
            .await?;
        input.key = crate::domain::ClaimKey::Derived(run);
        self.claim(tenant, input).await
    }
}

/// The run of the `generation`th intent of the call whose fingerprint is `fingerprint`:
/// `window-<the fingerprint's first 16 hex digits>-<generation>`. Each intent is a run of its
/// own, as a run of an agent is one task: a call awaiting a decision keeps its own run's
/// entries, not every call through the gateway, and a run reads the calls it made.
fn window_run_id(fingerprint: &str, generation: u64) -> RunId {
    let short = fingerprint.get(..16).unwrap_or(fingerprint);
    RunId::from_stored(format!("window-{short}-{generation}"))
}
