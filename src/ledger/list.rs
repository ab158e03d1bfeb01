//! ListEntries: the audit trail, paged by an opaque (started_at, key) cursor bound to the
//! listing's filters.

use super::{EntryView, Ledger};
use crate::domain::Tenant;
use crate::domain::key::{Key, RunId, ToolName};
use crate::domain::{Micros, Status};
use crate::error::LedgerError;
use crate::reason::Reason;
use crate::storage::ListQuery;

/// A ListEntries request, converted.
#[derive(Clone, Debug, Default)]
pub struct ListInput {
    /// Only this run's entries; any run when empty.
    pub run_id: String,
    /// Only this tool's entries; any tool when empty.
    pub tool: String,
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
    /// `InvalidArgument` for a malformed filter, a page token of another listing, or an empty
    /// time range; `Unavailable`/`Internal` from the store.
    pub async fn list_entries(
        &self,
        tenant: &Tenant,
        input: ListInput,
    ) -> Result<ListOutput, LedgerError> {
        let run_id = if input.run_id.is_empty() {
            None
        } else {
            Some(RunId::parse(&input.run_id)?)
        };
        let tool = if input.tool.is_empty() {
            None
        } else {
            Some(ToolName::parse(&input.tool)?)
        };
        if let (Some(from), Some(before)) = (input.started_after, input.started_before)
            && from >= before
        {
            return Err(LedgerError::invalid(
                "started_before",
                "must be later than started_after",
            ));
        }
        let filters = list_filters_digest(run_id.as_ref(), tool.as_ref(), input.status, &input);
        let after = if input.page_token.is_empty() {
            None
        } else {
            Some(parse_page_token(&input.page_token, &filters)?)
        };
        let page_size = match input.page_size {
            0 => self.limits.list_default_page_size,
            n => n.min(self.limits.list_max_page_size),
        };
        let now = self.clock.now();
        let query = ListQuery {
            run_id,
            tool,
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
            Some(last) if more => page_token(last.started_at, &last.key, &filters),
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
fn list_filters_digest(
    run_id: Option<&RunId>,
    tool: Option<&ToolName>,
    status: Option<Status>,
    input: &ListInput,
) -> String {
    use sha2::{Digest, Sha256};
    let bound = |m: Option<Micros>| m.map_or_else(String::new, |m| m.0.to_string());
    let mut text = [
        run_id.map_or("", RunId::as_str),
        tool.map_or("", ToolName::as_str),
        status.map_or("", Status::as_str),
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

/// Version of the page token's layout.
const PAGE_TOKEN_VERSION: &str = "p1";

/// An opaque page token: hex of `p1 NUL started_at NUL filters NUL key`.
fn page_token(started_at: Micros, key: &Key, filters: &str) -> String {
    hex::encode(format!(
        "{PAGE_TOKEN_VERSION}\0{}\0{filters}\0{}",
        started_at.0,
        key.as_str()
    ))
}

/// The cursor in a page token made for a listing with these `filters`.
/// The key in it is one the server wrote there from a stored entry, taken as stored: it is
/// only a cursor to compare with, never looked up.
fn parse_page_token(token: &str, filters: &str) -> Result<(Micros, Key), LedgerError> {
    let invalid = |message: &str| LedgerError::InvalidArgument {
        field: "page_token",
        reason: Reason::InvalidPageToken,
        message: message.to_string(),
    };
    let text = hex::decode(token)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .ok_or_else(|| {
            invalid("is not a page token from this server; pass next_page_token as is")
        })?;
    let mut parts = text.splitn(4, '\0');
    let (Some(PAGE_TOKEN_VERSION), Some(started), Some(bound), Some(key)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(invalid(
            "is not a page token from this server; pass next_page_token as is",
        ));
    };
    let started = started
        .parse::<i64>()
        .map_err(|_| invalid("is not a page token from this server; pass next_page_token as is"))?;
    if bound != filters {
        return Err(invalid(
            "belongs to a listing with other filters; repeat the filters of the call that \
             returned it, or start over without a page_token",
        ));
    }
    Ok((Micros(started), Key::from_stored(key.to_string())))
}
