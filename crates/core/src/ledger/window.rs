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
    /// The run of a call of `tool` with `arguments_json` that names none: `window-<n>`, the
    /// `n`th intent of that call, counted as the module says with `within` as the window.
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
                let key = Key::derive(&window_run_id(generation), tool, &canonical, mode);
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
        Ok(window_run_id(generation))
    }
}

/// The run of a call's `generation`th intent window.
fn window_run_id(generation: u64) -> RunId {
    RunId::from_stored(format!("window-{generation}"))
}
