//! Which entry an operator means by a text: a whole key, a unique prefix of one (what a table
//! shows, with or without its `…`), or an entry's `external_ref` (what an external system was
//! given, such as `idem-43ba67c5ba6df15d`). The rules are written once, here, for both of the
//! operator's tools: the command line searches over gRPC (`ListEntries`), the console through
//! [`Ledger::find`].
//!
//! There is no prefix index, and an `external_ref` cannot be turned back into a key (of an
//! explicit key it is a hash; its prefix is a server setting). So a text that is not a whole
//! key is looked for by paging through the tenant's entries, oldest first, at most a limit of
//! them ([`SEARCH_LIMIT`] unless told): a search that stops there without a clear answer says
//! so rather than guessing, since a resolution writes to the entry it finds.

use super::{EntryView, Ledger, ListInput, LookupInput};
use crate::domain::Tenant;
use crate::domain::key::Key;
use crate::error::LedgerError;

/// Fewest characters a key prefix may have: shorter ones would match too much to be meant.
pub const MIN_PREFIX_CHARS: usize = 6;
/// Most entries one search reads unless told otherwise: 20 pages of the server's largest, a few
/// megabytes and seconds.
pub const SEARCH_LIMIT: u64 = 20_000;
/// Most matching keys an ambiguity lists.
pub const LISTED_MATCHES: usize = 10;

/// What an operator typed to name an entry, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyQuery {
    /// The text without surrounding whitespace and without a trailing `…`.
    text: String,
    /// It ended in `…`: a key shortened by a table, never a whole key.
    shortened: bool,
}

impl KeyQuery {
    /// Parses a key, a key prefix (a trailing `…` is dropped: keys are ASCII, so it is never
    /// part of one) or an `external_ref`.
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

    /// Whether it ended in `…`, so that it is a prefix and never a whole key.
    pub fn is_shortened(&self) -> bool {
        self.shortened
    }

    /// Whether an entry with this `key` and `external_ref` is one this query names: its key
    /// starts with the text (a whole key included), or its `external_ref` is the text.
    pub fn matches(&self, key: &str, external_ref: &str) -> bool {
        key.starts_with(&self.text) || external_ref == self.text
    }

    /// A whole derived key (64 lowercase hex characters): no other key starts with one, so
    /// when a lookup does not find it there is nothing to search for.
    pub fn is_derived_key(&self) -> bool {
        self.text.len() == 64
            && self
                .text
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    }

    /// Whether the text is long enough to search for as a prefix.
    pub fn long_enough_to_search(&self) -> bool {
        self.text.chars().count() >= MIN_PREFIX_CHARS
    }
}

/// Why a query names no entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// A lookup of the whole key found nothing, and it cannot be a prefix (a whole derived key).
    Key,
    /// A lookup found nothing, and the text is too short to search for as a prefix.
    KeyTooShortToSearch,
    /// Neither a lookup nor a whole search of the tenant's entries found one.
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

/// A search in progress: the entries read so far, and those the query matched. `E` is the
/// entry as the searcher holds it (a proto entry over gRPC, a view in the ledger).
#[derive(Debug)]
pub struct Search<E> {
    /// The first matching entry.
    first: Option<E>,
    /// The first [`LISTED_MATCHES`] matching keys.
    keys: Vec<String>,
    /// How many entries matched.
    count: u64,
    /// How many entries were read.
    read: u64,
    /// Whether every entry of the tenant was read (else the search stopped at its limit).
    complete: bool,
}

impl<E> Default for Search<E> {
    fn default() -> Self {
        Search {
            first: None,
            keys: Vec::new(),
            count: 0,
            read: 0,
            complete: false,
        }
    }
}

/// What a search concluded.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict<E> {
    /// Nothing matches, for this reason.
    Missing(Missing),
    /// Exactly one entry matches: this one, as it was read during the search (read it again
    /// by its key to show what is true now).
    One(E),
    /// The search stopped at its limit with fewer than two matches: one more may be beyond it.
    Cut {
        /// Entries read.
        read: u64,
        /// The one match, if any.
        found: Option<String>,
    },
    /// More than one entry matches.
    Ambiguous {
        /// The first [`LISTED_MATCHES`] matching keys.
        keys: Vec<String>,
        /// How many matched.
        count: u64,
        /// With `Some(read)` the search stopped at its limit after reading that many.
        searched: Option<u64>,
    },
}

impl<E> Search<E> {
    /// Counts one entry read, with its `key` and `external_ref`, against `query`.
    pub fn see(&mut self, query: &KeyQuery, key: &str, external_ref: &str, entry: E) {
        self.read += 1;
        if query.matches(key, external_ref) {
            self.count += 1;
            if self.keys.len() < LISTED_MATCHES {
                self.keys.push(key.to_string());
            }
            if self.first.is_none() {
                self.first = Some(entry);
            }
        }
    }

    /// How many entries were read so far.
    pub fn read(&self) -> u64 {
        self.read
    }

    /// Every entry of the tenant was read.
    pub fn finish(&mut self) {
        self.complete = true;
    }

    /// What the search found, for `query`.
    pub fn verdict(self, query: &KeyQuery) -> Verdict<E> {
        match (self.count, self.complete, self.first) {
            (0, true, _) => Verdict::Missing(if query.shortened {
                Missing::Prefix
            } else {
                Missing::Searched
            }),
            (1, true, Some(entry)) => Verdict::One(entry),
            (0 | 1, _, first) => Verdict::Cut {
                read: self.read,
                found: first.and(self.keys.into_iter().next()),
            },
            (count, complete, _) => Verdict::Ambiguous {
                keys: self.keys,
                count,
                searched: (!complete).then_some(self.read),
            },
        }
    }
}

impl Ledger {
    /// The entry of `tenant` that `query` names: looked up as a whole key first (unless it was
    /// shortened with `…`), then searched for among the tenant's entries, oldest first, at
    /// most `limit` of them, for keys starting with it and the `external_ref` equal to it. A
    /// single match is read again by its key, so the answer is what is true now.
    ///
    /// # Errors
    /// `Unavailable`/`Internal` from the store. A text that cannot be a key is no error: it is
    /// searched for like any other.
    pub async fn find(
        &self,
        tenant: &Tenant,
        query: &KeyQuery,
        limit: u64,
    ) -> Result<Verdict<EntryView>, LedgerError> {
        if !query.is_shortened() {
            match self.lookup_key(tenant, query.text()).await? {
                Some(view) => return Ok(Verdict::One(view)),
                None if query.is_derived_key() => return Ok(Verdict::Missing(Missing::Key)),
                None if !query.long_enough_to_search() => {
                    return Ok(Verdict::Missing(Missing::KeyTooShortToSearch));
                }
                None => {}
            }
        }
        let mut search = Search::default();
        let mut input = ListInput::default();
        loop {
            let left = limit.saturating_sub(search.read());
            input.page_size = u32::try_from(left)
                .unwrap_or(u32::MAX)
                .min(self.limits.list_max_page_size);
            let page = self.list_entries(tenant, input.clone()).await?;
            for view in page.entries {
                let (key, external_ref) = (view.entry.key.clone(), view.external_ref.clone());
                search.see(query, key.as_str(), &external_ref, view);
            }
            if page.next_page_token.is_empty() {
                search.finish();
                break;
            }
            if search.read() >= limit {
                break;
            }
            input.page_token = page.next_page_token;
        }
        Ok(match search.verdict(query) {
            Verdict::One(view) => match self.lookup_key(tenant, view.entry.key.as_str()).await? {
                Some(now) => Verdict::One(now),
                None => Verdict::Missing(Missing::Key),
            },
            other => other,
        })
    }

    /// The entry with this whole key, if the text can be a key and there is one.
    async fn lookup_key(
        &self,
        tenant: &Tenant,
        key: &str,
    ) -> Result<Option<EntryView>, LedgerError> {
        // Not a key at all (too long, spaces): then it names no entry by key.
        let Ok(key) = Key::parse(key) else {
            return Ok(None);
        };
        match self.lookup(tenant, LookupInput::by_key(key)).await {
            Ok(view) => Ok(Some(view)),
            Err(LedgerError::NotFound) => Ok(None),
            Err(other) => Err(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let external_ref = "idem-43ba67c5ba6df15d";
        for text in [derived, "43ba67c5ba6df15", "43ba67", external_ref] {
            let q = KeyQuery::parse(text).expect("parse");
            assert!(q.matches(derived, external_ref), "{text}");
        }
        // An external_ref matches whole, not by its prefix; a key does not match its own end.
        for text in ["idem-43ba67", "f6939a3175662c2afcb9c8678bb", "43BA67"] {
            let q = KeyQuery::parse(text).expect("parse");
            assert!(!q.matches(derived, external_ref), "{text}");
        }
        let q = KeyQuery::parse("idem-9a1b2c3d4e5f6071").expect("parse");
        assert!(q.matches("wf-42:step-3", "idem-9a1b2c3d4e5f6071"));
        let q = KeyQuery::parse("wf-42:").expect("parse");
        assert!(q.matches("wf-42:step-3", "idem-9a1b2c3d4e5f6071"));
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

    fn searched(query: &str, keys: &[&str], complete: bool) -> Verdict<String> {
        let query = KeyQuery::parse(query).expect("parse");
        let mut search = Search::default();
        for key in keys {
            search.see(&query, key, "", (*key).to_string());
        }
        if complete {
            search.finish();
        }
        search.verdict(&query)
    }

    #[test]
    fn a_search_answers_one_none_many_or_that_it_stopped_short() {
        assert_eq!(
            searched("abcdef", &["abcdef-1", "zzz"], true),
            Verdict::One("abcdef-1".to_string())
        );
        assert_eq!(
            searched("abcdef", &["zzz"], true),
            Verdict::Missing(Missing::Searched)
        );
        assert_eq!(
            searched("abcdef…", &["zzz"], true),
            Verdict::Missing(Missing::Prefix)
        );
        assert_eq!(
            searched("abcdef", &["abcdef-1", "abcdef-2"], true),
            Verdict::Ambiguous {
                keys: vec!["abcdef-1".into(), "abcdef-2".into()],
                count: 2,
                searched: None
            }
        );
        // Stopped at the limit: one match may not be the only one, none may be one further on.
        assert_eq!(
            searched("abcdef", &["abcdef-1", "zzz"], false),
            Verdict::Cut {
                read: 2,
                found: Some("abcdef-1".into())
            }
        );
        assert_eq!(
            searched("abcdef", &["zzz"], false),
            Verdict::Cut {
                read: 1,
                found: None
            }
        );
    }
}
