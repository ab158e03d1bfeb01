//! Which of the upstream's tools the ledger governs, and how: the policy file
//! (`--mcp-policy FILE`), one line a tool name or glob, the first line that matches a tool
//! deciding for it. `#` starts a comment.
//!
//! ```text
//! # tool or glob    what the gateway does
//! search_*          pass
//! send_email        once errors-final
//! issue_refund      gate /amount > 100
//! delete_*          gate
//! create_ticket     confirm find_ticket external_id=$ref found=/ticket
//! ```
//!
//! - `pass`: a read; every call goes to the upstream live, never through the ledger.
//! - `once` (the default for a tool no line names): one effect per intent.
//! - `gate [POINTER OP BOUND]`: once, and a person decides first (always, or only when the
//!   number at the JSON pointer passes the bound, the approval policy's threshold).
//! - `confirm READ_TOOL [ARG=VALUE]… [found=POINTER | found-text=TEXT]`: once, with a paired
//!   read: another tool of the same upstream that says whether an unknown outcome's effect
//!   happened. Each `ARG=VALUE` is an argument of the read: `/pointer` (from the call's
//!   arguments), `$ref` (the attempt's external_ref), `$key` (its key), or JSON (`3`,
//!   `"text"`). Its answer reads as found when `structuredContent` has a true or non-empty
//!   value at POINTER (or its text holds TEXT); as not found otherwise; and as "cannot tell"
//!   when it is an error.
//! - `errors-final` (with `once`, `gate` or `confirm`): an `isError` result is a permanent
//!   failure (repeats get it back), not a retryable one.
//!
//! A tool that no line names is governed as `once`, unless the upstream's own annotations say
//! it only reads (`readOnlyHint` without `destructiveHint`): then it passes. Nothing an
//! annotation says can make a call act twice: a hint can only let a read through live, and a
//! line of the policy always wins over it.

use serde_json::Value;

use crate::domain::approval::Threshold;

/// What the gateway does with a call of one tool.
#[derive(Clone, Debug, PartialEq)]
pub enum Governance {
    /// To the upstream live, as any other message.
    Pass,
    /// Through the ledger: one effect per intent.
    Once(Once),
}

/// How a governed tool's calls go through the ledger.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Once {
    /// A person decides first (always with no threshold, else only past it).
    pub gate: Option<Gate>,
    /// The paired read that settles an unknown outcome.
    pub confirm: Option<Confirm>,
    /// An `isError` result is a permanent failure rather than a retryable one.
    pub errors_final: bool,
}

/// When a call of a gated tool needs a person's decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Gate {
    /// Only when this number of the arguments passes; always when `None`.
    pub threshold: Option<Threshold>,
}

impl Gate {
    /// Whether a call with `arguments` needs a decision.
    #[must_use]
    pub fn applies(&self, arguments: &Value) -> bool {
        self.threshold.as_ref().is_none_or(|t| t.gates(arguments))
    }
}

/// A paired read: the upstream tool that says whether an effect happened.
#[derive(Clone, Debug, PartialEq)]
pub struct Confirm {
    /// The read's tool name (on the same upstream).
    pub tool: String,
    /// Its arguments, each taken from the call as the line says.
    pub arguments: Vec<(String, ArgumentFrom)>,
    /// How its answer reads as found.
    pub found: Found,
}

/// Where an argument of a paired read comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum ArgumentFrom {
    /// The value at this JSON pointer of the call's arguments.
    Pointer(String),
    /// The attempt's external_ref.
    ExternalRef,
    /// The attempt's key.
    Key,
    /// This JSON value.
    Literal(Value),
}

/// How a paired read's answer reads as "found".
#[derive(Clone, Debug, PartialEq)]
pub enum Found {
    /// `structuredContent` holds a true, non-zero or non-empty value at this pointer.
    Pointer(String),
    /// A text content block holds this text.
    Text(String),
}

/// One line of the policy.
#[derive(Clone, Debug, PartialEq)]
struct Line {
    /// The tool name or glob (`*` any run of characters, `?` one).
    pattern: String,
    /// What it says.
    governance: Governance,
}

/// The policy in force: its lines, in file order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct McpPolicy {
    lines: Vec<Line>,
}

/// What an upstream's `tools/list` says of a tool, as far as the gateway listens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hints {
    /// `annotations.readOnlyHint`.
    pub read_only: bool,
    /// `annotations.destructiveHint`.
    pub destructive: bool,
}

impl Hints {
    /// The hints of one tool of a `tools/list` result.
    #[must_use]
    pub fn of(tool: &Value) -> Hints {
        let flag = |name: &str| {
            tool.pointer(&format!("/annotations/{name}"))
                .and_then(Value::as_bool)
                .unwrap_or(false)
        };
        Hints {
            read_only: flag("readOnlyHint"),
            destructive: flag("destructiveHint"),
        }
    }
}

impl McpPolicy {
    /// Reads a policy file's text.
    ///
    /// # Errors
    /// `line N: why` for the first line that does not parse.
    pub fn parse(text: &str) -> Result<McpPolicy, String> {
        let mut lines = Vec::new();
        for (n, raw) in text.lines().enumerate() {
            let content = raw.split('#').next().unwrap_or("").trim();
            if content.is_empty() {
                continue;
            }
            let words: Vec<&str> = content.split_whitespace().collect();
            let line = parse_line(&words).map_err(|why| format!("line {}: {why}", n + 1))?;
            lines.push(line);
        }
        Ok(McpPolicy { lines })
    }

    /// What the gateway does with a call of `tool`, given the upstream's `hints` for it (when
    /// it listed them).
    #[must_use]
    pub fn governance(&self, tool: &str, hints: Option<Hints>) -> Governance {
        if let Some(line) = self.lines.iter().find(|l| glob(&l.pattern, tool)) {
            return line.governance.clone();
        }
        match hints {
            Some(h) if h.read_only && !h.destructive => Governance::Pass,
            _ => Governance::Once(Once::default()),
        }
    }

    /// How many lines it holds (for the logs).
    #[must_use]
    pub fn len(&self) -> usize {
        self.lines.len()
    }

    /// Whether it has no line.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }
}

/// One line's words: the pattern, then what it says.
fn parse_line(words: &[&str]) -> Result<Line, String> {
    let [pattern, first, rest @ ..] = words else {
        return Err("expected `<tool or glob> pass|once|gate|confirm …`".to_string());
    };
    if pattern.chars().any(char::is_control) {
        return Err("control characters in the tool name".to_string());
    }
    let mut once = Once::default();
    let mut rest: &[&str] = rest;
    match *first {
        "pass" => {
            if let Some(extra) = rest.first() {
                return Err(format!("`pass` takes nothing more, found `{extra}`"));
            }
            return Ok(Line {
                pattern: (*pattern).to_string(),
                governance: Governance::Pass,
            });
        }
        "once" => {}
        "gate" => {
            let threshold = match rest {
                [pointer, op, bound, tail @ ..] if pointer.starts_with('/') => {
                    rest = tail;
                    Some(Threshold::parse(pointer, op, bound)?)
                }
                _ => None,
            };
            once.gate = Some(Gate { threshold });
        }
        "confirm" => {
            let (confirm, tail) = parse_confirm(rest)?;
            once.confirm = Some(confirm);
            rest = tail;
        }
        other => {
            return Err(format!(
                "`{other}` is not a policy: use pass, once, gate or confirm"
            ));
        }
    }
    for word in rest {
        match *word {
            "errors-final" => once.errors_final = true,
            other => return Err(format!("`{other}` is not understood here")),
        }
    }
    Ok(Line {
        pattern: (*pattern).to_string(),
        governance: Governance::Once(once),
    })
}

/// `confirm READ_TOOL [ARG=VALUE]… [found=POINTER | found-text=TEXT]`, and the words after it.
fn parse_confirm<'a>(words: &'a [&'a str]) -> Result<(Confirm, &'a [&'a str]), String> {
    let [tool, rest @ ..] = words else {
        return Err("`confirm` names the paired read's tool".to_string());
    };
    let mut arguments = Vec::new();
    let mut found = None;
    let mut used = 0;
    for word in rest {
        let Some((name, value)) = word.split_once('=') else {
            break;
        };
        used += 1;
        match name {
            "found" if value.starts_with('/') => found = Some(Found::Pointer(value.to_string())),
            "found" => return Err(format!("found=`{value}` is not a JSON pointer")),
            "found-text" if !value.is_empty() => found = Some(Found::Text(value.to_string())),
            "found-text" => return Err("found-text= needs a text".to_string()),
            _ if name.is_empty() => return Err(format!("`{word}` names no argument")),
            _ => arguments.push((name.to_string(), argument_from(value)?)),
        }
    }
    let found = found.ok_or_else(|| {
        "`confirm` says how its answer reads as found: found=/pointer or found-text=TEXT"
            .to_string()
    })?;
    Ok((
        Confirm {
            tool: (*tool).to_string(),
            arguments,
            found,
        },
        &rest[used..],
    ))
}

/// A paired read's argument value as the line writes it.
fn argument_from(value: &str) -> Result<ArgumentFrom, String> {
    Ok(match value {
        "$ref" => ArgumentFrom::ExternalRef,
        "$key" => ArgumentFrom::Key,
        pointer if pointer.starts_with('/') => ArgumentFrom::Pointer(pointer.to_string()),
        json => ArgumentFrom::Literal(serde_json::from_str(json).map_err(|_| {
            format!("`{json}` is neither /pointer, $ref, $key nor JSON (a text is \"quoted\")")
        })?),
    })
}

/// Whether `name` matches `pattern`: `*` any run of characters (none too), `?` one.
fn glob(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // The classic two-pointer match, backtracking to the last `*`.
    let (mut i, mut j, mut star, mut mark) = (0, 0, None, 0);
    while j < n.len() {
        if i < p.len() && (p[i] == '?' || p[i] == n[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if let Some(s) = star {
            i = s + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|c| *c == '*')
}

impl Confirm {
    /// The read's arguments for a call with `arguments`, whose attempt has `external_ref` and
    /// `key`; an argument whose pointer finds nothing is left out.
    #[must_use]
    pub fn read_arguments(&self, arguments: &Value, external_ref: &str, key: &str) -> Value {
        let mut out = serde_json::Map::new();
        for (name, from) in &self.arguments {
            let value = match from {
                ArgumentFrom::Pointer(p) => arguments.pointer(p).cloned(),
                ArgumentFrom::ExternalRef => Some(Value::String(external_ref.to_string())),
                ArgumentFrom::Key => Some(Value::String(key.to_string())),
                ArgumentFrom::Literal(v) => Some(v.clone()),
            };
            if let Some(value) = value {
                out.insert(name.clone(), value);
            }
        }
        Value::Object(out)
    }

    /// How the read's `CallToolResult` reads: `Some(true)` found, `Some(false)` not found,
    /// `None` cannot tell (an error, or no result).
    #[must_use]
    pub fn reads(&self, result: &Value) -> Option<bool> {
        if result.get("isError").and_then(Value::as_bool) == Some(true) {
            return None;
        }
        Some(match &self.found {
            Found::Pointer(p) => result
                .get("structuredContent")
                .and_then(|s| s.pointer(p))
                .is_some_and(truthy),
            Found::Text(text) => {
                result
                    .get("content")
                    .and_then(Value::as_array)
                    .is_some_and(|blocks| {
                        blocks.iter().any(|b| {
                            b.get("text")
                                .and_then(Value::as_str)
                                .is_some_and(|t| t.contains(text.as_str()))
                        })
                    })
            }
        })
    }
}

/// Whether a JSON value counts as present: not null, false, zero or empty.
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const POLICY: &str = "\
# tool or glob    what
search_*          pass
send_email        once errors-final
issue_refund      gate /amount > 100
delete_*          gate
create_ticket     confirm find_ticket external_id=$ref subject=/subject limit=1 found=/ticket
*_note            confirm read_note id=$key found-text=found
";

    #[test]
    fn the_first_line_that_matches_decides_and_annotations_only_let_reads_through() {
        let policy = McpPolicy::parse(POLICY).expect("parses");
        assert_eq!(policy.len(), 6);
        assert_eq!(policy.governance("search_docs", None), Governance::Pass);
        let Governance::Once(send) = policy.governance("send_email", None) else {
            panic!("once")
        };
        assert!(send.errors_final && send.gate.is_none());
        let Governance::Once(refund) = policy.governance("issue_refund", None) else {
            panic!("once")
        };
        let gate = refund.gate.expect("a gate");
        assert!(gate.applies(&json!({"amount": 101})));
        assert!(!gate.applies(&json!({"amount": 100})));
        let Governance::Once(delete) = policy.governance("delete_user", None) else {
            panic!("once")
        };
        assert!(delete.gate.expect("gate").applies(&json!({})));
        // No line: governed, unless the upstream says the tool only reads.
        let read = Hints {
            read_only: true,
            destructive: false,
        };
        let odd = Hints {
            read_only: true,
            destructive: true,
        };
        assert_eq!(
            policy.governance("list_files", Some(read)),
            Governance::Pass
        );
        assert!(matches!(
            policy.governance("list_files", Some(odd)),
            Governance::Once(_)
        ));
        assert!(matches!(
            policy.governance("list_files", None),
            Governance::Once(_)
        ));
        // A line wins over a hint: a read-only hint never lets a governed tool through.
        assert!(matches!(
            policy.governance("send_email", Some(read)),
            Governance::Once(_)
        ));
    }

    #[test]
    fn a_paired_read_takes_its_arguments_from_the_call_and_reads_its_answer() {
        let policy = McpPolicy::parse(POLICY).expect("parses");
        let Governance::Once(ticket) = policy.governance("create_ticket", None) else {
            panic!("once")
        };
        let confirm = ticket.confirm.expect("a paired read");
        assert_eq!(confirm.tool, "find_ticket");
        assert_eq!(
            confirm.read_arguments(&json!({"subject": "refund"}), "idem-1", "k"),
            json!({"external_id": "idem-1", "subject": "refund", "limit": 1})
        );
        assert_eq!(
            confirm.reads(&json!({"structuredContent": {"ticket": {"id": 7}}})),
            Some(true)
        );
        assert_eq!(
            confirm.reads(&json!({"structuredContent": {"ticket": null}})),
            Some(false)
        );
        assert_eq!(confirm.reads(&json!({"content": []})), Some(false));
        assert_eq!(
            confirm.reads(&json!({"isError": true, "content": []})),
            None,
            "an error cannot tell"
        );
        let Governance::Once(note) = policy.governance("append_note", None) else {
            panic!("once")
        };
        let read_note = note.confirm.expect("a paired read");
        assert_eq!(
            read_note.read_arguments(&json!({}), "r", "key-1"),
            json!({"id": "key-1"})
        );
        assert_eq!(
            read_note.reads(&json!({"content": [{"type": "text", "text": "found: yes"}]})),
            Some(true)
        );
    }

    #[test]
    fn a_bad_line_is_named() {
        for (text, line) in [
            ("send\n", "line 1"),
            ("a pass\nb sometimes\n", "line 2"),
            ("a pass now\n", "line 1"),
            ("a gate /amount < 3\n", "line 1"),
            ("a gate /amount > lots\n", "line 1"),
            ("a once soon\n", "line 1"),
            ("a confirm\n", "line 1"),
            ("a confirm read x=$ref\n", "line 1"),
            ("a confirm read found=amount\n", "line 1"),
            ("\n\na confirm read id=[oops found=/x\n", "line 3"),
        ] {
            let e = McpPolicy::parse(text).expect_err(text);
            assert!(e.starts_with(line), "{text:?}: {e}");
        }
    }

    #[test]
    fn globs_match_runs_and_single_characters() {
        for (pattern, name, matches) in [
            ("*", "anything", true),
            ("search_*", "search_docs", true),
            ("search_*", "research_docs", false),
            ("*_note", "append_note", true),
            ("get_?", "get_x", true),
            ("get_?", "get_xy", false),
            ("a*b*c", "aXXbYYc", true),
            ("a*b*c", "aXXbYY", false),
            ("exact", "exact", true),
            ("exact", "exactly", false),
        ] {
            assert_eq!(glob(pattern, name), matches, "{pattern} ~ {name}");
        }
    }
}
