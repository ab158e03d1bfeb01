//! Property tests of key canonicalization and derivation (docs/behaviour.md, section Keys): arbitrary JSON
//! objects (nested objects and arrays; strings of arbitrary Unicode, non-BMP and control
//! characters included; integers within ±2^53; doubles) are written out in many equivalent ways,
//! and the key must not notice: member order at every depth, number spelling (`200`, `200.0`,
//! `2e2`, `2.00E+2`, Rust's `{:e}`), insignificant whitespace and string escapes. The canonical
//! text must re-parse to itself, the lenient form must be the JCS of the cleaned-up input, and a
//! different run id or tool must change the key.
//!
//! The expected canonical text comes from the independent reference model in
//! `fuzz/check.rs` (shared with the fuzz target), and every rendered input also goes through the
//! fuzz target's full set of checks.
//!
//! Cases per property: 64 by default, so the file runs in seconds; set `PROPTEST_CASES` for more.

#[path = "../fuzz/check.rs"]
mod check;

use check::model::{self, M};
use idempotency_ledger::domain::canonical::{
    CanonicalError, Canonicalization, JsonLimits, canonicalize,
};
use idempotency_ledger::domain::fields::{RunId, ToolName};
use idempotency_ledger::domain::key::{derive_key, fingerprint};
use proptest::prelude::*;

const RUN: &str = "run-1";
const TOOL: &str = "issue_credit";
const TWO_POW_53: f64 = check::TWO_POW_53;

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    ProptestConfig {
        cases,
        // A failure prints its shrunk input; nothing is written next to the sources.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Generators

/// Characters with the troublesome ones over-represented: controls, the JSON specials, Unicode
/// white space (for the lenient trim), characters on both sides of the UTF-16 sorting quirk
/// (U+E000..U+FFFF against non-BMP), and non-BMP ones.
fn any_char() -> impl Strategy<Value = char> {
    prop_oneof![
        4 => proptest::char::range(' ', '~'),
        2 => any::<char>(),
        1 => proptest::char::range('\0', '\u{1f}'),
        1 => prop::sample::select(vec![
            '"', '\\', '/', '\u{7f}', '\u{85}', '\u{a0}', '\u{2028}', '\u{2029}', '\u{3000}',
            '\u{feff}', '\u{200b}', '\u{d7ff}', '\u{e000}', '\u{fffd}', '\u{ffff}', 'é', '€',
        ]),
        1 => proptest::char::range('\u{10000}', '\u{10ffff}'),
    ]
}

fn any_string() -> impl Strategy<Value = String> {
    prop::collection::vec(any_char(), 0..8).prop_map(String::from_iter)
}

/// Strings, sometimes padded with Unicode white space (which the lenient form trims).
fn string_value() -> impl Strategy<Value = String> {
    let pad = prop::collection::vec(
        prop::sample::select(vec![
            ' ', '\t', '\n', '\r', '\u{85}', '\u{a0}', '\u{2028}', '\u{3000}',
        ]),
        0..3,
    )
    .prop_map(String::from_iter);
    prop_oneof![
        3 => any_string(),
        1 => (pad.clone(), any_string(), pad).prop_map(|(a, s, b)| format!("{a}{s}{b}")),
    ]
}

/// Any finite double, fractional or integral, of magnitude below 2^53.
fn safe_number() -> impl Strategy<Value = f64> {
    let finite = prop::num::f64::NORMAL | prop::num::f64::SUBNORMAL | prop::num::f64::ZERO;
    prop_oneof![
        2 => (-(1i64 << 53)..=(1i64 << 53)).prop_map(|i| i as f64),
        2 => (-1000i64..=1000).prop_map(|i| i as f64),
        2 => finite.prop_map(|x| x % TWO_POW_53),
        2 => (-1_000_000i64..1_000_000, 0i32..8).prop_map(|(m, s)| m as f64 / 10f64.powi(s)),
        1 => prop::sample::select(vec![
            0.0, -0.0, 5e-324, f64::MIN_POSITIVE, 0.1, 1e-7, 1e-6, 123456789.125,
            TWO_POW_53 - 1.0, 1.0 - TWO_POW_53, 4503599627370495.5,
        ]),
    ]
}

/// Any finite double, including integers of 2^53 and beyond, which only their exact decimal
/// expansion spells acceptably.
fn any_number() -> impl Strategy<Value = f64> {
    prop_oneof![
        3 => safe_number(),
        1 => prop::num::f64::NORMAL,
        1 => prop::sample::select(vec![
            TWO_POW_53, -TWO_POW_53, TWO_POW_53 + 2.0, 1152921504606846976.0, 1e20, 1e21,
            1e22, 1e23, 2f64.powi(70), f64::MAX, -f64::MAX,
        ]),
    ]
}

/// A JSON value whose numbers come from `number`, nested up to four levels.
fn json(number: BoxedStrategy<f64>) -> impl Strategy<Value = M> {
    let leaf = prop_oneof![
        1 => Just(M::Null),
        1 => any::<bool>().prop_map(M::Bool),
        3 => number.prop_map(M::Num),
        3 => string_value().prop_map(M::Str),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(M::Arr),
            members(inner),
        ]
    })
}

/// An object with unique member names, in an arbitrary (not sorted) order.
fn members(value: impl Strategy<Value = M>) -> impl Strategy<Value = M> {
    (
        prop::collection::btree_map(any_string(), value, 0..6),
        any::<u64>(),
    )
        .prop_map(|(map, seed)| {
            let mut members: Vec<(String, M)> = map.into_iter().collect();
            members.shuffle(&mut Rng::seed_from_u64(seed));
            M::Obj(members)
        })
}

/// Top-level arguments: an object.
fn arguments(number: BoxedStrategy<f64>) -> impl Strategy<Value = M> {
    members(json(number))
}

fn safe_arguments() -> impl Strategy<Value = M> {
    arguments(safe_number().boxed())
}

fn any_arguments() -> impl Strategy<Value = M> {
    arguments(any_number().boxed())
}

/// A valid run id or tool: 1 to 256 bytes without control characters.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::collection::vec(any_char(), 1..12),
        1 => prop::collection::vec(any_char(), 1..120),
    ]
    .prop_map(|chars| {
        let mut s = String::new();
        for c in chars {
            let c = if c.is_control() { 'x' } else { c };
            if s.len() + c.len_utf8() > 256 {
                break;
            }
            s.push(c);
        }
        s
    })
}

// ---------------------------------------------------------------------------------------------
// Rendering one value as many equivalent texts

/// Rng: rendering choices are drawn from a seed the strategy generates.
use rand::rngs::Xoshiro256PlusPlus as Rng;
use rand::{SeedableRng as _, seq::SliceRandom as _};

/// Which equivalences a rendering exercises; everything off is the plain form.
#[derive(Clone, Copy, Default)]
struct Style {
    shuffle: bool,
    respell: bool,
    whitespace: bool,
    escape: bool,
}

const EVERYTHING: Style = Style {
    shuffle: true,
    respell: true,
    whitespace: true,
    escape: true,
};

fn render(value: &M, style: Style, seed: u64) -> String {
    let mut r = Renderer {
        style,
        rng: Rng::seed_from_u64(seed),
        out: String::new(),
    };
    r.ws();
    r.value(value);
    r.ws();
    r.out
}

struct Renderer {
    style: Style,
    rng: Rng,
    out: String,
}

impl Renderer {
    fn ws(&mut self) {
        if self.style.whitespace {
            const WS: [&str; 6] = ["", " ", "\n", "\t", "\r\n", "  \t\r \n"];
            let w = WS[self.rng.random_range(0..WS.len())];
            self.out.push_str(w);
        }
    }

    fn value(&mut self, value: &M) {
        match value {
            M::Null => self.out.push_str("null"),
            M::Bool(b) => self.out.push_str(if *b { "true" } else { "false" }),
            M::Num(x) => {
                let text = if self.style.respell {
                    respell(*x, &mut self.rng)
                } else {
                    plain_number(*x)
                };
                self.out.push_str(&text);
            }
            M::Str(s) => self.string(s),
            M::Arr(items) => {
                self.out.push('[');
                self.ws();
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        self.ws();
                        self.out.push(',');
                        self.ws();
                    }
                    self.value(item);
                }
                self.ws();
                self.out.push(']');
            }
            M::Obj(members) => {
                let mut order: Vec<usize> = (0..members.len()).collect();
                if self.style.shuffle {
                    order.shuffle(&mut self.rng);
                }
                self.out.push('{');
                self.ws();
                for (i, &m) in order.iter().enumerate() {
                    if i > 0 {
                        self.ws();
                        self.out.push(',');
                        self.ws();
                    }
                    let (name, v) = &members[m];
                    self.string(name);
                    self.ws();
                    self.out.push(':');
                    self.ws();
                    self.value(v);
                }
                self.ws();
                self.out.push('}');
            }
        }
    }

    fn u_escape(&mut self, unit: u16) {
        let text = if self.rng.random_ratio(1, 2) {
            format!("\\u{unit:04x}")
        } else {
            format!("\\u{unit:04X}")
        };
        self.out.push_str(&text);
    }

    /// A string, minimally escaped, or with random (valid) escapes in the escape style.
    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            let spell_out = self.style.escape && self.rng.random_ratio(1, 3);
            let short = match c {
                '"' => Some("\\\""),
                '\\' => Some("\\\\"),
                '\u{8}' => Some("\\b"),
                '\u{c}' => Some("\\f"),
                '\n' => Some("\\n"),
                '\r' => Some("\\r"),
                '\t' => Some("\\t"),
                '/' if spell_out => Some("\\/"),
                _ => None,
            };
            match short {
                Some(esc) if !(spell_out && self.rng.random_ratio(1, 2)) => self.out.push_str(esc),
                _ if spell_out || c < ' ' || c == '"' || c == '\\' => {
                    let mut units = [0u16; 2];
                    for &unit in c.encode_utf16(&mut units).iter() {
                        self.u_escape(unit);
                    }
                }
                _ => self.out.push(c),
            }
        }
        self.out.push('"');
    }
}

/// The canonical spelling of a double below 2^53, the exact one above (the shortest form of a
/// large integer is refused as an inexact integer).
fn plain_number(x: f64) -> String {
    if x.abs() >= TWO_POW_53 {
        format!("{x:.0}")
    } else {
        ryu_js::Buffer::new().format_finite(x).to_owned()
    }
}

/// `|x|` as digits D without leading or trailing zeros and an exponent E, D * 10^E = |x| when
/// |x| >= 2^53, and the shortest round-trip decimal otherwise. Zero is ("0", 0).
fn decimal(x: f64) -> (String, i32) {
    let a = x.abs();
    if a == 0.0 {
        return ("0".to_owned(), 0);
    }
    if a >= TWO_POW_53 {
        let full = format!("{a:.0}");
        let digits = full.trim_end_matches('0');
        let zeros = (full.len() - digits.len()) as i32;
        return (digits.to_owned(), zeros);
    }
    let sci = format!("{a:e}"); // shortest round trip, such as 1.5e2 or 5e-324
    let (mantissa, exp) = sci.split_once('e').expect("LowerExp has an e");
    let exp: i32 = exp.parse().expect("exponent");
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    (format!("{int}{frac}"), exp - frac.len() as i32)
}

/// A random JSON spelling of exactly the value `decimal(x)` stands for: extra trailing zeros,
/// any decimal point position (leading `0.000` included), exponent or none, `e` or `E`, an
/// optional `+`, leading zeros in the exponent; or one of Rust's own formats.
fn respell(x: f64, rng: &mut Rng) -> String {
    let sign = if x.is_sign_negative() { "-" } else { "" };
    if x == 0.0 {
        const ZEROS: [&str; 6] = ["0", "0.0", "0.000", "0e0", "0E+5", "0.0e-3"];
        let z = ZEROS[rng.random_range(0..ZEROS.len())];
        return format!("{}{z}", if rng.random_ratio(1, 2) { "-" } else { "" });
    }
    if x.abs() < TWO_POW_53 {
        // Rust's shortest round-trip formats are exact enough below 2^53.
        match rng.random_range(0..8) {
            0 => return format!("{x:e}"),
            1 => return format!("{x:E}"),
            2 => return format!("{x}"),
            3 if x.fract() == 0.0 => return format!("{x:.1}"), // integer x as x.0
            _ => {}
        }
    }
    let (digits, exp) = decimal(x);
    let zeros = rng.random_range(0..4);
    let digits = format!("{digits}{}", "0".repeat(zeros));
    let exp = exp - zeros as i32;
    let frac_digits = rng.random_range(0..digits.len() + 4);
    let mantissa = match frac_digits {
        0 => digits.clone(),
        f if f < digits.len() => {
            format!(
                "{}.{}",
                &digits[..digits.len() - f],
                &digits[digits.len() - f..]
            )
        }
        f => format!("0.{}{digits}", "0".repeat(f - digits.len())),
    };
    let exponent = exp + frac_digits as i32;
    let exponent_text = if exponent == 0 && rng.random_ratio(1, 2) {
        String::new()
    } else {
        let e = if rng.random_ratio(1, 2) { "e" } else { "E" };
        let plus = if exponent >= 0 && rng.random_ratio(1, 2) {
            "+"
        } else {
            ""
        };
        let minus = if exponent < 0 { "-" } else { "" };
        let lead = "0".repeat(rng.random_range(0..3));
        format!("{e}{plus}{minus}{lead}{}", exponent.unsigned_abs())
    };
    format!("{sign}{mantissa}{exponent_text}")
}

// ---------------------------------------------------------------------------------------------
// Helpers

fn canonical(text: &str, mode: Canonicalization) -> Result<String, TestCaseError> {
    canonicalize(text, mode, &JsonLimits::default())
        .map_err(|e| TestCaseError::fail(format!("{} refused with {e:?}", check::show(text))))
}

fn key_of(text: &str, mode: Canonicalization) -> Result<String, TestCaseError> {
    let canonical = canonical(text, mode)?;
    let run = RunId::parse(RUN).expect("run id");
    let tool = ToolName::parse(TOOL).expect("tool");
    Ok(derive_key(&run, &tool, &canonical, mode))
}

/// The two texts get the same key and canonical text, which is the model's.
fn assert_same_key(value: &M, a: &str, b: &str) -> Result<(), TestCaseError> {
    for mode in [Canonicalization::Jcs, Canonicalization::JcsLenient] {
        let (ca, cb) = (canonical(a, mode)?, canonical(b, mode)?);
        prop_assert_eq!(
            &ca,
            &cb,
            "canonical texts of {} and {}",
            check::show(a),
            check::show(b)
        );
        prop_assert_eq!(&ca, &model::canonical(value, mode));
        prop_assert_eq!(key_of(a, mode)?, key_of(b, mode)?);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Properties

proptest! {
    #![proptest_config(config())]

    #[test]
    fn reordering_members_at_every_depth_never_changes_the_key(
        value in any_arguments(),
        seed in any::<u64>(),
    ) {
        let plain = render(&value, Style::default(), seed);
        let shuffled = render(&value, Style { shuffle: true, ..Style::default() }, seed);
        assert_same_key(&value, &plain, &shuffled)?;
    }

    #[test]
    fn respelling_numbers_never_changes_the_key(value in any_arguments(), seed in any::<u64>()) {
        let plain = render(&value, Style::default(), seed);
        let respelled = render(&value, Style { respell: true, ..Style::default() }, seed);
        assert_same_key(&value, &plain, &respelled)?;
    }

    #[test]
    fn each_spelling_of_a_number_gets_the_key_of_its_plain_form(
        x in any_number(),
        seed in any::<u64>(),
    ) {
        let plain = format!(r#"{{"n":{}}}"#, plain_number(x));
        let want = key_of(&plain, Canonicalization::Jcs)?;
        let mut rng = Rng::seed_from_u64(seed);
        let mut spellings = vec![respell(x, &mut rng), respell(x, &mut rng), respell(x, &mut rng)];
        if x.abs() < TWO_POW_53 {
            spellings.push(format!("{x:e}"));
            spellings.push(format!("{x:E}"));
            if x.fract() == 0.0 {
                spellings.push(format!("{x:.1}"));
                spellings.push(format!("{x:.0}"));
            }
        }
        for spelling in spellings {
            let text = format!(r#"{{"n":{spelling}}}"#);
            prop_assert_eq!(key_of(&text, Canonicalization::Jcs)?, want.clone(), "{}", text);
        }
    }

    #[test]
    fn inserting_insignificant_whitespace_never_changes_the_key(
        value in any_arguments(),
        seed in any::<u64>(),
    ) {
        let plain = render(&value, Style::default(), seed);
        let spaced = render(&value, Style { whitespace: true, ..Style::default() }, seed);
        assert_same_key(&value, &plain, &spaced)?;
    }

    #[test]
    fn every_equivalent_text_gets_the_same_key_and_passes_the_fuzz_checks(
        value in any_arguments(),
        seeds in (any::<u64>(), any::<u64>()),
    ) {
        let a = render(&value, EVERYTHING, seeds.0);
        let b = render(&value, EVERYTHING, seeds.1);
        assert_same_key(&value, &a, &b)?;
        for text in [&a, &b] {
            if let Err(violation) = check::check_text(text) {
                return Err(TestCaseError::fail(violation));
            }
        }
    }

    #[test]
    fn canonical_text_reparses_to_itself_within_the_exact_range(
        value in safe_arguments(),
        seed in any::<u64>(),
    ) {
        let text = render(&value, EVERYTHING, seed);
        for mode in [Canonicalization::Jcs, Canonicalization::JcsLenient] {
            let once = canonical(&text, mode)?;
            prop_assert_eq!(&once, &model::canonical(&value, mode));
            prop_assert_eq!(canonical(&once, mode)?, once.clone());
            // Canonical text is also canonical under plain JCS.
            if mode == Canonicalization::JcsLenient {
                prop_assert_eq!(canonical(&once, Canonicalization::Jcs)?, once.clone());
            }
        }
    }

    #[test]
    fn canonical_text_with_large_integers_reparses_to_itself_or_meets_the_documented_exception(
        value in any_arguments(),
        seed in any::<u64>(),
    ) {
        let text = render(&value, EVERYTHING, seed);
        let once = canonical(&text, Canonicalization::Jcs)?;
        match canonicalize(&once, Canonicalization::Jcs, &JsonLimits::default()) {
            Ok(twice) => prop_assert_eq!(twice, once),
            Err(err @ CanonicalError::UnsafeInteger { .. }) => {
                if let Err(violation) = check::check_unsafe_integer_exception(&once, &err) {
                    return Err(TestCaseError::fail(violation));
                }
            }
            Err(err) => prop_assert!(false, "{} refused on re-parse: {:?}", once, err),
        }
    }

    #[test]
    fn the_lenient_form_is_the_jcs_of_the_input_with_strings_trimmed_and_nulls_dropped(
        value in any_arguments(),
        seeds in (any::<u64>(), any::<u64>()),
    ) {
        let text = render(&value, EVERYTHING, seeds.0);
        let cleaned = render(&model::lenient(&value), EVERYTHING, seeds.1);
        prop_assert_eq!(
            canonical(&text, Canonicalization::JcsLenient)?,
            canonical(&cleaned, Canonicalization::Jcs)?
        );
        // The same canonical text still hashes under its own domain.
        let c = canonical(&cleaned, Canonicalization::Jcs)?;
        let run = RunId::parse(RUN).expect("run id");
        let tool = ToolName::parse(TOOL).expect("tool");
        prop_assert_ne!(
            derive_key(&run, &tool, &c, Canonicalization::Jcs),
            derive_key(&run, &tool, &c, Canonicalization::JcsLenient)
        );
    }

    #[test]
    fn a_different_run_id_or_tool_always_changes_the_key(
        value in any_arguments(),
        runs in (name(), name()),
        tools in (name(), name()),
        lenient in any::<bool>(),
    ) {
        let mode = if lenient { Canonicalization::JcsLenient } else { Canonicalization::Jcs };
        let c = canonical(&render(&value, Style::default(), 0), mode)?;
        let (r1, r2) = (RunId::parse(&runs.0).expect("run"), RunId::parse(&runs.1).expect("run"));
        let (t1, t2) = (ToolName::parse(&tools.0).expect("tool"), ToolName::parse(&tools.1).expect("tool"));
        let key = derive_key(&r1, &t1, &c, mode);
        prop_assert!(check::is_hex64(&key));
        prop_assert_eq!(&key, &check::reference_key(&runs.0, &tools.0, &c, mode));
        if runs.0 != runs.1 {
            prop_assert_ne!(&key, &derive_key(&r2, &t1, &c, mode));
        }
        if tools.0 != tools.1 {
            prop_assert_ne!(&key, &derive_key(&r1, &t2, &c, mode));
            prop_assert_ne!(fingerprint(&t1, &c, mode), fingerprint(&t2, &c, mode));
        }
        // The fingerprint ignores the run.
        prop_assert_eq!(fingerprint(&t1, &c, mode), check::reference_fingerprint(&tools.0, &c, mode));
    }

    #[test]
    fn a_different_argument_value_changes_the_key(
        a in safe_arguments(),
        b in safe_arguments(),
    ) {
        let ca = model::canonical(&a, Canonicalization::Jcs);
        let cb = model::canonical(&b, Canonicalization::Jcs);
        let ka = key_of(&render(&a, Style::default(), 0), Canonicalization::Jcs)?;
        let kb = key_of(&render(&b, Style::default(), 0), Canonicalization::Jcs)?;
        prop_assert_eq!(ca == cb, ka == kb);
    }
}
