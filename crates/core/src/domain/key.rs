//! An entry's key: derived from a run, a tool and canonical arguments, or chosen by the caller
//! ([`ClaimKey`]), and the argument fingerprint:
//!
//! ```text
//! key         = hex(sha256("idem.v1" 0x00 run_id 0x00 tool 0x00 canonical))
//! fingerprint = hex(sha256("idem.v1.fp" 0x00 tool 0x00 canonical))
//! ```
//!
//! The lenient form hashes under `idem.v1.lenient` and `idem.v1.lenient.fp` instead.

use sha2::{Digest, Sha256};

use super::canonical::Canonicalization;
use super::fields::{ExplicitKey, InvalidField, RunId, ToolName, lower_hex, text_newtype};

/// The key of an entry, unique per tenant: a derived key ([`Key::derive`]: 64 lowercase hex)
/// or an [`ExplicitKey`] the caller chose. Built only from those two, or read back from the
/// store ([`Key::from_stored`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(String);

impl Key {
    /// The key's first 12 characters: what logs show of it (the whole key is an entry's
    /// address, and an explicit key may say more than a log should).
    #[must_use]
    pub fn log_prefix(&self) -> &str {
        let end = self
            .0
            .char_indices()
            .nth(12)
            .map_or(self.0.len(), |(at, _)| at);
        &self.0[..end]
    }

    /// The key derived for a tool call ([`derive_key`]).
    #[must_use]
    pub fn derive(run_id: &RunId, tool: &ToolName, canonical: &str, mode: Canonicalization) -> Key {
        Key(derive_key(run_id, tool, canonical, mode))
    }

    /// The key as stored and shown.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Key {
    /// A key as a caller names an entry (Complete, RenewLease, Lookup, Decide, ...): any key
    /// it could have been given, so the rules of an [`ExplicitKey`] (a derived key, 64
    /// lowercase hex, meets them).
    ///
    /// # Errors
    /// [`InvalidField`] for field `key`, as [`ExplicitKey::parse`] refuses it.
    pub fn parse(s: &str) -> Result<Key, InvalidField> {
        ExplicitKey::parse(s).map(Key::from)
    }
}

/// Which key a Claim is about, in a form that cannot hold the invalid combination: a key
/// derived from the run (the run id is then required), or a key the caller chose, with the
/// run it belongs to when the caller named one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimKey {
    /// Derive the key from this run, the tool and the canonical arguments ([`Key::derive`]).
    Derived(RunId),
    /// The caller's own key, and the run when given (kept on the entry, not hashed).
    Explicit {
        /// The key.
        key: ExplicitKey,
        /// The run, when the caller named one.
        run_id: Option<RunId>,
    },
}

impl ClaimKey {
    /// A Claim's `key` and `run_id` as sent, empty meaning unset: without a key the run id is
    /// required and the key is derived from it; with a key a run id is optional and kept
    /// when given. The run id is checked first, then the key.
    ///
    /// # Errors
    /// [`InvalidField`] for field `run_id` when it is malformed, or missing without a key;
    /// for field `key` when the key is malformed.
    pub fn parse(key: &str, run_id: &str) -> Result<ClaimKey, InvalidField> {
        if key.is_empty() {
            return RunId::parse(run_id).map(ClaimKey::Derived);
        }
        let run_id = if run_id.is_empty() {
            None
        } else {
            Some(RunId::parse(run_id)?)
        };
        Ok(ClaimKey::Explicit {
            key: ExplicitKey::parse(key)?,
            run_id,
        })
    }

    /// The run the entry belongs to, when there is one.
    #[must_use]
    pub fn run_id(&self) -> Option<&RunId> {
        match self {
            ClaimKey::Derived(run_id) => Some(run_id),
            ClaimKey::Explicit { run_id, .. } => run_id.as_ref(),
        }
    }

    /// The caller's own key, or `None` when the key is derived.
    #[must_use]
    pub fn explicit(&self) -> Option<&ExplicitKey> {
        match self {
            ClaimKey::Derived(_) => None,
            ClaimKey::Explicit { key, .. } => Some(key),
        }
    }

    /// The entry's key (the caller's own, or the one derived from the run, `tool` and the
    /// `canonical` arguments under `mode`) and its run, taken apart without a copy.
    #[must_use]
    pub fn into_key(
        self,
        tool: &ToolName,
        canonical: &str,
        mode: Canonicalization,
    ) -> (Key, Option<RunId>) {
        match self {
            ClaimKey::Derived(run_id) => {
                (Key::derive(&run_id, tool, canonical, mode), Some(run_id))
            }
            ClaimKey::Explicit { key, run_id } => (Key::from(key), run_id),
        }
    }
}

impl From<ExplicitKey> for Key {
    fn from(key: ExplicitKey) -> Key {
        Key(key.into_string())
    }
}

text_newtype!(Key);

/// SHA-256 over the parts joined by single zero bytes, as lowercase hex. The zero byte cannot
/// occur in a validated run id or tool name, so the parts cannot run into each other.
fn hash_parts(parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            hasher.update([0u8]);
        }
        hasher.update(part.as_bytes());
    }
    lower_hex(&hasher.finalize())
}

/// Derives the idempotency key for a tool call: 64 lowercase hex characters of
/// `sha256("idem.v1" 0x00 run_id 0x00 tool 0x00 canonical)`, with `idem.v1.lenient` as the
/// domain string under [`Canonicalization::JcsLenient`].
///
/// `canonical` must be the output of [`super::canonical::canonicalize`] under the same `mode`.
#[must_use]
pub fn derive_key(
    run_id: &RunId,
    tool: &ToolName,
    canonical: &str,
    mode: Canonicalization,
) -> String {
    let domain = match mode {
        Canonicalization::Jcs => "idem.v1",
        Canonicalization::JcsLenient => "idem.v1.lenient",
    };
    hash_parts(&[domain, run_id.as_str(), tool.as_str(), canonical])
}

/// Fingerprints a tool call's arguments, independent of the run, to detect a key reused with
/// different arguments: 64 lowercase hex characters of
/// `sha256("idem.v1.fp" 0x00 tool 0x00 canonical)`, with `idem.v1.lenient.fp` as the domain
/// string under [`Canonicalization::JcsLenient`].
#[must_use]
pub fn fingerprint(tool: &ToolName, canonical: &str, mode: Canonicalization) -> String {
    let domain = match mode {
        Canonicalization::Jcs => "idem.v1.fp",
        Canonicalization::JcsLenient => "idem.v1.lenient.fp",
    };
    hash_parts(&[domain, tool.as_str(), canonical])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::fields::tests::{run, tool};

    // Expected digests below were computed with Python's hashlib, not with this code.
    const AMOUNT_200: &str = r#"{"amount":200}"#;
    #[test]
    fn key_hashes_domain_run_tool_and_canonical_joined_by_zero_bytes() {
        assert_eq!(
            derive_key(
                &run("run-1"),
                &tool("issue_credit"),
                AMOUNT_200,
                Canonicalization::Jcs
            ),
            "27f4fea3850222dfd0e4cf99fd47dac417a397f4c0a952aae7de112994e24d44"
        );
    }

    #[test]
    fn fingerprint_hashes_domain_tool_and_canonical_without_the_run() {
        assert_eq!(
            fingerprint(&tool("issue_credit"), AMOUNT_200, Canonicalization::Jcs),
            "687cac37710f384120a0dc98512d08593efc0c9dc0e880a0c48af959eaef1ad3"
        );
    }

    #[test]
    fn lenient_mode_hashes_under_its_own_domain_strings() {
        assert_eq!(
            derive_key(
                &run("run-1"),
                &tool("issue_credit"),
                AMOUNT_200,
                Canonicalization::JcsLenient
            ),
            "f3cd3ae1c4fe508bc7171acea56462005bb87633664d6216070b3ec65b16492e"
        );
        assert_eq!(
            fingerprint(
                &tool("issue_credit"),
                AMOUNT_200,
                Canonicalization::JcsLenient
            ),
            "9bfc1c37b6dbfb7d75e801fd3e9a82b1124a544d928647abb1bdd6fcff107241"
        );
    }

    #[test]
    fn keys_differ_by_run_and_tool_while_fingerprints_ignore_the_run() {
        let a = derive_key(&run("run-1"), &tool("t"), "{}", Canonicalization::Jcs);
        let b = derive_key(&run("run-2"), &tool("t"), "{}", Canonicalization::Jcs);
        let c = derive_key(&run("run-1"), &tool("u"), "{}", Canonicalization::Jcs);
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_ne!(b, c);
        assert_eq!(a.len(), 64);
        assert!(
            a.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        );
    }

    #[test]
    fn zero_byte_separators_keep_run_and_tool_boundaries_apart() {
        let a = derive_key(&run("ab"), &tool("c"), "{}", Canonicalization::Jcs);
        let b = derive_key(&run("a"), &tool("bc"), "{}", Canonicalization::Jcs);
        assert_ne!(a, b);
    }

    #[test]
    fn a_key_is_an_explicit_key_or_a_derived_one_and_a_stored_one_is_not_checked_again() {
        let explicit = Key::from(ExplicitKey::parse("wf-7:step-3").expect("a key"));
        assert_eq!(explicit, "wf-7:step-3");
        let derived = Key::derive(
            &run("run-1"),
            &tool("issue_credit"),
            AMOUNT_200,
            Canonicalization::Jcs,
        );
        assert_eq!(
            derived,
            derive_key(
                &run("run-1"),
                &tool("issue_credit"),
                AMOUNT_200,
                Canonicalization::Jcs
            )
        );
        // A row written under older, looser rules stays readable.
        assert!(ExplicitKey::parse("order 42").is_err());
        assert_eq!(Key::from_stored("order 42".into()).as_str(), "order 42");
        assert_eq!(RunId::from_stored(String::new()).as_str(), "");
    }

    #[test]
    fn a_key_a_caller_names_follows_the_explicit_key_rules() {
        let derived = derive_key(&run("r"), &tool("t"), "{}", Canonicalization::Jcs);
        assert_eq!(Key::parse(&derived).expect("a derived key"), derived);
        assert_eq!(Key::parse("wf-7:step-3").expect("a key"), "wf-7:step-3");
        for bad in ["", "order 42", "clé", &"k".repeat(256)] {
            let err = Key::parse(bad).expect_err(bad);
            assert_eq!(err, ExplicitKey::parse(bad).expect_err(bad));
            assert_eq!(err.field, "key");
        }
    }

    #[test]
    fn a_claim_without_a_key_derives_it_from_its_required_run() {
        let derived = ClaimKey::parse("", "run-1").expect("a run");
        assert_eq!(derived, ClaimKey::Derived(run("run-1")));
        assert_eq!(derived.run_id(), Some(&run("run-1")));
        assert_eq!(derived.explicit(), None);
        assert_eq!(
            derived.into_key(&tool("issue_credit"), AMOUNT_200, Canonicalization::Jcs),
            (
                Key::from_stored(derive_key(
                    &run("run-1"),
                    &tool("issue_credit"),
                    AMOUNT_200,
                    Canonicalization::Jcs
                )),
                Some(run("run-1"))
            )
        );
        let missing = ClaimKey::parse("", "").expect_err("no key, no run");
        assert_eq!(missing.to_string(), "run_id: must not be empty");
        assert_eq!(ClaimKey::parse("", "a\nb").expect_err("CR").field, "run_id");
    }

    #[test]
    fn a_claim_with_a_key_keeps_a_run_only_when_given() {
        let alone = ClaimKey::parse("wf-7:step-3", "").expect("a key alone");
        assert_eq!(alone.run_id(), None);
        assert_eq!(
            alone.explicit().map(ExplicitKey::as_str),
            Some("wf-7:step-3")
        );
        assert_eq!(
            alone.into_key(&tool("t"), "{}", Canonicalization::Jcs),
            (Key::from_stored("wf-7:step-3".into()), None)
        );
        let with_run = ClaimKey::parse("wf-7:step-3", "run-1").expect("a key and a run");
        assert_eq!(with_run.run_id(), Some(&run("run-1")));
        assert_eq!(
            with_run.into_key(&tool("t"), "{}", Canonicalization::Jcs),
            (Key::from_stored("wf-7:step-3".into()), Some(run("run-1")))
        );
        // The run is checked first, then the key.
        assert_eq!(
            ClaimKey::parse("bad key", "a\0b").expect_err("both").field,
            "run_id"
        );
        assert_eq!(
            ClaimKey::parse("bad key", "run-1").expect_err("key").field,
            "key"
        );
        assert_eq!(
            ClaimKey::parse("bad key", "").expect_err("key").field,
            "key"
        );
    }
}
