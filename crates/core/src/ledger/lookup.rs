//! Lookup: read an entry by key, or by the fields Claim derives it from.

use super::{EntryView, Ledger};
use crate::domain::Tenant;
use crate::domain::canonical::Canonicalization;
use crate::domain::key::{ExplicitKey, Key, RunId};
use crate::error::LedgerError;

/// A Lookup: either `key`, or `run_id` + `tool` + `arguments_json`.
#[derive(Clone, Debug, Default)]
pub struct LookupInput {
    /// The key, or empty to derive it.
    pub key: String,
    /// The run, to derive the key.
    pub run_id: String,
    /// The tool, to derive the key.
    pub tool: String,
    /// The arguments, to derive the key.
    pub arguments_json: String,
    /// How the arguments are canonicalized.
    pub canonicalization: Canonicalization,
}

impl LookupInput {
    /// A Lookup of `key` alone.
    pub fn by_key(key: impl Into<String>) -> LookupInput {
        LookupInput {
            key: key.into(),
            ..LookupInput::default()
        }
    }
}

impl Ledger {
    /// Reads an entry by key, or by the fields Claim derives it from.
    ///
    /// # Errors
    /// `InvalidArgument` for malformed input; `NotFound` when there is none (or it expired, or
    /// it is another tenant's); `Unavailable`/`Internal` from the store.
    pub async fn lookup(
        &self,
        tenant: &Tenant,
        input: LookupInput,
    ) -> Result<EntryView, LedgerError> {
        let key = if input.key.is_empty() {
            if input.run_id.is_empty() && input.tool.is_empty() && input.arguments_json.is_empty() {
                return Err(LedgerError::invalid(
                    "key",
                    "give either key, or run_id, tool and arguments_json",
                ));
            }
            let run_id = RunId::parse(&input.run_id)?;
            let (_, canonical, tool, _) =
                self.canonical_request(&input.tool, &input.arguments_json, input.canonicalization)?;
            Key::derive(&run_id, &tool, &canonical, input.canonicalization)
        } else {
            if !(input.run_id.is_empty()
                && input.tool.is_empty()
                && input.arguments_json.is_empty())
            {
                return Err(LedgerError::invalid(
                    "key",
                    "give either key, or run_id, tool and arguments_json, not both",
                ));
            }
            Key::from(ExplicitKey::parse(&input.key)?)
        };
        let now = self.clock.now();
        let _counting = self.counts_in_flight.read().await;
        match self.store.get(tenant, &key).await? {
            Some(entry) if !entry.is_expired(now) => {
                Ok(self.audit_view(self.with_unwritten_replays(tenant, entry), now))
            }
            _ => Err(LedgerError::NotFound),
        }
    }
}
