//! Lookup: read an entry by key, or by the fields Claim derives it from.

use super::{EntryView, Ledger};
use crate::domain::Tenant;
use crate::domain::canonical::Canonicalization;
use crate::domain::fields::{RunId, ToolName};
use crate::domain::key::Key;
use crate::error::LedgerError;

/// A Lookup, its fields parsed where it arrived: by key, or by the fields Claim derives a key
/// from. (Which of the two a request means, and that it does not mean both, is decided there.)
#[derive(Clone, Debug)]
pub enum LookupInput {
    /// The entry with this key.
    ByKey(Key),
    /// The entry whose key Claim derives from these.
    ByIntent {
        /// The run.
        run_id: RunId,
        /// The tool.
        tool: ToolName,
        /// The arguments as JSON text (canonicalized under the ledger's JSON limits).
        arguments_json: String,
        /// How the arguments are canonicalized.
        canonicalization: Canonicalization,
    },
}

impl LookupInput {
    /// A Lookup of `key` alone.
    #[must_use]
    pub fn by_key(key: Key) -> LookupInput {
        LookupInput::ByKey(key)
    }
}

impl Ledger {
    /// Reads an entry by key, or by the fields Claim derives it from.
    ///
    /// # Errors
    /// `InvalidArgument` for malformed arguments; `NotFound` when there is none (or it expired, or
    /// it is another tenant's); `Unavailable`/`Internal` from the store.
    pub async fn lookup(
        &self,
        tenant: &Tenant,
        input: LookupInput,
    ) -> Result<EntryView, LedgerError> {
        let key = match input {
            LookupInput::ByKey(key) => key,
            LookupInput::ByIntent {
                run_id,
                tool,
                arguments_json,
                canonicalization,
            } => {
                let (_, canonical, _) =
                    self.canonical_request(&tool, &arguments_json, canonicalization)?;
                Key::derive(&run_id, &tool, &canonical, canonicalization)
            }
        };
        let now = self.clock.now();
        let _counting = self.counts_in_flight.read().await;
        // Judged as it reads now: a lapse not yet recorded has already finished the entry.
        match self.store.get(tenant, &key).await?.map(|e| e.as_of(now)) {
            Some(entry) if !entry.is_expired(now) => {
                Ok(self.audit_view(self.with_unwritten_replays(tenant, entry), now))
            }
            _ => Err(LedgerError::NotFound),
        }
    }
}
