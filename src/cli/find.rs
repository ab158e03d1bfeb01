//! Which entry an operator means by KEY: a whole key, a unique prefix of one (what the
//! `entries` table shows, with or without its `…`), or an entry's `external_ref` (what an
//! external system was given, such as `idem-43ba67c5ba6df15d`).
//!
//! The service has no prefix search, and an `external_ref` cannot be turned back into a key (of
//! an explicit key it is a hash; its prefix is a server setting). So a KEY that is not a whole
//! key is looked for by paging through the tenant's `ListEntries`, at most `--search-limit`
//! entries ([`SEARCH_LIMIT`] unless told): a search that stops there without a clear answer
//! says so rather than guessing, since `resolve` writes to the entry it finds.

use clap::Args;
use tonic::Code;

use super::client::{Failure, Session};
use crate::grpc::pb;

/// Fewest characters a key prefix may have: shorter ones would match too much to be meant.
pub const MIN_PREFIX_CHARS: usize = 6;
/// Most entries one search reads unless `--search-limit` says otherwise: 20 pages of the
/// server's largest, a few megabytes and seconds.
pub const SEARCH_LIMIT: u64 = 20_000;
/// Entries asked for per `ListEntries` call of a search: the server's largest page.
const SEARCH_PAGE_SIZE: u32 = crate::defaults::LIST_MAX_PAGE_SIZE;
/// Most matching keys an ambiguity lists.
const LISTED_MATCHES: usize = 10;

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

/// KEY as given on the command line, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyQuery {
    /// The text without surrounding whitespace and without a trailing `…`.
    text: String,
    /// It ended in `…`: a key shortened by the `entries` table, never a whole key.
    shortened: bool,
}

impl KeyQuery {
    /// Parses KEY: a key, a key prefix (a trailing `…` is dropped: keys are ASCII, so it is
    /// never part of one) or an `external_ref`.
    ///
    /// # Errors
    /// Empty text, or a shortened key (with `…`) of fewer than [`MIN_PREFIX_CHARS`] characters.
    pub fn parse(raw: &str) -> Result<KeyQuery, String> {
        let trimmed = raw.trim();
        let (text, shortened) = match trimmed.strip_suffix('…') {
            Some(cut) => (cut.trim_end(), true),
            None => (trimmed, false),
        };
        if text.is_empty() {
            return Err("give a key, a unique key prefix or an external_ref".into());
        }
        if shortened && text.chars().count() < MIN_PREFIX_CHARS {
            return Err(too_short(text));
        }
        Ok(KeyQuery {
            text: text.to_string(),
            shortened,
        })
    }

    /// The text looked for (without a trailing `…`).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether `entry` is one this query names: its key starts with the text (a whole key
    /// included), or its `external_ref` is the text.
    pub fn matches(&self, entry: &pb::Entry) -> bool {
        entry.key.starts_with(&self.text) || entry.external_ref == self.text
    }

    /// A whole derived key (64 lowercase hex characters): no other key starts with one, so
    /// when Lookup does not find it there is nothing to search for.
    fn is_derived_key(&self) -> bool {
        self.text.len() == 64
            && self
                .text
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    }

    fn long_enough_to_search(&self) -> bool {
        self.text.chars().count() >= MIN_PREFIX_CHARS
    }
}

/// Why a KEY names no entry (for the message: exit status 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// Lookup of the whole key found nothing, and it cannot be a prefix (a whole derived key).
    Key,
    /// Lookup found nothing, and the text is too short to search for as a prefix.
    KeyTooShortToSearch,
    /// Neither Lookup nor a whole search of the tenant's entries found one.
    Searched,
    /// A shortened key (with `…`): no key of the tenant starts with it.
    Prefix,
}

/// The message for `text` and why nothing was found.
pub fn missing_message(text: &str, why: Missing) -> String {
    const WHY: &str = "it never existed, expired, or belongs to another tenant";
    match why {
        Missing::Key => format!("no entry with key {text} ({WHY})"),
        Missing::KeyTooShortToSearch => format!(
            "no entry with key {text} ({WHY}); as a key prefix it is too short to search for: \
             give at least {MIN_PREFIX_CHARS} characters"
        ),
        Missing::Searched => format!(
            "no entry with key {text}, nor one whose key starts with it or whose external_ref \
             it is ({WHY})"
        ),
        Missing::Prefix => format!("no entry whose key starts with {text} ({WHY})"),
    }
}

fn too_short(text: &str) -> String {
    format!(
        "`{text}` is too short for a key prefix: give at least {MIN_PREFIX_CHARS} characters, \
         or the whole key"
    )
}

/// What a search of the tenant's entries found.
#[derive(Debug, Default)]
struct Found {
    /// The first matching entry.
    first: Option<pb::Entry>,
    /// The first [`LISTED_MATCHES`] matching keys.
    keys: Vec<String>,
    /// How many entries matched.
    count: u64,
    /// How many entries were read.
    read: u64,
    /// Whether every entry of the tenant was read (else the search stopped at its limit).
    complete: bool,
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
    if !query.shortened {
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
    let found = search(session, query, args.search_limit).await?;
    match (found.count, found.complete) {
        (0, true) => {
            let why = if query.shortened {
                Missing::Prefix
            } else {
                Missing::Searched
            };
            Err(Failure::NoEntry(missing_message(query.text(), why)))
        }
        (1, true) => {
            let key = found.first.map(|e| e.key).unwrap_or_default();
            // Read again by the whole key: the command shows what Lookup answers now.
            lookup(session, &key).await.map_err(|f| match f {
                Failure::Rpc(s) if s.code() == Code::NotFound => {
                    Failure::NoEntry(missing_message(&key, Missing::Key))
                }
                other => other,
            })
        }
        (0 | 1, false) => Err(Failure::SearchCut {
            text: query.text().to_string(),
            read: found.read,
            found: found.first.map(|e| e.key),
        }),
        (count, complete) => Err(Failure::Ambiguous {
            text: query.text().to_string(),
            keys: found.keys,
            count,
            searched: (!complete).then_some(found.read),
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
async fn search(session: &Session, query: &KeyQuery, limit: u64) -> Result<Found, Failure> {
    let mut request = pb::ListEntriesRequest::default();
    let mut found = Found::default();
    loop {
        let page_size = u64::from(SEARCH_PAGE_SIZE).min(limit - found.read);
        request.page_size = i32::try_from(page_size).unwrap_or(i32::MAX);
        let page = session
            .client()
            .list_entries(session.request(request.clone()))
            .await?
            .into_inner();
        for entry in page.entries {
            found.read += 1;
            if query.matches(&entry) {
                found.count += 1;
                if found.keys.len() < LISTED_MATCHES {
                    found.keys.push(entry.key.clone());
                }
                if found.first.is_none() {
                    found.first = Some(entry);
                }
            }
        }
        if page.next_page_token.is_empty() {
            found.complete = true;
            return Ok(found);
        }
        if found.read >= limit {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, external_ref: &str) -> pb::Entry {
        pb::Entry {
            key: key.into(),
            external_ref: external_ref.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_key_is_taken_as_given_and_a_tables_ellipsis_is_dropped() {
        let whole = KeyQuery::parse("wf-42:step-3").expect("a key");
        assert_eq!((whole.text(), whole.shortened), ("wf-42:step-3", false));
        let cut = KeyQuery::parse(" 43ba67c5ba6df15… ").expect("a shortened key");
        assert_eq!((cut.text(), cut.shortened), ("43ba67c5ba6df15", true));
        // Short whole keys are fine (they are looked up, not searched for).
        assert!(KeyQuery::parse("k-1").is_ok());
        assert!(KeyQuery::parse("").is_err());
        assert!(KeyQuery::parse("…").is_err());
        let refused = KeyQuery::parse("43ba…").expect_err("too short");
        assert!(refused.contains("at least 6 characters"), "{refused}");
    }

    #[test]
    fn a_query_matches_a_key_it_starts_or_an_equal_external_ref() {
        let derived = "43ba67c5ba6df15d441f50062f986b45a45acf6939a3175662c2afcb9c8678bb";
        let e = entry(derived, "idem-43ba67c5ba6df15d");
        for text in [
            derived,
            "43ba67c5ba6df15",
            "43ba67",
            "idem-43ba67c5ba6df15d",
        ] {
            let q = KeyQuery::parse(text).expect("parse");
            assert!(q.matches(&e), "{text}");
        }
        // An external_ref matches whole, not by its prefix; a key does not match its own end.
        for text in ["idem-43ba67", "f6939a3175662c2afcb9c8678bb", "43BA67"] {
            let q = KeyQuery::parse(text).expect("parse");
            assert!(!q.matches(&e), "{text}");
        }
        let explicit = entry("wf-42:step-3", "idem-9a1b2c3d4e5f6071");
        assert!(
            KeyQuery::parse("idem-9a1b2c3d4e5f6071")
                .expect("parse")
                .matches(&explicit)
        );
        assert!(KeyQuery::parse("wf-42:").expect("parse").matches(&explicit));
    }

    #[test]
    fn only_a_whole_derived_key_is_never_searched_for() {
        let derived = "0123456789abcdef".repeat(4);
        assert!(KeyQuery::parse(&derived).expect("parse").is_derived_key());
        for other in [&derived[..63], "wf-42:step-3", &derived.to_uppercase()] {
            assert!(
                !KeyQuery::parse(other).expect("parse").is_derived_key(),
                "{other}"
            );
        }
    }

    #[test]
    fn a_missing_entry_is_told_by_what_was_looked_for() {
        assert_eq!(
            missing_message("no-such-key", Missing::Searched),
            "no entry with key no-such-key, nor one whose key starts with it or whose \
             external_ref it is (it never existed, expired, or belongs to another tenant)"
        );
        assert!(missing_message("k-1", Missing::KeyTooShortToSearch).contains("at least 6"));
        assert!(missing_message("abcdef", Missing::Prefix).starts_with("no entry whose key"));
    }
}
