//! ListEntries: the audit trail, paged by an opaque (started_at, key) cursor bound to the
//! listing's filters.

use super::{EntryView, Ledger};
use crate::domain::Tenant;
use crate::domain::fields::{ExplicitKey, RunId, ToolName};
use crate::domain::key::Key;
use crate::domain::{Micros, Status};
use crate::error::LedgerError;
use crate::reason::Reason;
use crate::storage::ListQuery;

/// A ListEntries request, its filters parsed where it arrived.
#[derive(Clone, Debug, Default)]
pub struct ListInput {
    /// Only this run's entries; any run when `None`.
    pub run_id: Option<RunId>,
    /// Only this tool's entries; any tool when `None`.
    pub tool: Option<ToolName>,
    /// Only entries in this state as Lookup reports it.
    pub status: Option<Status>,
    /// Only entries whose current attempt started at or after this.
    pub started_after: Option<Micros>,
    /// Only entries whose current attempt started before this.
    pub started_before: Option<Micros>,
    /// At most this many entries; 0 for the server's default.
    pub page_size: u32,
    /// Where a previous page ended (its `next_page_token`); empty for the first page.
    pub page_token: String,
    /// Only entries marked as a possible double effect.
    pub possible_double_effect: bool,
}

/// A page of a listing.
#[derive(Clone, Debug)]
pub struct ListOutput {
    /// The entries, by started_at and then key, with their stored arguments.
    pub entries: Vec<EntryView>,
    /// Where the next page starts; empty when this page is the last.
    pub next_page_token: String,
}

impl Ledger {
    /// A page of the tenant's entries that match `input`, by started_at and then key, with
    /// their stored arguments, and the token of the next page when more may follow. Paging
    /// uses the last entry's (started_at, key) as the cursor, so entries that do not change
    /// meanwhile are listed exactly once across pages, whatever else is written; an entry
    /// retried meanwhile moves to its new attempt's start.
    ///
    /// # Errors
    /// `InvalidArgument` for a page token of another listing, or an empty
    /// time range; `Unavailable`/`Internal` from the store.
    pub async fn list_entries(
        &self,
        tenant: &Tenant,
        input: ListInput,
    ) -> Result<ListOutput, LedgerError> {
        if let (Some(from), Some(before)) = (input.started_after, input.started_before)
            && from >= before
        {
            return Err(LedgerError::invalid(
                "started_before",
                "must be later than started_after",
            ));
        }
        let filters = list_filters_digest(&input);
        let after = if input.page_token.is_empty() {
            None
        } else {
            Some(PageToken::parse(&input.page_token, &filters)?)
                .map(|token| (token.started_at, token.key))
        };
        let page_size = match input.page_size {
            0 => self.limits.list_default_page_size,
            n => n.min(self.limits.list_max_page_size),
        };
        let now = self.clock.now();
        let query = ListQuery {
            run_id: input.run_id,
            tool: input.tool,
            status: input.status,
            started_from: input.started_after.unwrap_or(Micros(i64::MIN)),
            started_before: input.started_before.unwrap_or(Micros(i64::MAX)),
            after,
            // One more than the page: whether it exists says if a next page does.
            limit: page_size.saturating_add(1),
            now,
            possible_double_effect: input.possible_double_effect,
        };
        // Held until the counts not yet written are added (see `counts_in_flight`).
        let counting = self.counts_in_flight.read().await;
        let mut entries = self.store.list(tenant, &query).await?;
        let more = entries.len() > page_size as usize;
        entries.truncate(page_size as usize);
        let next_page_token = match entries.last() {
            Some(last) if more => PageToken {
                started_at: last.started_at,
                key: last.key.clone(),
            }
            .encode(&filters),
            _ => String::new(),
        };
        let entries = entries
            .into_iter()
            .map(|e| self.audit_view(self.with_unwritten_replays(tenant, e), now))
            .collect();
        drop(counting);
        Ok(ListOutput {
            entries,
            next_page_token,
        })
    }
}

/// What a page token is bound to: the listing's filters, so that a token cannot continue a
/// different listing (its cursor would skip or repeat entries there).
fn list_filters_digest(input: &ListInput) -> String {
    use sha2::{Digest, Sha256};
    let bound = |m: Option<Micros>| m.map_or_else(String::new, |m| m.0.to_string());
    let mut text = [
        input.run_id.as_ref().map_or("", RunId::as_str),
        input.tool.as_ref().map_or("", ToolName::as_str),
        input.status.map_or("", Status::as_str),
        &bound(input.started_after),
        &bound(input.started_before),
    ]
    .join("\0");
    // Only when set, so that the tokens of listings without it read as before.
    if input.possible_double_effect {
        text.push_str("\0possible_double_effect");
    }
    hex::encode(&Sha256::digest(text.as_bytes())[..8])
}

/// Where a listing's page ended: the last entry's start and key, bound to the listing's
/// filters. Sent to the caller as opaque text ([`PageToken::encode`]); what the caller sends
/// back is checked as any caller's input ([`PageToken::parse`]), the key as a key.
#[derive(Clone, Debug, PartialEq, Eq)]
struct PageToken {
    /// The last entry's start.
    started_at: Micros,
    /// The last entry's key.
    key: Key,
}

impl PageToken {
    /// Version of the layout.
    const VERSION: &str = "p1";

    /// The opaque text: hex of `p1 NUL started_at NUL filters NUL key`.
    fn encode(&self, filters: &str) -> String {
        hex::encode(format!(
            "{}\0{}\0{filters}\0{}",
            Self::VERSION,
            self.started_at.0,
            self.key.as_str()
        ))
    }

    /// The cursor in `token`, made for a listing with these `filters`.
    fn parse(token: &str, filters: &str) -> Result<PageToken, LedgerError> {
        let invalid = |message: &str| LedgerError::InvalidArgument {
            field: "page_token",
            reason: Reason::InvalidPageToken,
            message: message.to_string(),
        };
        let foreign =
            || invalid("is not a page token from this server; pass next_page_token as is");
        let text = hex::decode(token)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .ok_or_else(foreign)?;
        let mut parts = text.splitn(4, '\0');
        let (Some(Self::VERSION), Some(started), Some(bound), Some(key)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(foreign());
        };
        let started_at = Micros(started.parse::<i64>().map_err(|_| foreign())?);
        if bound != filters {
            return Err(invalid(
                "belongs to a listing with other filters; repeat the filters of the call that \
                 returned it, or start over without a page_token",
            ));
        }
        let key = Key::from(ExplicitKey::parse(key).map_err(|_| foreign())?);
        Ok(PageToken { started_at, key })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token_with_key(key: &str) -> String {
        hex::encode(format!("p1\0{}\0f1\0{key}", 42))
    }

    #[test]
    fn a_page_token_reads_back_only_for_its_listing_and_only_with_a_well_formed_key() {
        let token = PageToken {
            started_at: Micros(42),
            key: Key::from(ExplicitKey::parse("wf-7:step-3").expect("key")),
        };
        assert_eq!(
            PageToken::parse(&token.encode("f1"), "f1").expect("its own token"),
            token
        );
        let other = PageToken::parse(&token.encode("f1"), "f2").unwrap_err();
        assert!(other.to_string().contains("other filters"), "{other}");
        for forged in [
            "not hex".to_string(),
            hex::encode("p0\u{0}42\u{0}f1\u{0}k"),
            token_with_key("a key with blanks"),
            token_with_key("bell\u{7}"),
            token_with_key(""),
        ] {
            let refused = PageToken::parse(&forged, "f1").unwrap_err();
            assert!(
                matches!(
                    refused,
                    LedgerError::InvalidArgument {
                        reason: Reason::InvalidPageToken,
                        ..
                    }
                ),
                "{forged}: {refused:?}"
            );
        }
    }
}
