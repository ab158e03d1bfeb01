//! The strict RFC 8259 parser behind [`super::parse`]: one pass over the bytes with an explicit
//! stack of open containers (never recursion), refusing what the ledger refuses as it goes.

use std::collections::HashSet;

use super::{CanonicalError, QUOTE_CHARS, Value};

/// A container whose contents are still being read. The parser keeps these on a heap stack
/// instead of recursing, so hostile nesting can never exhaust the thread's stack.
enum Frame {
    Array(Vec<Value>),
    Object(ObjectFrame),
}

#[derive(Default)]
struct ObjectFrame {
    members: Vec<(String, Value)>,
    /// Names read so far, so a duplicate is refused where it appears.
    seen: HashSet<String>,
    /// The name of the member whose value is being read.
    pending: String,
}

pub(super) struct Parser<'a> {
    pub(super) text: &'a str,
    pub(super) bytes: &'a [u8],
    /// Always on a char boundary: the parser only steps over ASCII bytes or whole string runs
    /// that end at an ASCII byte.
    pub(super) pos: usize,
    pub(super) max_depth: usize,
}

impl Parser<'_> {
    /// Reads one value, containers included, without recursion.
    pub(super) fn value(&mut self) -> Result<Value, CanonicalError> {
        let mut stack: Vec<Frame> = Vec::new();
        'next_value: loop {
            // Read the start of a value: a whole scalar or empty container, or the opening of
            // a non-empty container, which is pushed before going back for its first element.
            self.skip_whitespace();
            let mut value = match self.peek() {
                Some(b'{') => {
                    self.open_container(stack.len())?;
                    self.skip_whitespace();
                    if self.eat(b'}') {
                        Value::Object(Vec::new())
                    } else {
                        let mut frame = ObjectFrame::default();
                        frame.pending = self.member_name(&mut frame.seen)?;
                        stack.push(Frame::Object(frame));
                        continue 'next_value;
                    }
                }
                Some(b'[') => {
                    self.open_container(stack.len())?;
                    self.skip_whitespace();
                    if self.eat(b']') {
                        Value::Array(Vec::new())
                    } else {
                        stack.push(Frame::Array(Vec::new()));
                        continue 'next_value;
                    }
                }
                _ => self.scalar()?,
            };
            // A value is complete: give it to the enclosing container, then either go back
            // for that container's next element or close it, which completes another value.
            loop {
                let Some(frame) = stack.pop() else {
                    return Ok(value);
                };
                self.skip_whitespace();
                match frame {
                    Frame::Array(mut items) => {
                        items.push(value);
                        match self.peek() {
                            Some(b',') => {
                                self.pos += 1;
                                stack.push(Frame::Array(items));
                                continue 'next_value;
                            }
                            Some(b']') => {
                                self.pos += 1;
                                value = Value::Array(items);
                            }
                            _ => return Err(self.unexpected("',' or ']' after an array element")),
                        }
                    }
                    Frame::Object(mut frame) => {
                        let name = std::mem::take(&mut frame.pending);
                        frame.members.push((name, value));
                        match self.peek() {
                            Some(b',') => {
                                self.pos += 1;
                                self.skip_whitespace();
                                frame.pending = self.member_name(&mut frame.seen)?;
                                stack.push(Frame::Object(frame));
                                continue 'next_value;
                            }
                            Some(b'}') => {
                                self.pos += 1;
                                value = Value::Object(frame.members);
                            }
                            _ => return Err(self.unexpected("',' or '}' after an object member")),
                        }
                    }
                }
            }
        }
    }

    /// Steps over `{` or `[`, refusing it if it would nest deeper than the limit.
    /// `open` is the number of containers already open around it.
    fn open_container(&mut self, open: usize) -> Result<(), CanonicalError> {
        if open >= self.max_depth {
            return Err(CanonicalError::JsonTooDeep {
                max_depth: self.max_depth,
                offset: self.pos,
            });
        }
        self.pos += 1;
        Ok(())
    }

    /// Reads `"name"` and the `:` after it, refusing a name already in `seen`.
    fn member_name(&mut self, seen: &mut HashSet<String>) -> Result<String, CanonicalError> {
        let offset = self.pos;
        if self.peek() != Some(b'"') {
            return Err(self.unexpected("a member name in double quotes"));
        }
        let name = self.string()?;
        if seen.contains(&name) {
            return Err(CanonicalError::DuplicateMember {
                name: shorten(&name),
                offset,
            });
        }
        seen.insert(name.clone());
        self.skip_whitespace();
        if !self.eat(b':') {
            return Err(self.unexpected("':' after a member name"));
        }
        Ok(name)
    }

    fn scalar(&mut self) -> Result<Value, CanonicalError> {
        match self.peek() {
            Some(b'"') => Ok(Value::String(self.string()?)),
            Some(b't') => self.literal("true", Value::Bool(true)),
            Some(b'f') => self.literal("false", Value::Bool(false)),
            Some(b'n') => self.literal("null", Value::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => Err(self.unexpected("a value")),
        }
    }

    fn literal(&mut self, word: &'static str, value: Value) -> Result<Value, CanonicalError> {
        if self.bytes[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            Ok(value)
        } else {
            Err(invalid(
                self.pos,
                format!("invalid literal, expected `{word}`"),
            ))
        }
    }

    /// Reads a string token, `pos` on its opening quote.
    fn string(&mut self) -> Result<String, CanonicalError> {
        let start = self.pos;
        self.pos += 1;
        let mut out = String::new();
        loop {
            // Copy the run up to the next byte that needs attention. Those bytes are all
            // ASCII, so the run ends on a char boundary.
            let run = self.pos;
            while let Some(&b) = self.bytes.get(self.pos) {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            out.push_str(&self.text[run..self.pos]);
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => out.push(self.escape()?),
                Some(b) => {
                    return Err(invalid(
                        self.pos,
                        format!(
                            "unescaped control character U+{b:04X} in a string (write it as \\u{b:04x})"
                        ),
                    ));
                }
                None => {
                    return Err(invalid(
                        start,
                        "unterminated string (no closing '\"')".to_owned(),
                    ));
                }
            }
        }
    }

    /// Reads one escape sequence, `pos` on its backslash. A `\u` high surrogate must be
    /// followed at once by a `\u` low surrogate; the pair becomes one character.
    fn escape(&mut self) -> Result<char, CanonicalError> {
        let start = self.pos;
        let c = match self.bytes.get(self.pos + 1) {
            Some(b'"') => '"',
            Some(b'\\') => '\\',
            Some(b'/') => '/',
            Some(b'b') => '\u{08}',
            Some(b'f') => '\u{0C}',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b't') => '\t',
            Some(b'u') => return self.unicode_escape(),
            _ => {
                return Err(invalid(
                    start,
                    "invalid escape (allowed: \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)"
                        .to_owned(),
                ));
            }
        };
        self.pos += 2;
        Ok(c)
    }

    fn unicode_escape(&mut self) -> Result<char, CanonicalError> {
        let start = self.pos;
        let unit = self.hex4()?;
        let lone = CanonicalError::LoneSurrogate {
            code_unit: unit,
            offset: start,
        };
        let code = match unit {
            0xD800..=0xDBFF => {
                if !self.bytes[self.pos..].starts_with(b"\\u") {
                    return Err(lone);
                }
                let low = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&low) {
                    // The high one is reported: it is the one left without a partner (a
                    // second high would be reported next, were the first one fixed).
                    return Err(lone);
                }
                0x10000 + ((u32::from(unit) - 0xD800) << 10) + (u32::from(low) - 0xDC00)
            }
            0xDC00..=0xDFFF => return Err(lone),
            _ => u32::from(unit),
        };
        // Never fails: surrogates were handled above and a pair is at most U+10FFFF.
        char::from_u32(code).ok_or_else(|| invalid(start, "invalid \\u escape".to_owned()))
    }

    /// Reads `\uXXXX`, `pos` on the backslash, and returns the code unit.
    fn hex4(&mut self) -> Result<u16, CanonicalError> {
        let start = self.pos;
        let digits = self
            .bytes
            .get(self.pos + 2..self.pos + 6)
            .filter(|d| d.iter().all(u8::is_ascii_hexdigit))
            .ok_or_else(|| invalid(start, "\\u must be followed by four hex digits".to_owned()))?;
        let unit = digits
            .iter()
            .fold(0u16, |acc, &d| (acc << 4) | hex_value(d));
        self.pos += 6;
        Ok(unit)
    }

    /// Reads a number token (RFC 8259 grammar:
    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`) and reads it as a double.
    fn number(&mut self) -> Result<Value, CanonicalError> {
        let start = self.pos;
        self.eat(b'-');
        match self.peek() {
            Some(b'0') => {
                self.pos += 1;
                if self.peek().is_some_and(|b| b.is_ascii_digit()) {
                    return Err(invalid(start, "leading zeros are not allowed".to_owned()));
                }
            }
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(self.unexpected("a digit")),
        }
        if self.eat(b'.') {
            if !self.peek().is_some_and(|b| b.is_ascii_digit()) {
                return Err(self.unexpected("a digit after the decimal point"));
            }
            self.digits();
        }
        if self.peek().is_some_and(|b| b == b'e' || b == b'E') {
            self.pos += 1;
            if !self.eat(b'+') {
                self.eat(b'-');
            }
            if !self.peek().is_some_and(|b| b.is_ascii_digit()) {
                return Err(self.unexpected("a digit in the exponent"));
            }
            self.digits();
        }
        let literal = &self.text[start..self.pos];
        // Rust's float parsing is correctly rounded, as ECMAScript requires, and reads
        // underflow as (signed) zero just as JavaScript does.
        let value: f64 = literal
            .parse()
            .map_err(|_| invalid(start, "malformed number".to_owned()))?;
        let problem = if !value.is_finite() {
            Some("is beyond the range of an IEEE-754 double")
        } else if is_inexact_integer(literal, value) {
            Some("is an integer that an IEEE-754 double cannot hold exactly")
        } else {
            None
        };
        match problem {
            Some(problem) => Err(CanonicalError::UnsafeInteger {
                literal: shorten(literal),
                offset: start,
                problem,
            }),
            None => Ok(Value::Number(value)),
        }
    }

    fn digits(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.pos += 1;
        }
    }

    pub(super) fn skip_whitespace(&mut self) {
        // Only JSON's four whitespace characters; a BOM or NBSP here is an error.
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn eat(&mut self, b: u8) -> bool {
        if self.peek() == Some(b) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// "expected X, found Y" at the current position.
    pub(super) fn unexpected(&self, expected: &str) -> CanonicalError {
        let found = match self.text[self.pos..].chars().next() {
            None => "end of input".to_owned(),
            Some('\u{FEFF}') => "a byte order mark (U+FEFF)".to_owned(),
            Some(c) if c.is_control() || c.is_whitespace() => {
                format!("U+{:04X}", u32::from(c))
            }
            Some(c) => format!("{c:?}"),
        };
        invalid(self.pos, format!("expected {expected}, found {found}"))
    }
}

fn invalid(offset: usize, message: String) -> CanonicalError {
    CanonicalError::InvalidJson { offset, message }
}

fn hex_value(d: u8) -> u16 {
    match d {
        b'0'..=b'9' => u16::from(d - b'0'),
        b'a'..=b'f' => u16::from(d - b'a' + 10),
        _ => u16::from(d - b'A' + 10),
    }
}

/// Whether `literal` (already checked against the JSON grammar, its double `value` finite) is
/// an integer literal, digits with no fraction and no exponent, whose integer no double holds
/// exactly. Only such literals are refused: a fraction or an exponent says the writer meant a
/// double (`1e23`, `2.0`), which rounds as JavaScript rounds it, while an exact integer that
/// rounded (`9007199254740993`, an account number) would silently become another one.
///
/// Compares exact decimal digit strings rather than testing against 2^53: 2^60 is held
/// exactly, and so is every other double, which is what `{:.0}` prints in full.
fn is_inexact_integer(literal: &str, value: f64) -> bool {
    if literal.contains(['.', 'e', 'E']) {
        return false;
    }
    let digits = literal.strip_prefix('-').unwrap_or(literal);
    // No finite double has more than 309 integer digits; the bound also caps the allocation.
    digits.len() > 309 || format!("{:.0}", value.abs()) != digits
}

/// The first [`QUOTE_CHARS`] characters of `s`, with an ellipsis if anything was cut.
fn shorten(s: &str) -> String {
    match s.char_indices().nth(QUOTE_CHARS) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s.to_owned(),
    }
}
