//! The paired read: when a governed call's outcome is unknown and the policy names a read
//! (`confirm READ_TOOL …`), the gateway asks the upstream whether the effect happened, as a
//! reconciler would: it waits until the outcome has been unknown for `--confirm-after` (an
//! effect may still be landing right after the answer was lost), takes the entry with
//! Reconcile (so that no other reconciler asks at once), calls the read, and sends what it read
//! as a finding fenced by the attempt and the hold it was handed. A read that cannot tell
//! leaves the outcome unknown.

use std::sync::atomic::Ordering;

use serde_json::Value;
use tokio::sync::watch;

use super::{Answer, Call, Gateway, Upstream};
use crate::domain::{FinalStatus, HoldToken, Key, Micros, Tenant};
use crate::ledger::{EntryView, ResolutionInput};
use crate::mcp::answers::performed_without_result;
use crate::mcp::policy::Confirm;

/// What the paired read settled.
#[derive(Debug)]
pub(super) enum Settled {
    /// The effect was found: the entry is SUCCEEDED with what stands for its result (the
    /// stored bytes: [`performed_without_result`]).
    Found(Vec<u8>),
    /// It was not: the entry failed retryably, and the call may act again.
    NotFound,
    /// Nothing was settled (the read could not tell, someone else holds the entry, the ledger
    /// or the upstream did not answer): the outcome stays unknown.
    Unsettled,
}

impl Gateway {
    /// Settles the unknown `entry` of `call` with the paired read `confirm`.
    pub(super) async fn settle(
        &self,
        call: &Call<'_>,
        entry: &EntryView,
        confirm: &Confirm,
        upstream: &dyn Upstream,
    ) -> Settled {
        let key = &entry.entry.key;
        // An UNKNOWN report ends the lease at the report: the outcome is unknown since then.
        let since = entry.entry.lease_expires_at;
        let ready = since.plus(Micros::from_duration(self.rules.confirm_after));
        let now = Micros::now();
        if ready > now {
            tokio::time::sleep(ready.minus(now).to_duration()).await;
        }
        let Some((attempt, hold)) = self.take(&call.tenant, key).await else {
            return Settled::Unsettled;
        };
        let arguments = confirm.read_arguments(&call.arguments, &entry.external_ref, key.as_str());
        let n = self.reads.fetch_add(1, Ordering::Relaxed);
        let read = serde_json::json!({
            "jsonrpc": "2.0",
            "id": format!("idempotency-ledger-gateway:read:{n}"),
            "method": "tools/call",
            "params": {"name": confirm.tool, "arguments": arguments, "_meta": protocol_meta(call)},
        });
        let (_never, cancelled) = watch::channel(false);
        let answered =
            tokio::time::timeout(self.rules.call_timeout, upstream.call(read, cancelled));
        let result = match answered.await {
            Ok(Answer::Response(response)) => response.get("result").cloned(),
            _ => None,
        };
        let found = result.as_ref().and_then(|r| confirm.reads(r));
        tracing::info!(
            key = key.log_prefix(),
            read = confirm.tool.as_str(),
            found = ?found,
            "the paired read answered about an unknown outcome"
        );
        let (status, stored, error) = match (found, &result) {
            (Some(true), Some(r)) => (
                FinalStatus::Succeeded,
                serde_json::to_vec(&performed_without_result(
                    r,
                    &format!(
                        "This action was performed: its answer was lost, and {} found its \
                         effect. No new action was taken; do not repeat it.",
                        confirm.tool
                    ),
                    key.as_str(),
                ))
                .unwrap_or_default(),
                String::new(),
            ),
            (Some(false), _) => (
                FinalStatus::Failed,
                Vec::new(),
                format!("{} found no trace of the effect", confirm.tool),
            ),
            _ => return Settled::Unsettled,
        };
        let finding = ResolutionInput {
            key: key.clone(),
            status,
            result: stored.clone(),
            error,
            retryable: status == FinalStatus::Failed,
            attempt,
            hold_token: hold,
        };
        if !self.send_finding(&call.tenant, finding).await {
            return Settled::Unsettled;
        }
        if status == FinalStatus::Succeeded {
            Settled::Found(stored)
        } else {
            Settled::NotFound
        }
    }

    /// Takes the entry for this gateway (Reconcile with its key): its attempt and the hold a
    /// finding must name; `None` when it is not handed out (resolved, or held by another).
    async fn take(&self, tenant: &Tenant, key: &Key) -> Option<(u32, HoldToken)> {
        let principal = (**self.principal.load()).clone();
        self.backend
            .take(tenant, key, principal)
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "the unknown outcome could not be taken for its paired read");
                None
            })
    }

    /// Sends one finding; whether it settled the entry.
    async fn send_finding(&self, tenant: &Tenant, finding: ResolutionInput) -> bool {
        let principal = (**self.principal.load()).clone();
        self.backend
            .send_finding(tenant, finding, principal)
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "the paired read's finding could not be recorded");
                false
            })
    }
}

/// The protocol members of a call's `_meta` (the stateless revision requires them on every
/// request), for a request the gateway sends on the call's behalf.
pub(super) fn protocol_meta(call: &Call<'_>) -> Value {
    let mut meta = serde_json::Map::new();
    if let Some(object) = call.meta.as_object() {
        for (key, value) in object {
            if key.starts_with("io.modelcontextprotocol/") {
                meta.insert(key.clone(), value.clone());
            }
        }
    }
    Value::Object(meta)
}
