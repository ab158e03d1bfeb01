//! The window of intent, for a call that names no run (the MCP gateway's): an identical call
//! (same tenant, tool and canonical arguments) less than the window after the last one is the
//! same intent, concurrent first calls are one intent, and a call after a quiet window is a new
//! one; a call whose last intent is still unresolved (in flight, unknown, awaiting a decision)
//! is that intent whatever the time, so that an outcome nobody knows is never acted on again.

use std::time::Duration;

use super::{Ledger, new_claim_token};
use crate::domain::canonical::Canonicalization;
use crate::domain::{ClaimKey, Key, Micros, RunId, Tenant, ToolName};
use crate::error::LedgerError;
use crate::storage::IntentWindow;

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
        let window = IntentWindow {
            fingerprint: &fingerprint,
            now: self.clock.now(),
            within: Micros::from_duration(within),
        };
        let key_for = |generation| {
            Key::derive(
                &window_run_id(&fingerprint, generation),
                tool,
                &canonical,
                mode,
            )
        };
        let (generation, _) = self
            .store
            .count_window(tenant, &window, &key_for, None)
            .await?;
        Ok(window_run_id(&fingerprint, generation))
    }
}

impl Ledger {
    /// Claims a call that names no run (`input.key` is replaced) in the run of its window of
    /// intent ([`Ledger::window_run`] with `within`): one request of a client that cannot keep
    /// the window itself (the gateway). An ungated call's window is counted and its entry
    /// inserted in one store call ([`Store::count_window`](crate::storage::Store::count_window)); any other case (the entry
    /// exists, a person must decide) is then a claim in the window's run like any other.
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
        let (fingerprint, window_canonical, _) =
            self.canonical_request(&input.tool, &input.arguments_json, Canonicalization::Jcs)?;
        // Everything but the run is checked once, before anything is written.
        input.key = ClaimKey::Derived(window_run_id(&fingerprint, 1));
        let request = self.prepare_claim(tenant, input.clone())?;
        if request.gate.is_some() {
            let run = self
                .window_run(tenant, &input.tool, &input.arguments_json, within)
                .await?;
            input.key = ClaimKey::Derived(run);
            return self.claim(tenant, input).await;
        }
        let mode = input.canonicalization;
        let canonical = match mode {
            Canonicalization::Jcs => window_canonical,
            _ => {
                self.canonical_request(&input.tool, &input.arguments_json, mode)?
                    .1
            }
        };
        let now = self.clock.now();
        let token = new_claim_token()?;
        let run = |generation| window_run_id(&fingerprint, generation);
        let key_for = |generation| Key::derive(&run(generation), &input.tool, &canonical, mode);
        let entry_for = |generation: u64| {
            request
                .in_run(run(generation), &canonical, mode)
                .new_entry(now, 1, token.clone())
        };
        let window = IntentWindow {
            fingerprint: &fingerprint,
            now,
            within: Micros::from_duration(within),
        };
        let (generation, inserted) = self
            .store
            .count_window(tenant, &window, &key_for, Some(&entry_for))
            .await?;
        if inserted {
            return Ok(self.claimed(entry_for(generation), now));
        }
        input.key = ClaimKey::Derived(window_run_id(&fingerprint, generation));
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
