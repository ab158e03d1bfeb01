//! Validated request fields (run id, tool name, explicit key, principal) and the derivation of
//! idempotency keys and argument fingerprints from canonical arguments:
//!
//! ```text
//! key         = hex(sha256("idem.v1" 0x00 run_id 0x00 tool 0x00 canonical))
//! fingerprint = hex(sha256("idem.v1.fp" 0x00 tool 0x00 canonical))
//! ```
//!
//! The lenient form hashes under `idem.v1.lenient` and `idem.v1.lenient.fp` instead.

use sha2::{Digest, Sha256};

use super::canonical::Canonicalization;

/// A request field that failed validation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct InvalidField {
    /// The proto field name: `run_id`, `tool`, `key` or `principal`.
    pub field: &'static str,
    /// What is wrong with it.
    pub message: String,
}

/// Longest run id, tool name and principal, in UTF-8 bytes.
const MAX_NAME_BYTES: usize = 256;
/// Longest explicit key, in bytes.
const MAX_KEY_BYTES: usize = 255;

/// Checks a UTF-8 field for length in bytes and for control characters (Unicode Cc:
/// U+0000..U+001F and U+007F..U+009F), which would corrupt logs and hash input boundaries.
pub(super) fn check_text(
    field: &'static str,
    s: &str,
    min_bytes: usize,
    max_bytes: usize,
) -> Result<(), InvalidField> {
    let invalid = |message: String| InvalidField { field, message };
    if s.len() < min_bytes {
        return Err(invalid("must not be empty".to_owned()));
    }
    if s.len() > max_bytes {
        return Err(invalid(format!(
            "must be at most {max_bytes} bytes, got {}",
            s.len()
        )));
    }
    if let Some((at, c)) = s.char_indices().find(|(_, c)| c.is_control()) {
        return Err(invalid(format!(
            "must not contain control characters, found U+{:04X} at byte {at}",
            u32::from(c)
        )));
    }
    Ok(())
}

/// The agent run a tool call belongs to: 1 to 256 bytes of UTF-8 without control characters.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RunId(String);

impl RunId {
    /// Validates a run id.
    ///
    /// # Errors
    ///
    /// [`InvalidField`] for field `run_id` if `s` is empty, longer than 256 bytes or contains a
    /// control character.
    pub fn parse(s: &str) -> Result<RunId, InvalidField> {
        check_text("run_id", s, 1, MAX_NAME_BYTES)?;
        Ok(RunId(s.to_owned()))
    }

    /// The run id as given.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The name of the tool being called: 1 to 256 bytes of UTF-8 without control characters.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ToolName(String);

impl ToolName {
    /// Validates a tool name.
    ///
    /// # Errors
    ///
    /// [`InvalidField`] for field `tool` if `s` is empty, longer than 256 bytes or contains a
    /// control character.
    pub fn parse(s: &str) -> Result<ToolName, InvalidField> {
        check_text("tool", s, 1, MAX_NAME_BYTES)?;
        Ok(ToolName(s.to_owned()))
    }

    /// The tool name as given.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A caller-chosen idempotency key used instead of a derived one: 1 to 255 bytes of printable
/// ASCII (0x21..=0x7E). Space is refused: a key with a space in it is almost always a
/// copy-paste accident, and would silently differ from the intended key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ExplicitKey(String);

impl ExplicitKey {
    /// Validates an explicit key.
    ///
    /// # Errors
    ///
    /// [`InvalidField`] for field `key` if `s` is empty, longer than 255 bytes, or contains
    /// anything but printable ASCII without space.
    pub fn parse(s: &str) -> Result<ExplicitKey, InvalidField> {
        let invalid = |message: String| InvalidField {
            field: "key",
            message,
        };
        if s.is_empty() {
            return Err(invalid("must not be empty".to_owned()));
        }
        if s.len() > MAX_KEY_BYTES {
            return Err(invalid(format!(
                "must be at most {MAX_KEY_BYTES} bytes, got {}",
                s.len()
            )));
        }
        if let Some((at, c)) = s.char_indices().find(|&(_, c)| !('!'..='~').contains(&c)) {
            let what = match c {
                ' ' => "a space".to_owned(),
                c if c.is_ascii() => format!("byte 0x{:02X}", u32::from(c)),
                c => format!("non-ASCII character U+{:04X}", u32::from(c)),
            };
            return Err(invalid(format!(
                "must be printable ASCII without spaces (0x21..=0x7E), found {what} at byte {at}"
            )));
        }
        Ok(ExplicitKey(s.to_owned()))
    }

    /// The key as given.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Who is calling, as the caller or its authentication says: 0 to 256 bytes of UTF-8 without
/// control characters. Empty means no principal.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Principal(String);

impl Principal {
    /// Validates a principal; the empty string is allowed.
    ///
    /// # Errors
    ///
    /// [`InvalidField`] for field `principal` if `s` is longer than 256 bytes or contains a
    /// control character.
    pub fn parse(s: &str) -> Result<Principal, InvalidField> {
        check_text("principal", s, 0, MAX_NAME_BYTES)?;
        Ok(Principal(s.to_owned()))
    }

    /// The principal as given, possibly empty.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

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

/// An optional field's text parsed with `parse`: empty is unset (`None`), any other text must
/// be one.
///
/// # Errors
/// What `parse` refuses.
pub fn optional<T>(
    text: &str,
    parse: fn(&str) -> Result<T, InvalidField>,
) -> Result<Option<T>, InvalidField> {
    if text.is_empty() {
        Ok(None)
    } else {
        parse(text).map(Some)
    }
}

impl From<ExplicitKey> for Key {
    fn from(key: ExplicitKey) -> Key {
        Key(key.0)
    }
}

/// The fencing token of one attempt: whoever holds it may renew the attempt's lease and
/// complete it. The server makes it ([`ClaimToken::random`]: 32 hex characters); a caller
/// sends it back ([`ClaimToken::parse`]), and any other text is merely a token that matches no
/// attempt.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClaimToken(String);

impl ClaimToken {
    /// A fresh token of 128 random bits, as hex.
    ///
    /// # Errors
    /// When the system has no randomness to give.
    pub fn random() -> Result<ClaimToken, getrandom::Error> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes)?;
        Ok(ClaimToken(lower_hex(&bytes)))
    }

    /// A token as a caller sent it back: any text but the empty one, which is no token.
    ///
    /// # Errors
    /// [`InvalidField`] for field `claim_token` when `s` is empty.
    pub fn parse(s: &str) -> Result<ClaimToken, InvalidField> {
        if s.is_empty() {
            return Err(InvalidField {
                field: "claim_token",
                message: "is required".to_owned(),
            });
        }
        Ok(ClaimToken(s.to_owned()))
    }

    /// The token as given.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The token of one Reconcile hand-out of an entry: the fence of the finding its holder sends
/// back. The server mints a fresh one at every hand-out ([`HoldToken::random`]), replacing the
/// last; an entry never handed out has none ([`HoldToken::none`], stored as the empty text).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HoldToken(String);

impl HoldToken {
    /// A fresh token of 128 random bits, as hex.
    ///
    /// # Errors
    /// When the system has no randomness to give.
    pub fn random() -> Result<HoldToken, getrandom::Error> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes)?;
        Ok(HoldToken(lower_hex(&bytes)))
    }

    /// No hold: the entry was never handed out (or not since its attempt started over).
    #[must_use]
    pub fn none() -> HoldToken {
        HoldToken(String::new())
    }

    /// A token as a caller sent it back: any text but the empty one, which names no hold.
    ///
    /// # Errors
    /// [`InvalidField`] for field `hold_token` when `s` is empty.
    pub fn parse(s: &str) -> Result<HoldToken, InvalidField> {
        if s.is_empty() {
            return Err(InvalidField {
                field: "hold_token",
                message: "is required".to_owned(),
            });
        }
        Ok(HoldToken(s.to_owned()))
    }

    /// Whether this is no hold ([`HoldToken::none`]).
    #[must_use]
    pub fn is_none(&self) -> bool {
        self.0.is_empty()
    }

    /// The token as given.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What the text newtypes share: `from_stored` (see below), shown as their text, and compared
/// with plain strings (tests and filters compare them with literals).
///
/// `from_stored` builds the value from what the store holds, **without validating it again**:
/// it was valid under the rules of the server that wrote it, and a rule tightened later must
/// not make an old row unreadable. Only the storage module and tests call it; every request
/// goes through `parse` (or [`Key::derive`]).
macro_rules! text_newtype {
    ($($name:ident),*) => {$(
        impl $name {
            /// The value as the store holds it, not validated again: see the module's
            /// `text_newtype` note (an old row stays readable when a rule tightens).
            #[must_use]
            pub fn from_stored(s: String) -> $name {
                $name(s)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                &self.0 == other
            }
        }

        impl PartialEq<$name> for String {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }

        impl PartialEq<$name> for &str {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }
    )*};
}

text_newtype!(RunId, ToolName, Key, ClaimToken, HoldToken, Principal);

impl Default for Principal {
    /// No principal ([`Principal::none`]).
    fn default() -> Principal {
        Principal::none()
    }
}

impl Principal {
    /// No principal: the caller named none and its credential names none.
    #[must_use]
    pub fn none() -> Principal {
        Principal(String::new())
    }

    /// Whether no principal was named.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

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

/// `bytes` as lowercase hex, what `hex::encode` gives, written from a table into a `String` of
/// the right size rather than collected from its `char` iterator: every Claim hashes its key and
/// fingerprint and mints a token (what it saved: bench/HISTORY.md, "Figures once written in code comments").
fn lower_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
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

    #[test]
    fn lower_hex_writes_what_the_hex_crate_writes_for_every_byte() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(lower_hex(&all), hex::encode(&all));
        assert_eq!(lower_hex(&[]), "");
    }

    fn run(s: &str) -> RunId {
        RunId::parse(s).expect("valid run id")
    }

    fn tool(s: &str) -> ToolName {
        ToolName::parse(s).expect("valid tool")
    }

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
    fn run_id_accepts_one_to_256_bytes_of_unicode() {
        assert_eq!(run("r").as_str(), "r");
        assert_eq!(run("exécution-7 ✓").as_str(), "exécution-7 ✓");
        assert!(RunId::parse(&"x".repeat(256)).is_ok());
        // 128 two-byte characters are 256 bytes; one more is over.
        assert!(RunId::parse(&"é".repeat(128)).is_ok());
        assert!(RunId::parse(&"é".repeat(129)).is_err());
    }

    #[test]
    fn run_id_refuses_empty_too_long_and_control_characters() {
        let empty = RunId::parse("").expect_err("empty");
        assert_eq!(empty.field, "run_id");
        assert_eq!(empty.to_string(), "run_id: must not be empty");
        let long = RunId::parse(&"x".repeat(257)).expect_err("too long");
        assert!(long.message.contains("257"), "{long}");
        for bad in ["a\0b", "a\nb", "tab\t", "del\u{7f}", "c1\u{85}", "c1\u{9f}"] {
            let err = RunId::parse(bad).expect_err(bad);
            assert!(err.message.contains("control"), "{err}");
        }
        let err = RunId::parse("ab\u{7f}").expect_err("DEL");
        assert_eq!(
            err.message,
            "must not contain control characters, found U+007F at byte 2"
        );
    }

    #[test]
    fn run_id_allows_non_control_format_and_space_characters() {
        // U+00A0 and U+200B are not Cc, and spaces are ordinary in free-form ids.
        assert!(RunId::parse("a\u{a0}b\u{200b}c d").is_ok());
    }

    #[test]
    fn tool_name_has_the_same_rules_under_its_own_field_name() {
        assert_eq!(tool("issue_credit").as_str(), "issue_credit");
        assert_eq!(tool("工具.送信").as_str(), "工具.送信");
        assert!(ToolName::parse(&"t".repeat(256)).is_ok());
        let err = ToolName::parse(&"t".repeat(257)).expect_err("too long");
        assert_eq!(err.field, "tool");
        assert_eq!(ToolName::parse("").expect_err("empty").field, "tool");
        assert_eq!(ToolName::parse("a\rb").expect_err("CR").field, "tool");
    }

    #[test]
    fn explicit_key_accepts_printable_ascii_up_to_255_bytes() {
        let all_printable: String = ('!'..='~').collect();
        assert_eq!(
            ExplicitKey::parse(&all_printable)
                .expect("printable")
                .as_str(),
            all_printable
        );
        assert!(ExplicitKey::parse(&"k".repeat(255)).is_ok());
        let err = ExplicitKey::parse(&"k".repeat(256)).expect_err("too long");
        assert_eq!(err.field, "key");
        assert!(err.message.contains("255"), "{err}");
    }

    #[test]
    fn explicit_key_refuses_space_because_it_is_usually_a_copy_paste_accident() {
        let err = ExplicitKey::parse("order 42").expect_err("space");
        assert_eq!(
            err.to_string(),
            "key: must be printable ASCII without spaces (0x21..=0x7E), found a space at byte 5"
        );
        assert!(ExplicitKey::parse(" order-42").is_err());
        assert!(ExplicitKey::parse("order-42 ").is_err());
    }

    #[test]
    fn explicit_key_refuses_empty_control_and_non_ascii() {
        assert_eq!(
            ExplicitKey::parse("").expect_err("empty").message,
            "must not be empty"
        );
        let tab = ExplicitKey::parse("a\tb").expect_err("tab");
        assert!(tab.message.contains("byte 0x09 at byte 1"), "{tab}");
        let del = ExplicitKey::parse("a\u{7f}").expect_err("DEL");
        assert!(del.message.contains("byte 0x7F"), "{del}");
        let accent = ExplicitKey::parse("clé").expect_err("non-ASCII");
        assert!(accent.message.contains("U+00E9 at byte 2"), "{accent}");
    }

    #[test]
    fn principal_may_be_empty_but_not_too_long_or_controlled() {
        assert_eq!(Principal::parse("").expect("empty").as_str(), "");
        assert_eq!(
            Principal::parse("svc:agent@example").expect("ok").as_str(),
            "svc:agent@example"
        );
        assert!(Principal::parse(&"p".repeat(256)).is_ok());
        let long = Principal::parse(&"p".repeat(257)).expect_err("too long");
        assert_eq!(long.field, "principal");
        let ctl = Principal::parse("p\u{1b}[0m").expect_err("escape");
        assert_eq!(ctl.field, "principal");
    }

    #[test]
    fn a_claim_token_from_a_caller_is_any_text_but_the_empty_one() {
        let empty = ClaimToken::parse("").expect_err("empty");
        assert_eq!(empty.to_string(), "claim_token: is required");
        assert_eq!(
            ClaimToken::parse("not ours").expect("any text").as_str(),
            "not ours"
        );
        let fresh = ClaimToken::random().expect("randomness");
        assert_eq!(fresh.as_str().len(), 32);
        assert!(fresh.as_str().bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(fresh, ClaimToken::random().expect("randomness"));
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
    fn an_optional_field_is_unset_when_empty_and_parsed_otherwise() {
        assert_eq!(optional("", RunId::parse), Ok(None));
        assert_eq!(optional("r-1", RunId::parse), Ok(Some(run("r-1"))));
        let refused = optional("a\nb", ToolName::parse).expect_err("a control character");
        assert_eq!(refused.field, "tool");
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

    #[test]
    fn newtypes_compare_and_hash_by_their_text() {
        use std::collections::HashSet;
        let set: HashSet<RunId> = [run("a"), run("a"), run("b")].into_iter().collect();
        assert_eq!(set.len(), 2);
        assert_eq!(tool("x").clone(), tool("x"));
    }
}
