//! The request fields every use case validates (a run id, a tool name, an explicit key, a
//! principal) and the tokens the server mints (a claim's, a reconciler's hold), each a type of
//! its own that only a valid value reaches, and what they share (`text_newtype!`).

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
    /// The key's text, taken out.
    pub(super) fn into_string(self) -> String {
        self.0
    }

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
/// goes through `parse` (or `Key::derive`).
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

pub(crate) use text_newtype;

text_newtype!(RunId, ToolName, ClaimToken, HoldToken, Principal);

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

/// `bytes` as lowercase hex, what `hex::encode` gives, written from a table into a `String` of
/// the right size rather than collected from its `char` iterator: every Claim hashes its key and
/// fingerprint and mints a token (what it saved: bench/HISTORY.md, "Figures once written in code comments").
pub(super) fn lower_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn run(s: &str) -> RunId {
        RunId::parse(s).expect("valid run id")
    }

    pub(crate) fn tool(s: &str) -> ToolName {
        ToolName::parse(s).expect("valid tool")
    }

    #[test]
    fn lower_hex_writes_what_the_hex_crate_writes_for_every_byte() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(lower_hex(&all), hex::encode(&all));
        assert_eq!(lower_hex(&[]), "");
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
    fn an_optional_field_is_unset_when_empty_and_parsed_otherwise() {
        assert_eq!(optional("", RunId::parse), Ok(None));
        assert_eq!(optional("r-1", RunId::parse), Ok(Some(run("r-1"))));
        let refused = optional("a\nb", ToolName::parse).expect_err("a control character");
        assert_eq!(refused.field, "tool");
    }

    #[test]
    fn newtypes_compare_and_hash_by_their_text() {
        use std::collections::HashSet;
        let set: HashSet<RunId> = [run("a"), run("a"), run("b")].into_iter().collect();
        assert_eq!(set.len(), 2);
        assert_eq!(tool("x").clone(), tool("x"));
    }
}
