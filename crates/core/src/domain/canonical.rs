//! Canonical JSON for tool-call arguments: a strict RFC 8259 parser with the ledger's refusals
//! (duplicate members, lone surrogates, integers a double cannot hold, nesting and size limits),
//! the optional lenient clean-up, and RFC 8785 (JCS) serialization. The canonical text is what the
//! key and fingerprint in [`super::key`] hash, so every byte it produces is part of the documented behaviour.

use crate::reason::Reason;
use std::fmt::Write as _;

mod parser;

use parser::Parser;

/// How tool-call arguments are canonicalized before hashing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Canonicalization {
    /// Plain RFC 8785 (JCS).
    #[default]
    Jcs,
    /// JCS after trimming Unicode white space around string values and dropping members whose
    /// value is `null`, at every depth. Hashed under its own domain strings, so keys never
    /// collide with [`Canonicalization::Jcs`] keys.
    JcsLenient,
}

/// Bounds on the arguments text, enforced before and during parsing.
#[derive(Clone, Copy, Debug)]
pub struct JsonLimits {
    /// Longest accepted text, in UTF-8 bytes.
    pub max_bytes: usize,
    /// Deepest accepted nesting: a scalar is depth 0, `{}` and `[]` are 1, `{"a":[1]}` is 2.
    pub max_depth: usize,
}

impl Default for JsonLimits {
    /// 1 MiB and 64 levels.
    fn default() -> Self {
        Self {
            max_bytes: 1_048_576,
            max_depth: 64,
        }
    }
}

/// Why arguments text was refused. [`CanonicalError::reason`] gives the stable wire string.
///
/// Member names and number literals quoted in these errors are shortened to their first 64
/// characters (and an ellipsis), since the text they come from can be a megabyte long.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CanonicalError {
    /// The text is not JSON as RFC 8259 defines it.
    #[error("invalid JSON at byte {offset}: {message}")]
    InvalidJson {
        /// Byte offset of the problem in the text.
        offset: usize,
        /// What was wrong there.
        message: String,
    },
    /// One object has two members with the same name (compared after unescaping).
    #[error("duplicate member name {name:?} at byte {offset}")]
    DuplicateMember {
        /// The repeated name, unescaped.
        name: String,
        /// Byte offset of the second occurrence's opening quote.
        offset: usize,
    },
    /// A `\uD800`-`\uDFFF` escape that is not half of a high+low pair.
    #[error(
        "lone surrogate escape \\u{code_unit:04X} at byte {offset}: a surrogate must be part of a high+low pair"
    )]
    LoneSurrogate {
        /// The unpaired UTF-16 code unit.
        code_unit: u16,
        /// Byte offset of its backslash.
        offset: usize,
    },
    /// An integer literal (no fraction, no exponent) that no IEEE-754 double holds exactly,
    /// or a number beyond the double range altogether.
    #[error("number {literal} at byte {offset} {problem}")]
    UnsafeInteger {
        /// The number as written (shortened).
        literal: String,
        /// Byte offset of its first character.
        offset: usize,
        /// Which of the two problems it is, as a phrase.
        problem: &'static str,
    },
    /// Containers nest deeper than [`JsonLimits::max_depth`].
    #[error("JSON nesting at byte {offset} is deeper than the limit of {max_depth}")]
    JsonTooDeep {
        /// The configured limit.
        max_depth: usize,
        /// Byte offset of the first bracket past the limit.
        offset: usize,
    },
    /// The text is longer than [`JsonLimits::max_bytes`].
    #[error("arguments are {len} bytes, more than the limit of {max_bytes} bytes")]
    ArgumentsTooLarge {
        /// Length of the text in bytes.
        len: usize,
        /// The configured limit.
        max_bytes: usize,
    },
    /// The top-level value is not an object.
    #[error(
        "arguments must be a JSON object, got {found} (a tool without arguments sends {{}}; a string here is often double-encoded JSON)"
    )]
    ArgumentsNotObject {
        /// What it was instead: "array", "string", "number", "boolean" or "null".
        found: &'static str,
    },
}

impl CanonicalError {
    /// The reason this refusal is sent with.
    #[must_use]
    pub fn reason(&self) -> Reason {
        match self {
            Self::InvalidJson { .. } => Reason::InvalidJson,
            Self::DuplicateMember { .. } => Reason::DuplicateMember,
            Self::LoneSurrogate { .. } => Reason::LoneSurrogate,
            Self::UnsafeInteger { .. } => Reason::UnsafeInteger,
            Self::JsonTooDeep { .. } => Reason::JsonTooDeep,
            Self::ArgumentsTooLarge { .. } => Reason::ArgumentsTooLarge,
            Self::ArgumentsNotObject { .. } => Reason::ArgumentsNotObject,
        }
    }
}

/// How many characters of a member name or number literal an error message quotes.
const QUOTE_CHARS: usize = 64;

/// A parsed JSON value (objects keep members in a Vec, in input order, duplicates already refused).
///
/// Values from [`parse`] nest no deeper than the [`JsonLimits::max_depth`] they were parsed
/// with; [`Value::into_lenient`] and [`Value::write_canonical`] recurse once per level.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// Any number, as the double a JavaScript engine would read it as.
    Number(f64),
    /// A string, unescaped.
    String(String),
    /// An array, in order.
    Array(Vec<Value>),
    /// An object's members, in input order.
    Object(Vec<(String, Value)>),
}

impl Value {
    /// Applies the lenient clean-up: trims Unicode white space (`char::is_whitespace`, the
    /// `White_Space` property) from both ends of every string value, and drops object members
    /// whose value is `null`, at every depth. Member names and `null`s inside arrays are kept.
    #[must_use]
    pub fn into_lenient(self) -> Value {
        match self {
            Value::String(s) => {
                let trimmed = s.trim();
                if trimmed.len() == s.len() {
                    Value::String(s)
                } else {
                    Value::String(trimmed.to_owned())
                }
            }
            Value::Array(items) => {
                Value::Array(items.into_iter().map(Value::into_lenient).collect())
            }
            Value::Object(members) => Value::Object(
                members
                    .into_iter()
                    .filter(|(_, value)| *value != Value::Null)
                    .map(|(name, value)| (name, value.into_lenient()))
                    .collect(),
            ),
            scalar => scalar,
        }
    }

    /// Appends the RFC 8785 (JCS) serialization of this value to `out`.
    ///
    /// A non-finite number, which [`parse`] never produces, is written as `null`, as
    /// ECMAScript's `JSON.stringify` does.
    pub fn write_canonical(&self, out: &mut String) {
        match self {
            Value::Bool(true) => out.push_str("true"),
            Value::Bool(false) => out.push_str("false"),
            Value::Number(n) if n.is_finite() => {
                // ryu-js implements ECMAScript Number::toString, which JCS adopts verbatim,
                // including printing -0 as `0`.
                out.push_str(ryu_js::Buffer::new().format_finite(*n));
            }
            Value::Null | Value::Number(_) => out.push_str("null"),
            Value::String(s) => write_string(s, out),
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    item.write_canonical(out);
                }
                out.push(']');
            }
            Value::Object(members) => {
                // JCS orders members by their names' UTF-16 code units, which differs from
                // UTF-8 byte (and code point) order once characters above U+FFFF meet
                // characters in U+E000..U+FFFF.
                let mut sorted: Vec<&(String, Value)> = members.iter().collect();
                sorted.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
                out.push('{');
                for (i, (name, value)) in sorted.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write_string(name, out);
                    out.push(':');
                    value.write_canonical(out);
                }
                out.push('}');
            }
        }
    }

    /// The JSON type name, for messages.
    fn kind(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        }
    }
}

/// Writes a string with JCS's minimal escaping: only `"`, `\` and U+0000..U+001F are escaped;
/// everything else, U+007F, U+2028 and characters above the BMP included, is written as is.
fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{08}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{0C}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            c if c < ' ' => {
                // Writing to a String cannot fail.
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Parses JSON text strictly (RFC 8259) with the ledger's extra refusals. Does not require the
/// top-level value to be an object; [`canonicalize`] does.
///
/// # Errors
///
/// [`CanonicalError::ArgumentsTooLarge`] if `text` is longer than `limits.max_bytes` (checked
/// before parsing); otherwise the first problem found reading left to right:
/// [`CanonicalError::InvalidJson`], [`CanonicalError::DuplicateMember`],
/// [`CanonicalError::LoneSurrogate`], [`CanonicalError::UnsafeInteger`] or
/// [`CanonicalError::JsonTooDeep`].
pub fn parse(text: &str, limits: &JsonLimits) -> Result<Value, CanonicalError> {
    if text.len() > limits.max_bytes {
        return Err(CanonicalError::ArgumentsTooLarge {
            len: text.len(),
            max_bytes: limits.max_bytes,
        });
    }
    let mut parser = Parser {
        text,
        bytes: text.as_bytes(),
        pos: 0,
        max_depth: limits.max_depth,
    };
    let value = parser.value()?;
    parser.skip_whitespace();
    if parser.pos < parser.bytes.len() {
        return Err(parser.unexpected("end of input after the JSON value"));
    }
    Ok(value)
}

/// The whole pipeline used by the server: size check, parse, top-level object check, lenient
/// step if asked, JCS text.
///
/// # Errors
///
/// Everything [`parse`] refuses, and [`CanonicalError::ArgumentsNotObject`] when the top-level
/// value is not an object.
pub fn canonicalize(
    text: &str,
    mode: Canonicalization,
    limits: &JsonLimits,
) -> Result<String, CanonicalError> {
    canonical_value(text, mode, limits).map(|(_, canonical)| canonical)
}

/// [`canonicalize`], also returning the value the canonical text was written from (after the
/// lenient step, if asked), for whatever else needs the tree (redaction for audit).
///
/// # Errors
///
/// As [`canonicalize`].
pub fn canonical_value(
    text: &str,
    mode: Canonicalization,
    limits: &JsonLimits,
) -> Result<(Value, String), CanonicalError> {
    let value = parse(text, limits)?;
    if !matches!(value, Value::Object(_)) {
        return Err(CanonicalError::ArgumentsNotObject {
            found: value.kind(),
        });
    }
    let value = match mode {
        Canonicalization::Jcs => value,
        Canonicalization::JcsLenient => value.into_lenient(),
    };
    let mut out = String::with_capacity(text.len());
    value.write_canonical(&mut out);
    Ok((value, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jcs(text: &str) -> String {
        canonicalize(text, Canonicalization::Jcs, &JsonLimits::default())
            .unwrap_or_else(|e| panic!("{text:?} was refused: {e}"))
    }

    fn lenient(text: &str) -> String {
        canonicalize(text, Canonicalization::JcsLenient, &JsonLimits::default())
            .unwrap_or_else(|e| panic!("{text:?} was refused: {e}"))
    }

    fn refusal(text: &str) -> CanonicalError {
        match canonicalize(text, Canonicalization::Jcs, &JsonLimits::default()) {
            Ok(out) => panic!("{text:?} was accepted as {out:?}"),
            Err(e) => e,
        }
    }

    fn reason(text: &str) -> &'static str {
        refusal(text).reason().as_str()
    }

    /// The canonical form of a single number, via `{"n":...}`.
    fn number(literal: &str) -> String {
        let out = jcs(&format!(r#"{{"n":{literal}}}"#));
        out[5..out.len() - 1].to_owned()
    }

    #[test]
    fn member_names_sort_by_utf16_code_units_not_utf8_bytes() {
        // U+1F600 is D83D DE00 in UTF-16, before FB33; in UTF-8 (F0 ..) it comes after (EF ..).
        assert_eq!(
            jcs(r#"{"\ufb33":1,"\ud83d\ude00":2}"#),
            "{\"\u{1f600}\":2,\"\u{fb33}\":1}"
        );
    }

    #[test]
    fn rfc_8785_sorting_example_orders_as_published() {
        let text = r#"{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh","1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis"}"#;
        let names: Vec<String> = match parse(&jcs(text), &JsonLimits::default()) {
            Ok(Value::Object(members)) => members.into_iter().map(|(n, _)| n).collect(),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            names,
            [
                "\r",
                "1",
                "\u{80}",
                "\u{f6}",
                "\u{20ac}",
                "\u{1f600}",
                "\u{fb33}"
            ]
        );
    }

    #[test]
    fn members_sort_at_every_depth_and_arrays_keep_their_order() {
        assert_eq!(
            jcs(r#"{"b":{"d":1,"c":[{"z":1,"y":2},3,1]},"a":true}"#),
            r#"{"a":true,"b":{"c":[{"y":2,"z":1},3,1],"d":1}}"#
        );
    }

    #[test]
    fn parse_keeps_members_in_input_order() {
        let value = parse(r#"{"b":1,"a":2}"#, &JsonLimits::default()).expect("valid");
        assert_eq!(
            value,
            Value::Object(vec![
                ("b".to_owned(), Value::Number(1.0)),
                ("a".to_owned(), Value::Number(2.0)),
            ])
        );
    }

    #[test]
    fn insignificant_whitespace_is_removed_and_surrounding_whitespace_is_fine() {
        assert_eq!(
            jcs(" \t\r\n{ \"a\" : [ 1 , 2 ] , \"b\" :\n{ } }\n "),
            r#"{"a":[1,2],"b":{}}"#
        );
    }

    #[test]
    fn empty_object_and_scalars_canonicalize_to_their_plain_forms() {
        assert_eq!(jcs("{}"), "{}");
        assert_eq!(
            jcs(r#"{"t":true,"f":false,"n":null,"e":[],"s":""}"#),
            r#"{"e":[],"f":false,"n":null,"s":"","t":true}"#
        );
    }

    #[test]
    fn number_spellings_of_the_same_value_canonicalize_alike() {
        for spelling in [
            "200",
            "200.0",
            "2e2",
            "2E+2",
            "2000e-1",
            "0.2e3",
            "200.000e0",
        ] {
            assert_eq!(number(spelling), "200", "{spelling}");
        }
    }

    #[test]
    fn numbers_print_in_ecmascript_shortest_round_trip_form() {
        let table = [
            ("1e21", "1e+21"),
            ("1e20", "100000000000000000000"),
            ("1e-7", "1e-7"),
            ("1e-6", "0.000001"),
            ("0.1", "0.1"),
            ("-1.5", "-1.5"),
            ("5e-324", "5e-324"),
            ("123456789.125", "123456789.125"),
            ("333333333.33333329", "333333333.3333333"),
            ("4.50", "4.5"),
            ("2e-3", "0.002"),
            ("0.000000000000000000000000001", "1e-27"),
            ("1152921504606846976", "1152921504606847000"),
            ("9007199254740992", "9007199254740992"),
            ("1.5e-300", "1.5e-300"),
            // 2^70: above 1e21, so exponent form.
            ("1180591620717411303424", "1.1805916207174113e+21"),
        ];
        for (literal, expected) in table {
            assert_eq!(number(literal), expected, "{literal}");
        }
    }

    #[test]
    fn negative_zero_prints_as_zero() {
        for spelling in ["-0", "-0.0", "-0e5", "0", "0.0"] {
            assert_eq!(number(spelling), "0", "{spelling}");
        }
    }

    #[test]
    fn numbers_too_small_for_a_double_read_as_zero_like_javascript() {
        assert_eq!(number("1e-400"), "0");
        assert_eq!(number("-1e-400"), "0");
    }

    #[test]
    fn safe_and_exactly_representable_integers_are_accepted() {
        assert_eq!(number("9007199254740992"), "9007199254740992");
        assert_eq!(number("-9007199254740992"), "-9007199254740992");
        assert_eq!(number("1e22"), "1e+22");
        // 2^60 is not "safe" but a double holds it exactly.
        assert_eq!(number("1152921504606846976"), "1152921504606847000");
        // The largest double, written out in full.
        let max = format!("{:.0}", f64::MAX);
        assert_eq!(number(&max), "1.7976931348623157e+308");
    }

    #[test]
    fn integer_literals_a_double_cannot_hold_are_refused() {
        for spelling in [
            "9007199254740993",
            "-9007199254740993",
            "123456789012345678901234567890",
        ] {
            let err = refusal(&format!(r#"{{"n":{spelling}}}"#));
            assert_eq!(err.reason(), "UNSAFE_INTEGER", "{spelling}");
        }
        let huge = format!(r#"{{"n":1{}}}"#, "0".repeat(400));
        assert_eq!(refusal(&huge).reason(), "UNSAFE_INTEGER");
        assert_eq!(
            refusal(r#"{"n": 9007199254740993}"#).to_string(),
            "number 9007199254740993 at byte 6 is an integer that an IEEE-754 double cannot hold exactly"
        );
    }

    #[test]
    fn a_fraction_or_an_exponent_makes_a_double_that_rounds_as_javascript_does() {
        for (spelling, canonical) in [
            ("9007199254740993.0", "9007199254740992"),
            ("9.007199254740993e15", "9007199254740992"),
            ("90071992547409930e-1", "9007199254740992"),
            ("1e23", "1e+23"),
            ("1E30", "1e+30"),
            ("1.7976931348623157e308", "1.7976931348623157e+308"),
            ("1.5e300", "1.5e+300"),
            ("2.0", "2"),
        ] {
            assert_eq!(number(spelling), canonical, "{spelling}");
        }
    }

    #[test]
    fn numbers_beyond_the_double_range_are_refused() {
        for spelling in ["1e400", "-1e400", "1e99999999999999999999999"] {
            assert_eq!(reason(&format!(r#"{{"n":{spelling}}}"#)), "UNSAFE_INTEGER");
        }
        // Not an integer, but rounds to infinity all the same.
        let huge_fraction = format!(r#"{{"n":1{}.5}}"#, "0".repeat(400));
        let err = refusal(&huge_fraction);
        assert_eq!(err.reason(), "UNSAFE_INTEGER");
        assert!(err.to_string().contains("beyond the range"), "{err}");
        assert!(
            err.to_string().contains('…'),
            "long literals are shortened: {err}"
        );
    }

    #[test]
    fn non_integers_are_accepted_and_rounded_like_javascript() {
        assert_eq!(number("9007199254740993.5"), "9007199254740994");
        assert_eq!(number("0.30000000000000004"), "0.30000000000000004");
        assert_eq!(
            number("1.00000000000000011102230246251565404236316680908203125"),
            "1"
        );
    }

    #[test]
    fn strings_use_minimal_jcs_escaping() {
        assert_eq!(
            jcs(r#"{"s":"\/\u0041\b\f\n\r\t\"\\\u001f\u0001\u007f\u2028\u00e9\ud83d\ude00"}"#),
            "{\"s\":\"/A\\b\\f\\n\\r\\t\\\"\\\\\\u001f\\u0001\u{7f}\u{2028}é\u{1f600}\"}"
        );
    }

    #[test]
    fn nul_inside_a_string_is_kept_and_escaped() {
        assert_eq!(jcs(r#"{"a\u0000b":"\u0000"}"#), r#"{"a\u0000b":"\u0000"}"#);
    }

    #[test]
    fn raw_non_ascii_and_del_pass_through_unchanged() {
        assert_eq!(
            jcs("{\"k\":\"\u{7f}€\u{10ffff}\"}"),
            "{\"k\":\"\u{7f}€\u{10ffff}\"}"
        );
    }

    #[test]
    fn lone_surrogates_are_refused_high_or_low() {
        for text in [
            r#"{"s":"\ud800"}"#,
            r#"{"s":"\udc00"}"#,
            r#"{"s":"\ud800x"}"#,
            r#"{"s":"\ud800\u0041"}"#,
            r#"{"s":"\ud800\ud800\udc00"}"#,
            r#"{"s":"\ude00\ud83d"}"#,
            r#"{"\udfff":1}"#,
        ] {
            assert_eq!(reason(text), "LONE_SURROGATE", "{text}");
        }
        assert_eq!(
            refusal(r#"{"s":"ab\uDC00"}"#),
            CanonicalError::LoneSurrogate {
                code_unit: 0xDC00,
                offset: 8
            }
        );
    }

    #[test]
    fn duplicate_member_names_are_refused_after_unescaping() {
        let err = refusal(r#"{"a":1,"\u0061":2}"#);
        assert_eq!(
            err,
            CanonicalError::DuplicateMember {
                name: "a".to_owned(),
                offset: 7
            }
        );
        assert_eq!(err.to_string(), r#"duplicate member name "a" at byte 7"#);
        assert_eq!(reason(r#"{"x":{"a":1,"b":2,"a":3}}"#), "DUPLICATE_MEMBER");
    }

    #[test]
    fn the_same_name_in_different_objects_is_fine() {
        assert_eq!(
            jcs(r#"{"a":{"a":1},"b":[{"a":1},{"a":2}]}"#),
            r#"{"a":{"a":1},"b":[{"a":1},{"a":2}]}"#
        );
    }

    #[test]
    fn text_that_is_not_strict_json_is_refused() {
        for text in [
            "",
            "   ",
            "{",
            "{\"a\":1,}",
            "{\"a\":[1,2,]}",
            "{\"a\":1 /* c */}",
            "// c\n{}",
            "{'a':1}",
            "{\"a\":'x'}",
            "{a:1}",
            "{\"a\":01}",
            "{\"a\":-01}",
            "{\"a\":+1}",
            "{\"a\":.5}",
            "{\"a\":1.}",
            "{\"a\":1e}",
            "{\"a\":1e+}",
            "{\"a\":-}",
            "{\"a\":NaN}",
            "{\"a\":Infinity}",
            "{\"a\":-Infinity}",
            "{\"a\":tru}",
            "{\"a\":True}",
            "{\"a\":\"tab\there\"}",
            "{\"a\":\"nl\nhere\"}",
            "{\"a\":\"\\x41\"}",
            "{\"a\":\"\\u12\"}",
            "{\"a\":\"\\u12G4\"}",
            "{\"a\":\"unterminated}",
            "{\"a\" 1}",
            "{\"a\":1 \"b\":2}",
            "{\"a\":1}x",
            "{\"a\":1}{}",
            "{}}",
            "\u{feff}",
            "\u{feff}{}",
            "{\u{a0}}",
            "{\"a\":1}\u{0}",
        ] {
            assert_eq!(reason(text), "INVALID_JSON", "{text:?}");
        }
    }

    #[test]
    fn invalid_json_messages_name_the_problem_and_its_byte_offset() {
        assert_eq!(
            refusal("{\"a\":1,}").to_string(),
            "invalid JSON at byte 7: expected a member name in double quotes, found '}'"
        );
        assert_eq!(
            refusal("{\"a\":01}").to_string(),
            "invalid JSON at byte 5: leading zeros are not allowed"
        );
        assert_eq!(
            refusal("\u{feff}{}").to_string(),
            "invalid JSON at byte 0: expected a value, found a byte order mark (U+FEFF)"
        );
        assert_eq!(
            refusal("{\"a\":\"x\u{1}\"}").to_string(),
            "invalid JSON at byte 7: unescaped control character U+0001 in a string (write it as \\u0001)"
        );
        assert_eq!(
            refusal("{} x").to_string(),
            "invalid JSON at byte 3: expected end of input after the JSON value, found 'x'"
        );
        assert_eq!(
            refusal("").to_string(),
            "invalid JSON at byte 0: expected a value, found end of input"
        );
    }

    #[test]
    fn depth_at_the_limit_is_accepted_and_one_more_is_refused() {
        // The object is level 1, so 63 arrays inside it reach depth 64.
        let at_limit = format!("{{\"a\":{}{}}}", "[".repeat(63), "]".repeat(63));
        assert!(canonicalize(&at_limit, Canonicalization::Jcs, &JsonLimits::default()).is_ok());
        let over = format!("{{\"a\":{}{}}}", "[".repeat(64), "]".repeat(64));
        assert_eq!(
            refusal(&over),
            CanonicalError::JsonTooDeep {
                max_depth: 64,
                offset: 5 + 63
            }
        );
    }

    #[test]
    fn depth_counts_containers_not_scalars() {
        let limits = |max_depth| JsonLimits {
            max_bytes: 1024,
            max_depth,
        };
        assert_eq!(parse("1", &limits(0)), Ok(Value::Number(1.0)));
        assert_eq!(
            parse("{}", &limits(0)).map_err(|e| e.reason().as_str()),
            Err("JSON_TOO_DEEP")
        );
        assert!(parse("{}", &limits(1)).is_ok());
        assert!(parse(r#"{"a":1,"b":"x"}"#, &limits(1)).is_ok());
        assert!(parse(r#"{"a":[1]}"#, &limits(1)).is_err());
        assert!(parse(r#"{"a":[1]}"#, &limits(2)).is_ok());
        assert!(parse("[[],[[]],{}]", &limits(3)).is_ok());
        assert!(parse("[[],[[[]]],{}]", &limits(3)).is_err());
    }

    #[test]
    fn a_million_open_brackets_do_not_overflow_the_stack() {
        let deep = "[".repeat(1_000_000);
        let limits = JsonLimits {
            max_bytes: 2_000_000,
            max_depth: 64,
        };
        assert_eq!(
            parse(&deep, &limits).map_err(|e| e.reason().as_str()),
            Err("JSON_TOO_DEEP")
        );
        // Even with no depth limit the parser itself keeps its stack on the heap.
        let unlimited = JsonLimits {
            max_bytes: 2_000_000,
            max_depth: usize::MAX,
        };
        assert_eq!(
            parse(&deep, &unlimited).map_err(|e| e.reason().as_str()),
            Err("INVALID_JSON")
        );
    }

    #[test]
    fn text_over_the_byte_limit_is_refused_before_parsing() {
        let limits = JsonLimits {
            max_bytes: 8,
            max_depth: 64,
        };
        assert!(canonicalize(r#"{"a":12}"#, Canonicalization::Jcs, &limits).is_ok());
        // Nine bytes of garbage: the size is what is reported, not the syntax.
        let err = canonicalize("{{{{{{{{{", Canonicalization::Jcs, &limits).expect_err("too large");
        assert_eq!(
            err,
            CanonicalError::ArgumentsTooLarge {
                len: 9,
                max_bytes: 8
            }
        );
        assert_eq!(
            err.to_string(),
            "arguments are 9 bytes, more than the limit of 8 bytes"
        );
        // Bytes, not characters.
        assert!(canonicalize("{\"é\":\"é\"}", Canonicalization::Jcs, &limits).is_err());
    }

    #[test]
    fn the_top_level_value_must_be_an_object() {
        for (text, found) in [
            ("[]", "array"),
            (r#""{\"a\":1}""#, "string"),
            ("42", "number"),
            ("true", "boolean"),
            ("null", "null"),
        ] {
            assert_eq!(
                refusal(text),
                CanonicalError::ArgumentsNotObject { found },
                "{text}"
            );
        }
        // parse itself takes any value.
        assert_eq!(
            parse("[1]", &JsonLimits::default()),
            Ok(Value::Array(vec![Value::Number(1.0)]))
        );
    }

    #[test]
    fn lenient_trims_string_values_but_not_member_names() {
        assert_eq!(
            lenient("{\" name \":\"  Ada \\n\",\"list\":[\" x \",\"\\t\"]}"),
            r#"{" name ":"Ada","list":["x",""]}"#
        );
    }

    #[test]
    fn lenient_trims_unicode_white_space_but_not_zero_width_space_or_other_controls() {
        // U+00A0, U+3000 and U+2028 have White_Space; U+200B and U+001F do not.
        assert_eq!(
            lenient(
                "{\"a\":\"\u{a0}\u{3000}x\u{2028}\",\"b\":\"\u{200b}y\u{200b}\",\"c\":\"\\u001fz\"}"
            ),
            "{\"a\":\"x\",\"b\":\"\u{200b}y\u{200b}\",\"c\":\"\\u001fz\"}"
        );
    }

    #[test]
    fn lenient_drops_null_members_at_every_depth_but_keeps_nulls_in_arrays() {
        assert_eq!(
            lenient(r#"{"a":null,"b":{"c":null,"d":1},"e":[null,{"f":null}],"g":{"h":null}}"#),
            r#"{"b":{"d":1},"e":[null,{}],"g":{}}"#
        );
    }

    #[test]
    fn lenient_and_strict_forms_differ_only_where_the_clean_up_applies() {
        assert_eq!(
            lenient(r#"{"a":1,"b":[true]}"#),
            jcs(r#"{"a":1,"b":[true]}"#)
        );
        assert_ne!(lenient(r#"{"a":" x"}"#), jcs(r#"{"a":" x"}"#));
    }

    #[test]
    fn reasons_are_stable_screaming_snake_strings() {
        let cases = [
            (
                CanonicalError::InvalidJson {
                    offset: 0,
                    message: String::new(),
                },
                "INVALID_JSON",
            ),
            (
                CanonicalError::DuplicateMember {
                    name: String::new(),
                    offset: 0,
                },
                "DUPLICATE_MEMBER",
            ),
            (
                CanonicalError::LoneSurrogate {
                    code_unit: 0xD800,
                    offset: 0,
                },
                "LONE_SURROGATE",
            ),
            (
                CanonicalError::UnsafeInteger {
                    literal: String::new(),
                    offset: 0,
                    problem: "",
                },
                "UNSAFE_INTEGER",
            ),
            (
                CanonicalError::JsonTooDeep {
                    max_depth: 1,
                    offset: 0,
                },
                "JSON_TOO_DEEP",
            ),
            (
                CanonicalError::ArgumentsTooLarge {
                    len: 2,
                    max_bytes: 1,
                },
                "ARGUMENTS_TOO_LARGE",
            ),
            (
                CanonicalError::ArgumentsNotObject { found: "array" },
                "ARGUMENTS_NOT_OBJECT",
            ),
        ];
        for (err, expected) in cases {
            assert_eq!(err.reason(), expected);
        }
    }

    #[test]
    fn long_member_names_are_shortened_in_errors() {
        let name = "n".repeat(1000);
        let err = refusal(&format!(r#"{{"{name}":1,"{name}":2}}"#));
        match err {
            CanonicalError::DuplicateMember { name, .. } => {
                assert_eq!(name.chars().count(), QUOTE_CHARS + 1);
                assert!(name.ends_with('…'));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn write_canonical_prints_non_finite_numbers_as_null() {
        let mut out = String::new();
        Value::Array(vec![Value::Number(f64::NAN), Value::Number(f64::INFINITY)])
            .write_canonical(&mut out);
        assert_eq!(out, "[null,null]");
    }

    #[test]
    fn canonical_output_of_a_canonical_text_is_itself() {
        let once = jcs(r#"{"z":[1,{"y":"\u00e9\n"}],"a":0.5}"#);
        assert_eq!(jcs(&once), once);
    }
}
