//! What of a claim's arguments is kept for audit: nothing, everything, or everything but the
//! members named like secrets. Keys and fingerprints never see this: they are always derived
//! from the whole canonical text, so redaction can change only what an auditor reads.

use std::collections::BTreeSet;

use super::canonical::Value;

/// What replaces a redacted member's value, whatever its type.
pub const REDACTED: &str = "[REDACTED]";

/// Member names redacted by default: credentials and card data that tools commonly take.
pub const DEFAULT_FIELDS: &[&str] = &[
    "password",
    "passwd",
    "secret",
    "client_secret",
    "token",
    "access_token",
    "refresh_token",
    "api_key",
    "authorization",
    "cookie",
    "private_key",
    "card_number",
    "cvv",
    "cvc",
];

/// How arguments are stored (`--store-arguments`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArgumentsPolicy {
    /// Not stored at all.
    None,
    /// Stored in canonical form with the named members' values replaced by [`REDACTED`].
    Redacted(Redaction),
    /// Stored in canonical form, whole.
    Full,
}

impl Default for ArgumentsPolicy {
    fn default() -> Self {
        ArgumentsPolicy::Redacted(Redaction::new(DEFAULT_FIELDS.iter().copied()))
    }
}

impl ArgumentsPolicy {
    /// What to store for arguments whose canonical text is `canonical` and parsed (and, with
    /// the lenient mode, cleaned) form is `value`: `None` when nothing is stored.
    pub fn stored(&self, value: &Value, canonical: &str) -> Option<String> {
        match self {
            ArgumentsPolicy::None => None,
            ArgumentsPolicy::Full => Some(canonical.to_string()),
            ArgumentsPolicy::Redacted(redaction) => Some(redaction.apply(value, canonical)),
        }
    }
}

/// The member names to redact, compared case-insensitively and ignoring `_` and `-`, so
/// `api_key`, `apiKey` and `API-KEY` are one name. Names match exactly, not as substrings:
/// `max_tokens` is not a secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Redaction {
    /// Normalized names (see [`normalize`]).
    names: BTreeSet<String>,
}

impl Redaction {
    /// Redacts members named as in `names` (any spelling; see [`Redaction`]).
    pub fn new<'a>(names: impl IntoIterator<Item = &'a str>) -> Redaction {
        Redaction {
            names: names
                .into_iter()
                .map(normalize)
                .filter(|n| !n.is_empty())
                .collect(),
        }
    }

    /// Whether a member of this name is redacted.
    pub fn covers(&self, name: &str) -> bool {
        self.names.contains(&normalize(name))
    }

    /// The canonical text of `value` with every covered member's value replaced, at any depth
    /// (inside arrays too). `canonical` (the text of `value` as is) is returned unchanged when
    /// nothing is covered, which spares a second serialization in the common case.
    pub fn apply(&self, value: &Value, canonical: &str) -> String {
        if !self.finds_in(value) {
            return canonical.to_string();
        }
        let mut out = String::with_capacity(canonical.len());
        self.redacted(value).write_canonical(&mut out);
        out
    }

    fn finds_in(&self, value: &Value) -> bool {
        match value {
            Value::Object(members) => members
                .iter()
                .any(|(name, v)| self.covers(name) || self.finds_in(v)),
            Value::Array(items) => items.iter().any(|v| self.finds_in(v)),
            _ => false,
        }
    }

    fn redacted(&self, value: &Value) -> Value {
        match value {
            Value::Object(members) => Value::Object(
                members
                    .iter()
                    .map(|(name, v)| {
                        let v = if self.covers(name) {
                            Value::String(REDACTED.to_string())
                        } else {
                            self.redacted(v)
                        };
                        (name.clone(), v)
                    })
                    .collect(),
            ),
            Value::Array(items) => Value::Array(items.iter().map(|v| self.redacted(v)).collect()),
            scalar => scalar.clone(),
        }
    }
}

/// Lower case without `_` and `-`.
fn normalize(name: &str) -> String {
    name.chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::canonical::{JsonLimits, parse};

    fn stored(policy: &ArgumentsPolicy, json: &str) -> Option<String> {
        let value = parse(json, &JsonLimits::default()).expect("valid JSON");
        let mut canonical = String::new();
        value.write_canonical(&mut canonical);
        policy.stored(&value, &canonical)
    }

    #[test]
    fn the_default_policy_redacts_secrets_at_any_depth_and_keeps_the_rest_canonical() {
        let got = stored(
            &ArgumentsPolicy::default(),
            r#"{"user":"ann","password":"hunter2","nested":{"api_key":{"v":1},
               "list":[{"Token":"t"},{"note":"keep"}]},"amount":2.50}"#,
        );
        assert_eq!(
            got.as_deref(),
            Some(
                r#"{"amount":2.5,"nested":{"api_key":"[REDACTED]","list":[{"Token":"[REDACTED]"},{"note":"keep"}]},"password":"[REDACTED]","user":"ann"}"#
            )
        );
    }

    #[test]
    fn names_match_in_any_case_with_or_without_separators_but_not_as_substrings() {
        let r = Redaction::new(["api_key", "card-number"]);
        assert!(r.covers("apiKey"));
        assert!(r.covers("API-KEY"));
        assert!(r.covers("CardNumber"));
        assert!(!r.covers("api_key_id"));
        assert!(!r.covers("max_tokens"));
        assert!(!Redaction::new(["", "_"]).covers(""));
    }

    #[test]
    fn nothing_to_redact_returns_the_canonical_text_itself() {
        let policy = ArgumentsPolicy::default();
        assert_eq!(
            stored(&policy, r#"{"b":1,"a":[true,null]}"#).as_deref(),
            Some(r#"{"a":[true,null],"b":1}"#)
        );
    }

    #[test]
    fn none_stores_nothing_and_full_stores_everything() {
        let json = r#"{"password":"hunter2"}"#;
        assert_eq!(stored(&ArgumentsPolicy::None, json), None);
        assert_eq!(
            stored(&ArgumentsPolicy::Full, json).as_deref(),
            Some(r#"{"password":"hunter2"}"#)
        );
    }

    #[test]
    fn extra_fields_are_redacted_alongside_the_defaults() {
        let policy = ArgumentsPolicy::Redacted(Redaction::new(
            DEFAULT_FIELDS.iter().copied().chain(["iban"]),
        ));
        assert_eq!(
            stored(&policy, r#"{"IBAN":"DE00","secret":"s","to":"x"}"#).as_deref(),
            Some(r#"{"IBAN":"[REDACTED]","secret":"[REDACTED]","to":"x"}"#)
        );
    }
}
