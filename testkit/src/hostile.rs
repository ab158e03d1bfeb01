//! Hostile inputs, as [proptest](mod@proptest) strategies: the values of the no-panic
//! property test (`tests/api/no_panic.rs`) that make trouble somewhere — strings with control
//! characters, quotes, SQL wildcards and odd Unicode, at and past the 255/256-byte and 1 MiB
//! limits; arguments JSON that is malformed, too deep, too big or numerically inexact; enum
//! numbers out of range; negative, huge, sub-microsecond and malformed durations; result bytes
//! up to past 1 MiB.
//!
//! It knows nothing of the ledger's messages: the tests build requests from these values (a
//! sensible request with some of its fields swapped for hostile ones, so that hostile values
//! also reach the code behind the first validation). Each strategy shrinks toward its simplest
//! value (an empty string, no duration, a short palette string), so a failing request shrinks
//! to the field that matters; the huge values are built from a small generated seed, so they
//! shrink in a few steps instead of one character at a time.
//!
//! ```
//! use proptest::strategy::{Strategy, ValueTree};
//! use proptest::test_runner::TestRunner;
//!
//! let mut runner = TestRunner::deterministic();
//! let key = testkit::hostile::text().new_tree(&mut runner).unwrap().current();
//! assert!(key.len() <= 4 * 300_000);
//! ```
//!
//! [`abridged`] cuts the long literals out of a request's `Debug` form, for a failure message
//! a reader can hold.

use std::fmt::Write as _;

use proptest::prelude::*;
use proptest::sample::select;
use prost_types::Duration;

/// One mebibyte: the size limit of arguments, results and errors.
pub const MIB: usize = 1_048_576;

/// Characters that make trouble somewhere: controls (C0, DEL, C1), quotes, backslashes, SQL
/// wildcards, Unicode white space, a BOM, non-BMP and the last code point.
pub const PALETTE: &[char] = &[
    'a',
    'Z',
    '0',
    '-',
    ':',
    '/',
    '_',
    '%',
    '\'',
    '"',
    '\\',
    ';',
    ' ',
    '\0',
    '\u{1}',
    '\t',
    '\n',
    '\r',
    '\u{1b}',
    '\u{1f}',
    '\u{7f}',
    '\u{85}',
    '\u{9f}',
    '\u{a0}',
    'é',
    '€',
    '\u{2028}',
    '\u{200b}',
    '\u{feff}',
    '\u{fffd}',
    '\u{e000}',
    '😀',
    '\u{10ffff}',
];

/// Texts a parser or a query has tripped on elsewhere.
const SQLISH: &[&str] = &[
    "'; DROP TABLE ledger_entries; --",
    "NULL",
    "%",
    "_",
    "*",
    "..",
    "\\x00",
    " k",
    "k ",
];

/// Arguments a claim is refused for, or that canonicalize in surprising ways.
const ODD_JSON: &[&str] = &[
    "",
    " ",
    "[]",
    "\"{}\"",
    "null",
    "{",
    "{\"a\":1,}",
    "\u{feff}{}",
    r#"{"a":1,"a":2}"#,
    r#"{"s":"\ud800"}"#,
    r#"{"n":9007199254740993}"#,
    r#"{"n":1e400}"#,
    r#"{"n":1152921504606846976}"#,
    r#"{"n":1152921504606847000}"#,
    r#"{"a\u0000":"\u0000"}"#,
    r#"{"s":"\u0000\u001f\u2028 😀 "}"#,
];

/// A string of `len` characters from the [`PALETTE`].
pub fn palette_string(len: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = String> {
    prop::collection::vec(select(PALETTE), len).prop_map(String::from_iter)
}

/// An odd string for any text field: empty, printable ASCII, odd characters, at and just past
/// the 255/256-byte limits (also with a multi-byte character across the boundary), SQL-ish,
/// 64 hex digits, or huge (up to 300,000 characters).
pub fn text() -> BoxedStrategy<String> {
    prop_oneof![
        1 => Just(String::new()),
        3 => prop::collection::vec(proptest::char::range('!', '~'), 1..=20)
            .prop_map(String::from_iter),
        3 => palette_string(1..=40),
        1 => select(&[255usize, 256, 257][..]).prop_map(|n| "a".repeat(n)),
        1 => select(&[254usize, 255][..]).prop_map(|n| format!("{}é", "a".repeat(n))),
        1 => select(SQLISH).prop_map(str::to_owned),
        1 => (palette_string(1..=40), select(&[1_000usize, 70_000, 300_000][..]))
            .prop_map(|(seed, n)| seed.chars().cycle().take(n).collect()),
        1 => any::<[u64; 4]>().prop_map(|[a, b, c, d]| format!("{a:016x}{b:016x}{c:016x}{d:016x}")),
    ]
    .boxed()
}

/// A string for a field whose limit is a mebibyte: usually [`text`], now and then one byte
/// under, at or over the limit.
pub fn long_text() -> BoxedStrategy<String> {
    prop_oneof![
        7 => text(),
        1 => (0..2usize).prop_map(|over| "e".repeat(MIB + over)),
    ]
    .boxed()
}

/// A small JSON object, nested up to `depth` levels, with nulls, integers (some past 2^53, so
/// refused as inexact), floats in exponent form, and short strings with odd characters.
pub fn json_object(depth: u32) -> BoxedStrategy<String> {
    let leaf = prop_oneof![
        Just("null".to_owned()),
        (any::<i64>(), 11..64u32).prop_map(|(n, shift)| (n >> shift).to_string()),
        (any::<u64>(), any::<u64>())
            .prop_map(|(a, b)| format!("{:e}", a as f64 / (b as f64 + 1.0))),
        prop::collection::vec(select(&['a', 'é', '😀', ' '][..]), 3)
            .prop_map(|c| format!("{:?}", String::from_iter(c))),
    ];
    let value = if depth == 0 {
        leaf.boxed()
    } else {
        prop_oneof![
            4 => leaf,
            1 => json_object(depth - 1).prop_map(|o| format!("[{o}]")),
            1 => json_object(depth - 1),
        ]
        .boxed()
    };
    prop::collection::vec((0..5u8, value), 0..4)
        .prop_map(|members| {
            let mut out = String::from("{");
            for (i, (name, value)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let _ = write!(out, "\"k{name}\":{value}");
            }
            out.push('}');
            out
        })
        .boxed()
}

/// Sensible arguments: one of `usual` (which must not be empty), or a small random object.
pub fn sane_json(usual: &'static [&'static str]) -> BoxedStrategy<String> {
    prop_oneof![
        2 => select(usual).prop_map(str::to_owned),
        1 => json_object(3),
    ]
    .boxed()
}

/// Odd arguments: refusals of every kind, nesting at and over the depth limit, texts at and
/// one byte over the 1 MiB limit, garbage.
pub fn odd_json() -> BoxedStrategy<String> {
    prop_oneof![
        2 => select(ODD_JSON).prop_map(str::to_owned),
        1 => select(&[63usize, 64, 65, 1000][..])
            .prop_map(|depth| format!("{{\"a\":{}{}}}", "[".repeat(depth), "]".repeat(depth))),
        1 => (0..2usize).prop_map(|over| format!("{{\"a\":\"{}\"}}", "x".repeat(MIB + over - 8))),
        1 => palette_string(1..=60),
    ]
    .boxed()
}

/// An enum number: unspecified, out of range, negative, extreme, or any.
pub fn odd_enum() -> BoxedStrategy<i32> {
    prop_oneof![
        3 => select(&[0, 3, 4, 5, -1, i32::MAX, i32::MIN][..]),
        1 => any::<i32>(),
    ]
    .boxed()
}

/// Half the time none, else a valid duration of 1 to `max_secs` seconds and some nanoseconds.
pub fn sane_duration(max_secs: i64) -> BoxedStrategy<Option<Duration>> {
    prop::option::of(
        (1..=max_secs, 0..1_000_000_000i32)
            .prop_map(|(seconds, nanos)| Duration { seconds, nanos }),
    )
    .boxed()
}

/// A duration of one of the kinds a server has tripped on, each as likely: zero,
/// sub-microsecond (positive, but zero in whole microseconds), negative, just over a maximum
/// (an hour, 30 days), huge, malformed (nanoseconds out of range or of the other sign), or any.
pub fn odd_duration() -> BoxedStrategy<Option<Duration>> {
    let at = |seconds: i64, nanos: i32| Duration { seconds, nanos };
    prop_oneof![
        Just(at(0, 0)),
        (1..1_000i32).prop_map(move |nanos| at(0, nanos)),
        select(&[(-1, 0), (0, -1), (i64::MIN, 0), (-1, -999_999_999)][..])
            .prop_map(move |(s, n)| at(s, n)),
        select(
            &[
                (3_601, 0),
                (3_600, 1_000),
                (30 * 86_400 + 1, 0),
                (30 * 86_400, 1_000)
            ][..]
        )
        .prop_map(move |(s, n)| at(s, n)),
        select(&[i64::MAX, i64::MAX / 1_000_000, 1 << 53][..]).prop_map(move |s| at(s, 0)),
        select(
            &[
                (0, 1_000_000_000),
                (1, -1),
                (-1, 1),
                (0, i32::MAX),
                (0, i32::MIN)
            ][..]
        )
        .prop_map(move |(s, n)| at(s, n)),
        (any::<i64>(), any::<i32>()).prop_map(move |(s, n)| at(s, n)),
    ]
    .prop_map(Some)
    .boxed()
}

/// Result bytes: none, random, a page of zeros, or one byte under or over a mebibyte.
pub fn odd_bytes() -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        1 => Just(Vec::new()),
        3 => prop::collection::vec(any::<u8>(), 0..300),
        1 => Just(vec![0u8; 4096]),
        1 => (0..2usize).prop_map(|over| vec![0xffu8; MIB + over]),
    ]
    .boxed()
}

/// `debug` (a value's `Debug` form) with each string or byte-string literal longer than 80
/// characters cut to its first 40 and its length: a failure message with a 1 MiB field stays
/// readable.
pub fn abridged(debug: &str) -> String {
    let mut out = String::with_capacity(debug.len().min(4096));
    let mut chars = debug.chars().peekable();
    while let Some(c) = chars.next() {
        out.push(c);
        if c != '"' {
            continue;
        }
        let mut literal = String::new();
        let mut escaped = false;
        for c in chars.by_ref() {
            if !escaped && c == '"' {
                break;
            }
            escaped = !escaped && c == '\\';
            literal.push(c);
        }
        let length = literal.chars().count();
        if length > 80 {
            out.extend(literal.chars().take(40));
            let _ = write!(out, "…<{length} chars>");
        } else {
            out.push_str(&literal);
        }
        out.push('"');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abridged_cuts_long_literals_and_keeps_short_ones() {
        let long = "x".repeat(100);
        let debug = format!("Claim {{ key: \"k\\\"\", tool: \"{long}\", n: 3 }}");
        assert_eq!(
            abridged(&debug),
            format!(
                "Claim {{ key: \"k\\\"\", tool: \"{}…<100 chars>\", n: 3 }}",
                "x".repeat(40)
            )
        );
    }
}
