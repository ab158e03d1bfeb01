//! The properties of key canonicalization and derivation, checked on one input. Shared by the
//! cargo-fuzz target (`fuzz/fuzz_targets/canonicalize.rs`, which panics on a violation) and by
//! the stable test `tests/fuzz_corpus.rs` (which runs it over every seed file), both of which
//! include this file with `#[path]`. It uses only crates both of them can name:
//! `idempotency_ledger`, `ryu_js`, `sha2` and `hex`.
//!
//! Beyond "no panic", the input is compared with [`model`], a small recursive reference parser
//! and JCS writer written independently of `src/domain/canonical.rs` (it shares only Rust's
//! correctly rounded `str::parse::<f64>` and `ryu_js` for ECMAScript number printing, which are
//! the definition rather than the implementation): both must accept the same texts, refuse the
//! others for the same reason at the same place, and produce the same canonical text.
//!
//! # The one refusal of canonical output that is allowed
//!
//! Canonical text must canonicalize to itself, with one documented exception. JCS prints a
//! number in ECMAScript's shortest round-trip form, so the double 2^60 prints as
//! `1152921504606847000`; but the ledger's rule is that an integer literal (no fraction, no
//! exponent) must be *exactly* representable, and that literal's exact value is not 2^60, so
//! re-parsing canonical text that holds it is refused with `UNSAFE_INTEGER`. Every double of
//! magnitude 2^53 or more is an integer, so any of them whose shortest form is not its exact
//! value does this. The property therefore is:
//!
//! - when the re-parse is accepted, its canonical text is byte for byte the same (idempotence);
//! - when it is refused, the refusal must be `UNSAFE_INTEGER` ("cannot hold exactly", never
//!   "beyond the range"), at a literal of the canonical text whose value is an integer of
//!   magnitude at least 2^53; and the reference model, told not to apply that rule, must still
//!   read the canonical text back to itself, so idempotence holds for everything else in it.

#![allow(dead_code)]

use idempotency_ledger::domain::canonical::{
    CanonicalError, Canonicalization, JsonLimits, canonicalize, parse,
};
use idempotency_ledger::domain::fields::{ExplicitKey, Principal, RunId, ToolName};
use idempotency_ledger::domain::key::{derive_key, fingerprint};
use sha2::{Digest, Sha256};

/// Tight limits, so that the fuzzer reaches the size and depth refusals with small inputs.
pub const SMALL_LIMITS: JsonLimits = JsonLimits {
    max_bytes: 256,
    max_depth: 4,
};

/// 2^53: from here on every double is an integer, and not every integer is a double.
pub const TWO_POW_53: f64 = 9_007_199_254_740_992.0;

const MODES: [Canonicalization; 2] = [Canonicalization::Jcs, Canonicalization::JcsLenient];

const RUN: &str = "run-1";
const TOOL: &str = "issue_credit";

/// Checks every property on `data`; text that is not UTF-8 cannot reach the canonicalizer (a
/// proto3 `string` is UTF-8), so it passes trivially.
///
/// # Errors
/// A description of the first violated property, with the input.
pub fn check_bytes(data: &[u8]) -> Result<(), String> {
    match std::str::from_utf8(data) {
        Ok(text) => check_text(text),
        Err(_) => Ok(()),
    }
}

/// Checks every property on `text`.
///
/// # Errors
/// A description of the first violated property, with the input.
pub fn check_text(text: &str) -> Result<(), String> {
    check_text_inner(text).map_err(|problem| format!("{problem}\n  input: {}", show(text)))
}

fn check_text_inner(text: &str) -> Result<(), String> {
    check_fields(text)?;
    let default = JsonLimits::default();
    let mut full_results = Vec::new();
    for mode in MODES {
        let full = canonicalize(text, mode, &default);
        let small = canonicalize(text, mode, &SMALL_LIMITS);
        check_refusal_shape(text, &full, &default)?;
        check_refusal_shape(text, &small, &SMALL_LIMITS)?;
        check_limits_agree(&full, &small)?;
        check_against_model(text, mode, &full, default.max_depth)?;
        if let Ok(canonical) = &full {
            check_canonical(canonical, mode)?;
            check_derivation(text, canonical, mode)?;
        }
        full_results.push(full);
    }
    check_modes_agree(&full_results[0], &full_results[1])?;
    check_parse_matches_model(text, &default)
}

/// A shortened `Debug` form of an input, for messages.
pub fn show(text: &str) -> String {
    const MAX: usize = 400;
    if text.len() <= MAX {
        return format!("{text:?}");
    }
    let mut cut = MAX;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{:?}… ({} bytes)", &text[..cut], text.len())
}

/// 64 lowercase hex digits.
pub fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// `hex(sha256(parts joined by 0x00))`, written from docs/behaviour.md, not from `src/`.
pub fn reference_hash(parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            hasher.update([0u8]);
        }
        hasher.update(part.as_bytes());
    }
    hex::encode(hasher.finalize())
}

/// The documented key of (run, tool, canonical) under `mode`.
pub fn reference_key(run: &str, tool: &str, canonical: &str, mode: Canonicalization) -> String {
    let domain = match mode {
        Canonicalization::Jcs => "idem.v1",
        Canonicalization::JcsLenient => "idem.v1.lenient",
    };
    reference_hash(&[domain, run, tool, canonical])
}

/// The documented fingerprint of (tool, canonical) under `mode`.
pub fn reference_fingerprint(tool: &str, canonical: &str, mode: Canonicalization) -> String {
    let domain = match mode {
        Canonicalization::Jcs => "idem.v1.fp",
        Canonicalization::JcsLenient => "idem.v1.lenient.fp",
    };
    reference_hash(&[domain, tool, canonical])
}

/// The field validators take any string without panicking and accept exactly what docs/behaviour.md
/// says: run id and tool 1 to 256 bytes without control characters, principal 0 to 256, explicit
/// key 1 to 255 bytes of printable ASCII without space.
fn check_fields(text: &str) -> Result<(), String> {
    let no_controls = !text.chars().any(char::is_control);
    let name_ok = (1..=256).contains(&text.len()) && no_controls;
    let principal_ok = text.len() <= 256 && no_controls;
    let key_ok =
        (1..=255).contains(&text.len()) && text.bytes().all(|b| (0x21..=0x7e).contains(&b));
    for (field, got, want) in [
        ("run_id", RunId::parse(text).is_ok(), name_ok),
        ("tool", ToolName::parse(text).is_ok(), name_ok),
        ("principal", Principal::parse(text).is_ok(), principal_ok),
        ("key", ExplicitKey::parse(text).is_ok(), key_ok),
    ] {
        if got != want {
            return Err(format!(
                "{field} validation: accepted = {got}, but docs/behaviour.md says {want}"
            ));
        }
    }
    Ok(())
}

/// Offsets in refusals lie within the text, on a char boundary; the message formats without
/// panicking; a size refusal happens exactly when the text is over the limit.
fn check_refusal_shape(
    text: &str,
    result: &Result<String, CanonicalError>,
    limits: &JsonLimits,
) -> Result<(), String> {
    let too_large = text.len() > limits.max_bytes;
    let Err(err) = result else {
        if too_large {
            return Err(format!(
                "accepted {} bytes over a limit of {}",
                text.len(),
                limits.max_bytes
            ));
        }
        return Ok(());
    };
    let message = err.to_string();
    if message.is_empty() {
        return Err(format!("{} refusal has an empty message", err.reason()));
    }
    let offset = match err {
        CanonicalError::InvalidJson { offset, .. }
        | CanonicalError::DuplicateMember { offset, .. }
        | CanonicalError::LoneSurrogate { offset, .. }
        | CanonicalError::UnsafeInteger { offset, .. }
        | CanonicalError::JsonTooDeep { offset, .. } => Some(*offset),
        CanonicalError::ArgumentsTooLarge { .. } | CanonicalError::ArgumentsNotObject { .. } => {
            None
        }
    };
    if let Some(offset) = offset
        && (offset > text.len() || !text.is_char_boundary(offset))
    {
        return Err(format!(
            "refusal {err:?} has offset {offset}, not a char boundary of a {}-byte text",
            text.len()
        ));
    }
    if matches!(err, CanonicalError::ArgumentsTooLarge { .. }) != too_large {
        return Err(format!(
            "refusal {err:?} for a {}-byte text under a {}-byte limit",
            text.len(),
            limits.max_bytes
        ));
    }
    Ok(())
}

fn is_limit(err: &CanonicalError) -> bool {
    matches!(
        err,
        CanonicalError::JsonTooDeep { .. } | CanonicalError::ArgumentsTooLarge { .. }
    )
}

/// Tighter limits only ever add size and depth refusals: what they accept, the default limits
/// accept identically; any other refusal is the same under both.
fn check_limits_agree(
    full: &Result<String, CanonicalError>,
    small: &Result<String, CanonicalError>,
) -> Result<(), String> {
    match (full, small) {
        (Ok(a), Ok(b)) if a == b => Ok(()),
        (Ok(a), Ok(b)) => Err(format!(
            "small limits changed the canonical text: {} vs {}",
            show(a),
            show(b)
        )),
        (Ok(_), Err(e)) if is_limit(e) => Ok(()),
        (Ok(_), Err(e)) => Err(format!(
            "small limits refused with {e:?}, default limits accepted"
        )),
        (Err(e), Ok(_)) => Err(format!(
            "small limits accepted, default limits refused with {e:?}"
        )),
        (Err(_), Err(e)) if is_limit(e) => Ok(()),
        (Err(a), Err(b)) if a == b => Ok(()),
        (Err(a), Err(b)) => Err(format!(
            "different refusals: {a:?} with default limits, {b:?} with small ones"
        )),
    }
}

/// The implementation and the reference model agree on acceptance, on the reason and place of
/// a refusal, and on the canonical text.
fn check_against_model(
    text: &str,
    mode: Canonicalization,
    result: &Result<String, CanonicalError>,
    max_depth: usize,
) -> Result<(), String> {
    if matches!(result, Err(CanonicalError::ArgumentsTooLarge { .. })) {
        return Ok(()); // checked in check_refusal_shape
    }
    let model = model::parse(text, max_depth, true);
    match (result, model) {
        (Ok(canonical), Ok(value)) => {
            if !matches!(value, model::M::Obj(_)) {
                return Err(format!("accepted a top-level {}", value.kind()));
            }
            let expected = model::canonical(&value, mode);
            if *canonical != expected {
                return Err(format!(
                    "canonical text differs from the reference model's ({mode:?}):\n  got  {}\n  want {}",
                    show(canonical),
                    show(&expected)
                ));
            }
            Ok(())
        }
        (Ok(canonical), Err(e)) => Err(format!(
            "accepted as {}, but the reference model refuses it: {e:?}",
            show(canonical)
        )),
        (Err(CanonicalError::ArgumentsNotObject { found }), Ok(value)) => {
            if value.kind() == *found && !matches!(value, model::M::Obj(_)) {
                Ok(())
            } else {
                Err(format!(
                    "refused as a top-level {found}, the reference model read a {}",
                    value.kind()
                ))
            }
        }
        (Err(e), Ok(_)) => Err(format!(
            "refused with {e:?}, but the reference model accepts it"
        )),
        (Err(e), Err(m)) => {
            let same = match (e, &m) {
                (CanonicalError::InvalidJson { .. }, model::MErr::Invalid(_)) => true,
                (CanonicalError::DuplicateMember { offset, .. }, model::MErr::Duplicate(o))
                | (CanonicalError::LoneSurrogate { offset, .. }, model::MErr::Lone(o))
                | (CanonicalError::UnsafeInteger { offset, .. }, model::MErr::Unsafe(o))
                | (CanonicalError::JsonTooDeep { offset, .. }, model::MErr::Deep(o)) => offset == o,
                _ => false,
            };
            if same {
                Ok(())
            } else {
                Err(format!(
                    "refused with {e:?}, the reference model refuses with {m:?}"
                ))
            }
        }
    }
}

/// `parse` (the public parser) reads the same tree as the reference model, member order and
/// the bits of every number included.
fn check_parse_matches_model(text: &str, limits: &JsonLimits) -> Result<(), String> {
    let (Ok(value), Ok(m)) = (
        parse(text, limits),
        model::parse(text, limits.max_depth, true),
    ) else {
        return Ok(()); // disagreements on refusals are reported by check_against_model
    };
    if model::same_tree(&value, &m) {
        Ok(())
    } else {
        Err(format!("parse read {value:?}, the reference model {m:?}"))
    }
}

/// Canonical output canonicalizes to itself (in its own mode, and a lenient output under plain
/// JCS too), up to the documented `UNSAFE_INTEGER` exception described at the top of this file.
fn check_canonical(canonical: &str, mode: Canonicalization) -> Result<(), String> {
    if !(canonical.starts_with('{') && canonical.ends_with('}')) {
        return Err(format!(
            "canonical text {} is not an object",
            show(canonical)
        ));
    }
    let limits = reparse_limits(canonical);
    let again_in: &[Canonicalization] = match mode {
        Canonicalization::Jcs => &[Canonicalization::Jcs],
        Canonicalization::JcsLenient => &[Canonicalization::JcsLenient, Canonicalization::Jcs],
    };
    for &again in again_in {
        match canonicalize(canonical, again, &limits) {
            Ok(twice) if twice == canonical => {}
            Ok(twice) => {
                return Err(format!(
                    "not idempotent: {mode:?} output {} canonicalizes under {again:?} to {}",
                    show(canonical),
                    show(&twice)
                ));
            }
            Err(err) => check_unsafe_integer_exception(canonical, &err)?,
        }
    }
    Ok(())
}

/// Limits for re-reading canonical text: the default depth (canonicalization never nests
/// deeper), and room for numbers that print longer than they were written (`1e20`).
fn reparse_limits(canonical: &str) -> JsonLimits {
    let default = JsonLimits::default();
    JsonLimits {
        max_bytes: default.max_bytes.max(canonical.len()),
        max_depth: default.max_depth,
    }
}

/// The only refusal canonical output may meet: see the top of this file.
pub fn check_unsafe_integer_exception(canonical: &str, err: &CanonicalError) -> Result<(), String> {
    let CanonicalError::UnsafeInteger {
        literal,
        offset,
        problem,
    } = err
    else {
        return Err(format!(
            "canonical text {} is refused on re-parse: {err:?}",
            show(canonical)
        ));
    };
    let value: f64 = literal.parse().unwrap_or(f64::NAN);
    let exception = problem.contains("cannot hold exactly")
        && canonical
            .get(*offset..)
            .is_some_and(|rest| rest.starts_with(literal.as_str()))
        && value.is_finite()
        && value.fract() == 0.0
        && value.abs() >= TWO_POW_53;
    if !exception {
        return Err(format!(
            "canonical text {} is refused on re-parse, and not for an integer >= 2^53: {err:?}",
            show(canonical)
        ));
    }
    // Everything else in it must still read back to itself.
    match model::parse(canonical, JsonLimits::default().max_depth, false) {
        Ok(value) if model::canonical(&value, Canonicalization::Jcs) == canonical => Ok(()),
        other => Err(format!(
            "canonical text {} does not read back to itself even without the integer rule: {other:?}",
            show(canonical)
        )),
    }
}

/// Lenient canonicalization refuses exactly what strict does, and equals the lenient form of
/// the strict canonical text.
fn check_modes_agree(
    jcs: &Result<String, CanonicalError>,
    lenient: &Result<String, CanonicalError>,
) -> Result<(), String> {
    match (jcs, lenient) {
        (Ok(strict), Ok(lenient)) => {
            match canonicalize(
                strict,
                Canonicalization::JcsLenient,
                &reparse_limits(strict),
            ) {
                Ok(from_strict) if from_strict == *lenient => Ok(()),
                Ok(from_strict) => Err(format!(
                    "lenient form {} differs from the lenient form of the JCS text, {}",
                    show(lenient),
                    show(&from_strict)
                )),
                // The documented exception; check_canonical has vetted it already.
                Err(CanonicalError::UnsafeInteger { .. }) => Ok(()),
                Err(e) => Err(format!("JCS text refused in lenient mode: {e:?}")),
            }
        }
        (Err(a), Err(b)) if a == b => Ok(()),
        (a, b) => Err(format!(
            "JCS and JCS_LENIENT disagree: {:?} vs {:?}",
            a.as_ref().map(|s| show(s)),
            b.as_ref().map(|s| show(s))
        )),
    }
}

/// Key and fingerprint are 64 lowercase hex digits, as docs/behaviour.md computes them, and differ
/// between the two modes and between runs.
fn check_derivation(text: &str, canonical: &str, mode: Canonicalization) -> Result<(), String> {
    let (Ok(run), Ok(tool)) = (RunId::parse(RUN), ToolName::parse(TOOL)) else {
        return Err("the fixed run id or tool is refused".to_owned());
    };
    let key = derive_key(&run, &tool, canonical, mode);
    let fp = fingerprint(&tool, canonical, mode);
    if !is_hex64(&key) || !is_hex64(&fp) {
        return Err(format!(
            "key {key:?} or fingerprint {fp:?} is not 64 lowercase hex"
        ));
    }
    if key != reference_key(RUN, TOOL, canonical, mode) {
        return Err(format!("key {key} is not the documented one"));
    }
    if fp != reference_fingerprint(TOOL, canonical, mode) {
        return Err(format!("fingerprint {fp} is not the documented one"));
    }
    let other_mode = match mode {
        Canonicalization::Jcs => Canonicalization::JcsLenient,
        Canonicalization::JcsLenient => Canonicalization::Jcs,
    };
    if key == derive_key(&run, &tool, canonical, other_mode)
        || fp == fingerprint(&tool, canonical, other_mode)
    {
        return Err("JCS and JCS_LENIENT share a key or fingerprint".to_owned());
    }
    // The input itself as run id and tool, when it is a valid one.
    if let (Ok(run2), Ok(tool2)) = (RunId::parse(text), ToolName::parse(text)) {
        let key2 = derive_key(&run2, &tool2, canonical, mode);
        if !is_hex64(&key2) || key2 != reference_key(text, text, canonical, mode) {
            return Err(format!("key {key2:?} with the input as run id and tool"));
        }
        if text != RUN && derive_key(&run2, &tool, canonical, mode) == key {
            return Err("a different run id gave the same key".to_owned());
        }
        if text != TOOL && derive_key(&run, &tool2, canonical, mode) == key {
            return Err("a different tool gave the same key".to_owned());
        }
    }
    Ok(())
}

/// An independent reference: a recursive-descent RFC 8259 parser with the ledger's refusals,
/// and a JCS writer. Deliberately simple (quadratic duplicate check, recursion bounded by the
/// depth limit) and written from docs/behaviour.md rather than from `src/`.
pub mod model {
    use idempotency_ledger::domain::canonical::{Canonicalization, Value};

    /// A JSON value; objects keep input order.
    #[derive(Clone, Debug, PartialEq)]
    pub enum M {
        Null,
        Bool(bool),
        Num(f64),
        Str(String),
        Arr(Vec<M>),
        Obj(Vec<(String, M)>),
    }

    impl M {
        pub fn kind(&self) -> &'static str {
            match self {
                M::Null => "null",
                M::Bool(_) => "boolean",
                M::Num(_) => "number",
                M::Str(_) => "string",
                M::Arr(_) => "array",
                M::Obj(_) => "object",
            }
        }
    }

    /// A refusal and its byte offset. Invalid-JSON offsets are not compared: the two parsers
    /// may blame different bytes of the same mistake.
    #[derive(Clone, Debug, PartialEq)]
    pub enum MErr {
        Invalid(usize),
        Duplicate(usize),
        Lone(usize),
        Unsafe(usize),
        Deep(usize),
    }

    /// Parses `text`; `unsafe_integers` applies the "integers must be exact doubles" rule.
    ///
    /// # Errors
    /// The first problem, left to right.
    pub fn parse(text: &str, max_depth: usize, unsafe_integers: bool) -> Result<M, MErr> {
        let mut p = P {
            t: text,
            b: text.as_bytes(),
            i: 0,
            max_depth,
            unsafe_integers,
        };
        let v = p.value(0)?;
        p.ws();
        if p.i == p.b.len() {
            Ok(v)
        } else {
            Err(MErr::Invalid(p.i))
        }
    }

    struct P<'a> {
        t: &'a str,
        b: &'a [u8],
        i: usize,
        max_depth: usize,
        unsafe_integers: bool,
    }

    impl P<'_> {
        fn peek(&self) -> Option<u8> {
            self.b.get(self.i).copied()
        }

        fn eat(&mut self, c: u8) -> bool {
            let hit = self.peek() == Some(c);
            if hit {
                self.i += 1;
            }
            hit
        }

        fn ws(&mut self) {
            while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
                self.i += 1;
            }
        }

        /// One value; `open` containers enclose it.
        fn value(&mut self, open: usize) -> Result<M, MErr> {
            self.ws();
            match self.peek() {
                Some(b'{') => {
                    if open >= self.max_depth {
                        return Err(MErr::Deep(self.i));
                    }
                    self.i += 1;
                    self.ws();
                    let mut members: Vec<(String, M)> = Vec::new();
                    if self.eat(b'}') {
                        return Ok(M::Obj(members));
                    }
                    loop {
                        if self.peek() != Some(b'"') {
                            return Err(MErr::Invalid(self.i));
                        }
                        let at = self.i;
                        let name = self.string()?;
                        if members.iter().any(|(n, _)| *n == name) {
                            return Err(MErr::Duplicate(at));
                        }
                        self.ws();
                        if !self.eat(b':') {
                            return Err(MErr::Invalid(self.i));
                        }
                        let v = self.value(open + 1)?;
                        members.push((name, v));
                        self.ws();
                        if self.eat(b',') {
                            self.ws();
                        } else if self.eat(b'}') {
                            return Ok(M::Obj(members));
                        } else {
                            return Err(MErr::Invalid(self.i));
                        }
                    }
                }
                Some(b'[') => {
                    if open >= self.max_depth {
                        return Err(MErr::Deep(self.i));
                    }
                    self.i += 1;
                    self.ws();
                    let mut items = Vec::new();
                    if self.eat(b']') {
                        return Ok(M::Arr(items));
                    }
                    loop {
                        items.push(self.value(open + 1)?);
                        self.ws();
                        if self.eat(b']') {
                            return Ok(M::Arr(items));
                        }
                        if !self.eat(b',') {
                            return Err(MErr::Invalid(self.i));
                        }
                    }
                }
                Some(b'"') => Ok(M::Str(self.string()?)),
                Some(b't') => self.word("true", M::Bool(true)),
                Some(b'f') => self.word("false", M::Bool(false)),
                Some(b'n') => self.word("null", M::Null),
                Some(b'-' | b'0'..=b'9') => self.number(),
                _ => Err(MErr::Invalid(self.i)),
            }
        }

        fn word(&mut self, w: &str, v: M) -> Result<M, MErr> {
            if self.b[self.i..].starts_with(w.as_bytes()) {
                self.i += w.len();
                Ok(v)
            } else {
                Err(MErr::Invalid(self.i))
            }
        }

        fn string(&mut self) -> Result<String, MErr> {
            let start = self.i;
            self.i += 1;
            let mut out = String::new();
            loop {
                match self.peek() {
                    None => return Err(MErr::Invalid(start)),
                    Some(b'"') => {
                        self.i += 1;
                        return Ok(out);
                    }
                    Some(b'\\') => {
                        let c = self.escape()?;
                        out.push(c);
                    }
                    Some(c) if c < 0x20 => return Err(MErr::Invalid(self.i)),
                    Some(_) => {
                        let c = self.t[self.i..].chars().next().unwrap_or('\u{fffd}');
                        out.push(c);
                        self.i += c.len_utf8();
                    }
                }
            }
        }

        fn escape(&mut self) -> Result<char, MErr> {
            let at = self.i;
            let simple = match self.b.get(self.i + 1) {
                Some(b'"') => '"',
                Some(b'\\') => '\\',
                Some(b'/') => '/',
                Some(b'b') => '\u{8}',
                Some(b'f') => '\u{c}',
                Some(b'n') => '\n',
                Some(b'r') => '\r',
                Some(b't') => '\t',
                Some(b'u') => {
                    let unit = self.hex4()?;
                    return match unit {
                        0xD800..=0xDBFF => {
                            if !self.b[self.i..].starts_with(b"\\u") {
                                return Err(MErr::Lone(at));
                            }
                            let low = self.hex4()?;
                            if !(0xDC00..=0xDFFF).contains(&low) {
                                return Err(MErr::Lone(at));
                            }
                            let units = [unit, low];
                            let mut decoded = char::decode_utf16(units.iter().copied());
                            match decoded.next() {
                                Some(Ok(c)) => Ok(c),
                                _ => Err(MErr::Lone(at)),
                            }
                        }
                        0xDC00..=0xDFFF => Err(MErr::Lone(at)),
                        _ => char::from_u32(u32::from(unit)).ok_or(MErr::Invalid(at)),
                    };
                }
                _ => return Err(MErr::Invalid(at)),
            };
            self.i += 2;
            Ok(simple)
        }

        /// `\uXXXX` at `i`: its code unit, `i` moved past it.
        fn hex4(&mut self) -> Result<u16, MErr> {
            let at = self.i;
            let hex = self
                .t
                .get(at + 2..at + 6)
                .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
                .ok_or(MErr::Invalid(at))?;
            let unit = u16::from_str_radix(hex, 16).map_err(|_| MErr::Invalid(at))?;
            self.i += 6;
            Ok(unit)
        }

        fn digits(&mut self) -> usize {
            let from = self.i;
            while self.peek().is_some_and(|b| b.is_ascii_digit()) {
                self.i += 1;
            }
            self.i - from
        }

        fn number(&mut self) -> Result<M, MErr> {
            let start = self.i;
            self.eat(b'-');
            match self.peek() {
                Some(b'0') => self.i += 1,
                Some(b'1'..=b'9') => {
                    self.digits();
                }
                _ => return Err(MErr::Invalid(self.i)),
            }
            if self.eat(b'.') && self.digits() == 0 {
                return Err(MErr::Invalid(self.i));
            }
            if self.eat(b'e') || self.eat(b'E') {
                if !self.eat(b'+') {
                    self.eat(b'-');
                }
                if self.digits() == 0 {
                    return Err(MErr::Invalid(self.i));
                }
            }
            let literal = &self.t[start..self.i];
            let v: f64 = literal.parse().map_err(|_| MErr::Invalid(start))?;
            if self.unsafe_integers && (!v.is_finite() || inexact_integer(literal)) {
                return Err(MErr::Unsafe(start));
            }
            Ok(M::Num(v))
        }
    }

    /// Whether a finite literal is an integer literal (no fraction, no exponent: one with
    /// either is a double, whatever its value) whose integer no double holds exactly. Its value
    /// is D * 10^e with D free of trailing zeros, and it is exact iff the odd part of
    /// D * 10^e, that is odd(D) * 5^e, is below 2^53.
    pub fn inexact_integer(literal: &str) -> bool {
        if literal.contains(['.', 'e', 'E']) {
            return false;
        }
        let unsigned = literal.trim_start_matches('-');
        let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
            Some(i) => (&unsigned[..i], &unsigned[i + 1..]),
            None => (unsigned, ""),
        };
        let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        let exponent = exponent.trim_start_matches('+');
        let (negative, exp_digits) = match exponent.strip_prefix('-') {
            Some(d) => (true, d),
            None => (false, exponent),
        };
        let magnitude = exp_digits.bytes().fold(0i64, |acc, d| {
            acc.saturating_mul(10).saturating_add(i64::from(d - b'0'))
        });
        let mut e = if negative { -magnitude } else { magnitude };
        e = e.saturating_sub(i64::try_from(frac.len()).unwrap_or(i64::MAX));
        let mut digits: Vec<u8> = int
            .bytes()
            .chain(frac.bytes())
            .map(|b| b - b'0')
            .skip_while(|&d| d == 0)
            .collect();
        if digits.is_empty() {
            return false; // zero
        }
        while digits.last() == Some(&0) {
            digits.pop();
            e = e.saturating_add(1);
        }
        if e < 0 {
            return false; // a fraction
        }
        if digits.len() > 400 {
            return true; // the caller found it finite; defensive only
        }
        // Halve D while it is even, to get its odd part.
        while digits.last().is_some_and(|d| d % 2 == 0) {
            let mut half = Vec::with_capacity(digits.len());
            let mut carry = 0u8;
            for &d in &digits {
                let cur = carry * 10 + d;
                half.push(cur / 2);
                carry = cur % 2;
            }
            digits = half.into_iter().skip_while(|&d| d == 0).collect();
        }
        if digits.len() > 16 {
            return true; // odd part >= 10^16 > 2^53
        }
        let mut odd = digits.iter().fold(0u64, |acc, &d| acc * 10 + u64::from(d));
        const LIMIT: u64 = 1 << 53;
        for _ in 0..e {
            odd = odd.saturating_mul(5);
            if odd >= LIMIT {
                return true;
            }
        }
        odd >= LIMIT
    }

    /// The JCS text of `value`, after the lenient clean-up in lenient mode.
    pub fn canonical(value: &M, mode: Canonicalization) -> String {
        let mut out = String::new();
        match mode {
            Canonicalization::Jcs => write(value, &mut out),
            Canonicalization::JcsLenient => write(&lenient(value), &mut out),
        }
        out
    }

    /// Trims `White_Space` around string values and drops `null` members, at every depth.
    pub fn lenient(value: &M) -> M {
        match value {
            M::Str(s) => M::Str(s.trim().to_owned()),
            M::Arr(items) => M::Arr(items.iter().map(lenient).collect()),
            M::Obj(members) => M::Obj(
                members
                    .iter()
                    .filter(|(_, v)| *v != M::Null)
                    .map(|(n, v)| (n.clone(), lenient(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }

    /// RFC 8785: members sorted by UTF-16 code units, minimal escaping, ECMAScript numbers.
    pub fn write(value: &M, out: &mut String) {
        match value {
            M::Null => out.push_str("null"),
            M::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            M::Num(n) if n.is_finite() => out.push_str(ryu_js::Buffer::new().format_finite(*n)),
            M::Num(_) => out.push_str("null"),
            M::Str(s) => write_str(s, out),
            M::Arr(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(item, out);
                }
                out.push(']');
            }
            M::Obj(members) => {
                let mut keyed: Vec<(Vec<u16>, &String, &M)> = members
                    .iter()
                    .map(|(n, v)| (n.encode_utf16().collect(), n, v))
                    .collect();
                keyed.sort_by(|a, b| a.0.cmp(&b.0));
                out.push('{');
                for (i, (_, n, v)) in keyed.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write_str(n, out);
                    out.push(':');
                    write(v, out);
                }
                out.push('}');
            }
        }
    }

    fn write_str(s: &str, out: &mut String) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                c if (c as u32) < 0x20 => {
                    let n = c as usize;
                    out.push_str("\\u00");
                    out.push(char::from(HEX[n >> 4]));
                    out.push(char::from(HEX[n & 15]));
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }

    /// Whether the implementation's parsed `Value` is the model's tree: same order, same
    /// strings, numbers with the same bits.
    pub fn same_tree(value: &Value, m: &M) -> bool {
        match (value, m) {
            (Value::Null, M::Null) => true,
            (Value::Bool(a), M::Bool(b)) => a == b,
            (Value::Number(a), M::Num(b)) => a.to_bits() == b.to_bits(),
            (Value::String(a), M::Str(b)) => a == b,
            (Value::Array(a), M::Arr(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same_tree(x, y))
            }
            (Value::Object(a), M::Obj(b)) => {
                a.len() == b.len()
                    && a.iter()
                        .zip(b)
                        .all(|((na, va), (nb, vb))| na == nb && same_tree(va, vb))
            }
            _ => false,
        }
    }
}
