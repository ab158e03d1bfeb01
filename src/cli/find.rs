//! Which entry an operator means by KEY: a whole key, a unique prefix of one (what the
//! `entries` table shows, with or without its `…`), or an entry's `external_ref` (what an
//! external system was given, such as `idem-43ba67c5ba6df15d`).
//!
//! The rules are the ledger's ([`crate::ledger::find`], which the console uses too); here
//! they run over gRPC: the service has no prefix search, so a KEY that is not a whole key is
//! looked for by paging through the tenant's `ListEntries`, at most `--search-limit` entries
//! ([`SEARCH_LIMIT`] unless told): a search that stops there without a clear answer says so
//! rather than guessing, since `resolve` writes to the entry it finds.

use clap::Args;
use tonic::Code;

use super::client::{Failure, Session};
use crate::grpc::pb;
pub use crate::ledger::find::{
    KeyQuery, MIN_PREFIX_CHARS, Missing, SEARCH_LIMIT, Search, Verdict, missing_message,
};

/// Entries asked for per `ListEntries` call of a search: the server's largest page.
const SEARCH_PAGE_SIZE: u32 = crate::defaults::LIST_MAX_PAGE_SIZE;

/// The entry a command is about, and how far to search for it: shared by `entry`, `resolve`
/// and `renew`.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct KeyArgs {
    /// The entry: its key (derived or explicit, as `entries --wide` shows it), a unique prefix
    /// of it of at least 6 characters (as `entries` shows it, with or without the `…`), or its
    /// external_ref. A prefix or an external_ref is searched for among the tenant's entries
    /// (at most --search-limit of them).
    #[arg(value_name = "KEY", value_parser = KeyQuery::parse)]
    pub key: KeyQuery,

    /// Most entries a search for a key prefix or an external_ref reads (oldest first): one that
    /// stops there with fewer than two matches is refused, since another entry may match
    /// further on.
    #[arg(long, value_name = "N", default_value_t = SEARCH_LIMIT, value_parser = clap::value_parser!(u64).range(1..))]
    pub search_limit: u64,
}

/// The entry `args` names, as Lookup answers it.
///
/// A KEY without `…` is first looked up as a whole key (one call, the usual case). Otherwise,
/// or when there is no such entry, the tenant's entries are searched for keys starting with it
/// and for the `external_ref` equal to it, at most `args.search_limit` of them.
///
/// # Errors
/// [`Failure::NoEntry`] when nothing matches; [`Failure::Ambiguous`] when more than one entry
/// does; [`Failure::SearchCut`] when the search stopped at its limit with fewer than two
/// matches (one more may be beyond it); [`Failure::Usage`] for a prefix too short to search
/// for; the server's errors.
pub(super) async fn find_entry(session: &Session, args: &KeyArgs) -> Result<pb::Entry, Failure> {
    let query = &args.key;
    if !query.is_shortened() {
        match lookup(session, query.text()).await {
            Ok(entry) => return Ok(entry),
            Err(Failure::Rpc(s)) if s.code() == Code::NotFound => {}
            Err(other) => return Err(other),
        }
        if query.is_derived_key() {
            return Err(Failure::NoEntry(missing_message(
                query.text(),
                Missing::Key,
            )));
        }
        if !query.long_enough_to_search() {
            return Err(Failure::NoEntry(missing_message(
                query.text(),
                Missing::KeyTooShortToSearch,
            )));
        }
    }
    match search(session, query, args.search_limit)
        .await?
        .verdict(query)
    {
        Verdict::Missing(why) => Err(Failure::NoEntry(missing_message(query.text(), why))),
        Verdict::One(entry) => {
            // Read again by the whole key: the command shows what Lookup answers now.
            lookup(session, &entry.key).await.map_err(|f| match f {
                Failure::Rpc(s) if s.code() == Code::NotFound => {
                    Failure::NoEntry(missing_message(&entry.key, Missing::Key))
                }
                other => other,
            })
        }
        Verdict::Cut { read, found } => Err(Failure::SearchCut {
            text: query.text().to_string(),
            read,
            found,
        }),
        Verdict::Ambiguous {
            keys,
            count,
            searched,
        } => Err(Failure::Ambiguous {
            text: query.text().to_string(),
            keys,
            count,
            searched,
        }),
    }
}

/// Lookup of a whole key.
async fn lookup(session: &Session, key: &str) -> Result<pb::Entry, Failure> {
    let request = pb::LookupRequest {
        key: key.to_string(),
        ..Default::default()
    };
    session
        .client()
        .lookup(session.request(request))
        .await?
        .into_inner()
        .entry
        .ok_or_else(|| Failure::Protocol("the server answered Lookup without an entry".into()))
}

/// Pages through the tenant's entries (every run, tool and state), oldest first, counting
/// those `query` matches, until the last page or `limit` entries.
async fn search(
    session: &Session,
    query: &KeyQuery,
    limit: u64,
) -> Result<Search<pb::Entry>, Failure> {
    let mut request = pb::ListEntriesRequest::default();
    let mut found = Search::default();
    loop {
        let page_size = u64::from(SEARCH_PAGE_SIZE).min(limit - found.read());
        request.page_size = i32::try_from(page_size).unwrap_or(i32::MAX);
        let page = session
            .client()
            .list_entries(session.request(request.clone()))
            .await?
            .into_inner();
        for entry in page.entries {
            let (key, external_ref) = (entry.key.clone(), entry.external_ref.clone());
            found.see(query, &key, &external_ref, entry);
        }
        if page.next_page_token.is_empty() {
            found.finish();
            return Ok(found);
        }
        if found.read() >= limit {
            return Ok(found);
        }
        if page.next_page_token == request.page_token {
            return Err(Failure::Protocol(
                "the server answered the same page token twice".into(),
            ));
        }
        request.page_token = page.next_page_token;
    }
}
