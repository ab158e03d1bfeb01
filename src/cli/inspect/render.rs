//! How the inspection commands print entries: the `entries` table and its count line, one
//! entry field by field (`entry KEY`) with its history, and the proto3 JSON of `--json`.

use std::fmt::Write as _;

use base64::Engine as _;
use prost_types::Timestamp;
use serde::Serialize;

use crate::grpc::pb;

/// Longest tool or run id shown in a table cell unless `--wide`.
const NAME_WIDTH: usize = 24;
/// Longest error text shown in a table cell unless `--wide`.
const ERROR_WIDTH: usize = 40;
/// How many characters of the key a table shows unless `--wide`: as many as `external_ref`
/// carries, so the two can be matched by eye.
pub(super) const KEY_WIDTH: usize = 16;

/// An entry's history, one event a line, for `entry KEY`; nothing without one.
pub fn render_history(history: &[pb::HistoryEvent]) -> String {
    if history.is_empty() {
        return String::new();
    }
    let mut text = String::from("history\n");
    for event in history {
        let at = event
            .at
            .as_ref()
            .map_or_else(|| "-".to_string(), ToString::to_string);
        let _ = writeln!(
            text,
            "  {at}  {}  attempt {}  {}  {}",
            event.kind,
            event.attempt,
            or_dash(one_line(&event.principal)),
            one_line(&event.detail)
        );
    }
    text
}

/// How a table is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableOptions {
    /// Whole keys, tools, runs and errors.
    pub wide: bool,
    /// A RUN column: listings of one run (`--run`) leave it out, every row would repeat it.
    pub show_run: bool,
}

/// The table `entries` prints: a header and one row per entry, columns padded to their widest
/// cell. Empty input gives an empty string (the count line says "0 entries").
pub fn render_table(entries: &[pb::Entry], options: TableOptions) -> String {
    if entries.is_empty() {
        return String::new();
    }
    let cut = |text: &str, width: usize| {
        if options.wide {
            one_line(text)
        } else {
            shorten(&one_line(text), width)
        }
    };
    let mut header = vec!["STARTED_AT", "KEY"];
    if options.show_run {
        header.push("RUN");
    }
    header.extend([
        "TOOL",
        "STATUS",
        "ATTEMPT",
        "REPLAYS",
        "FINISHED_AT",
        "ERROR",
    ]);
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| (*h).to_string()).collect()];
    for e in entries {
        let mut row = vec![table_time(e.started_at.as_ref()), cut(&e.key, KEY_WIDTH)];
        if options.show_run {
            row.push(or_dash(cut(&e.run_id, NAME_WIDTH)));
        }
        row.extend([
            cut(&e.tool, NAME_WIDTH),
            status_label(e),
            e.attempt.to_string(),
            e.replay_count.to_string(),
            table_time(e.finished_at.as_ref()),
            or_dash(cut(&e.error, ERROR_WIDTH)),
        ]);
        rows.push(row);
    }
    let columns = rows[0].len();
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut text = String::new();
    for row in &rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == columns {
                line.push_str(cell);
            } else {
                let pad = widths[c] - cell.chars().count();
                let _ = write!(line, "{cell}{:pad$}  ", "");
            }
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

/// The last line of a listing.
pub fn count_line(count: u64, more: bool) -> String {
    let noun = if count == 1 { "entry" } else { "entries" };
    if more {
        format!("{count} {noun} (--limit reached; more match)\n")
    } else {
        format!("{count} {noun}\n")
    }
}

/// The fields of one entry, one a line, for `entry KEY` (a mark of a possible double effect is
/// said on a line of its own before them: see `show`).
pub fn render_entry(e: &pb::Entry) -> String {
    let time = |t: Option<&Timestamp>| t.map_or_else(|| "-".to_string(), ToString::to_string);
    let text = |s: &str| or_dash(one_line(s));
    let (result_label, result) = if e.result.is_empty() {
        ("result", "-".to_string())
    } else {
        match std::str::from_utf8(&e.result) {
            Ok(t) => ("result (UTF-8)", one_line(t)),
            Err(_) => (
                "result (base64)",
                base64::engine::general_purpose::STANDARD.encode(&e.result),
            ),
        }
    };
    let fields: [(&str, String); 18] = [
        ("key", e.key.clone()),
        ("external_ref", text(&e.external_ref)),
        ("run_id", text(&e.run_id)),
        ("tool", text(&e.tool)),
        ("status", status_name(e.status)),
        ("attempt", e.attempt.to_string()),
        ("principal", text(&e.principal)),
        ("fingerprint", text(&e.fingerprint)),
        ("started_at", time(e.started_at.as_ref())),
        ("finished_at", time(e.finished_at.as_ref())),
        ("resolved_by", text(&e.resolved_by)),
        ("lease_expires_at", time(e.lease_expires_at.as_ref())),
        ("expires_at", time(e.expires_at.as_ref())),
        ("replay_count", e.replay_count.to_string()),
        ("error", text(&e.error)),
        ("retryable", e.retryable.to_string()),
        ("arguments_json", text(&e.arguments_json)),
        (result_label, result),
    ];
    let width = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut out = String::new();
    for (name, value) in fields {
        let _ = writeln!(out, "{name:width$}  {value}");
    }
    if let Some(line) = e.approval.as_ref().and_then(approval_line) {
        let _ = writeln!(out, "{:width$}  {line}", "approval");
    }
    out
}

/// The approval of an entry in one line (`None` when no approval is involved): its state, when
/// a person was asked and by when they had to decide, who decided and why, and until when an
/// approval may be used.
fn approval_line(a: &pb::Approval) -> Option<String> {
    let state = pb::ApprovalState::try_from(a.state).unwrap_or_default();
    if state == pb::ApprovalState::Unspecified {
        return None;
    }
    let time = |t: Option<&Timestamp>| t.map_or_else(|| "-".to_string(), ToString::to_string);
    let name = state.as_str_name().trim_start_matches("APPROVAL_STATE_");
    let mut line = name.to_string();
    if let Some(asked) = &a.requested_at {
        let _ = write!(
            line,
            "; asked {asked}, decide by {}",
            time(a.decide_by.as_ref())
        );
    }
    if let Some(decided) = &a.decided_at {
        let _ = write!(
            line,
            "; decided {decided} by {}",
            or_dash(one_line(&a.decided_by))
        );
        if !a.reason.is_empty() {
            let _ = write!(line, ": {}", one_line(&a.reason));
        }
    }
    if let Some(by) = &a.execute_by {
        let _ = write!(line, "; use by {by}");
    }
    Some(line)
}

/// One entry in the proto3 JSON mapping, as grpcurl prints it (lowerCamelCase names, enum
/// names, 64-bit integers as strings, bytes in base64, RFC 3339 times), each field written by
/// `prost-reflect` from the entry's descriptor (so a field added to the proto appears here as
/// the mapping writes it), in the proto's order; except that every field is present (unset
/// times are `null`, defaults written) so that scripts find the same keys in every object;
/// plus `resultText` after `result`: the result as a string when it is valid UTF-8 (else
/// `null`).
struct EntryJson(Vec<(String, serde_json::Value)>);

impl Serialize for EntryJson {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

impl EntryJson {
    fn of(e: &pb::Entry) -> EntryJson {
        use prost::Message as _;
        use prost_reflect::{DescriptorPool, DynamicMessage, Kind, SerializeOptions};
        static ENTRY: std::sync::LazyLock<Option<prost_reflect::MessageDescriptor>> =
            std::sync::LazyLock::new(|| {
                DescriptorPool::decode(crate::proto::FILE_DESCRIPTOR_SET)
                    .ok()?
                    .get_message_by_name("idempotency.v1.Entry")
            });
        // The descriptors are this build's own (proto.rs embeds them) and the message was
        // decoded by this build, so none of these can fail; if one did, the object would lack
        // its fields rather than the command stop.
        let Some(descriptor) = ENTRY.as_ref() else {
            return EntryJson(Vec::new());
        };
        let Ok(message) = DynamicMessage::decode(descriptor.clone(), e.encode_to_vec().as_slice())
        else {
            return EntryJson(Vec::new());
        };
        let options = SerializeOptions::new().skip_default_fields(false);
        let Ok(serde_json::Value::Object(mut written)) =
            message.serialize_with_options(serde_json::value::Serializer, &options)
        else {
            return EntryJson(Vec::new());
        };
        let mut fields = Vec::new();
        for field in descriptor.fields() {
            let unset_message =
                matches!(field.kind(), Kind::Message(_)) && !message.has_field(&field);
            let value = match written.remove(field.json_name()) {
                Some(value) if !unset_message => value,
                _ => serde_json::Value::Null,
            };
            fields.push((field.json_name().to_string(), value));
            if field.name() == "result" {
                let text = std::str::from_utf8(&e.result).ok();
                fields.push((
                    "resultText".to_string(),
                    text.map_or(serde_json::Value::Null, serde_json::Value::from),
                ));
            }
        }
        EntryJson(fields)
    }
}

/// One entry as a one-line JSON object (see `EntryJson`).
pub fn entry_json_line(e: &pb::Entry) -> String {
    // Strings and JSON values always serialize.
    serde_json::to_string(&EntryJson::of(e)).unwrap_or_default()
}

/// One entry as an indented JSON object (see `EntryJson`).
pub fn entry_json_pretty(e: &pb::Entry) -> String {
    serde_json::to_string_pretty(&EntryJson::of(e)).unwrap_or_default()
}

/// The STATUS column: the state, and for a failure whether a new claim may try again (the
/// difference between "will run again" and "never in this intent").
pub(in crate::cli) fn status_label(e: &pb::Entry) -> String {
    let name = status_name(e.status);
    if e.status == pb::Status::Failed as i32 {
        let kind = if e.retryable {
            "retryable"
        } else {
            "permanent"
        };
        format!("{name} ({kind})")
    } else {
        name
    }
}

/// `SUCCEEDED`, or the number of a state this build does not know.
fn status_name(status: i32) -> String {
    match pb::Status::try_from(status) {
        Ok(s) => s.as_str_name().trim_start_matches("STATUS_").to_string(),
        Err(_) => format!("STATUS_{status}"),
    }
}

/// A table's time: to the second (the table is for reading; `entry` and `--json` have the
/// microseconds), or `-`.
fn table_time(t: Option<&Timestamp>) -> String {
    t.map_or_else(
        || "-".to_string(),
        |t| {
            Timestamp {
                seconds: t.seconds,
                nanos: 0,
            }
            .to_string()
        },
    )
}

/// Text for a terminal: control characters (a newline in an error, an escape sequence in a
/// stored result) are shown escaped, so one field stays one line and stored bytes cannot drive
/// the operator's terminal.
pub(super) fn one_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// At most `width` characters, the last one `…` when something was cut.
pub(super) fn shorten(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    let kept: String = text.chars().take(width.saturating_sub(1)).collect();
    // "5.1.1…" rather than "5.1.1 …": the ellipsis stands for the cut, not for a space.
    let mut out = kept.trim_end().to_string();
    out.push('…');
    out
}

fn or_dash(text: String) -> String {
    if text.is_empty() {
        "-".to_string()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    fn at(text: &str) -> Timestamp {
        Timestamp::from_str(text).expect("RFC 3339")
    }

    fn sample(key: &str, status: pb::Status) -> pb::Entry {
        pb::Entry {
            key: key.into(),
            run_id: "run-7f3a".into(),
            tool: "issue_credit".into(),
            fingerprint: "d839".into(),
            status: status as i32,
            attempt: 1,
            started_at: Some(at("2026-11-30T06:20:50.330042Z")),
            lease_expires_at: Some(at("2026-11-30T06:21:50.330042Z")),
            external_ref: format!("idem-{}", &key[..16.min(key.len())]),
            ..Default::default()
        }
    }

    #[test]
    fn the_table_aligns_columns_and_shortens_long_cells() {
        let key = "43ba67c5ba6df15d441f50062f986b45a45acf6939a3175662c2afcb9c8678bb";
        let mut done = sample(key, pb::Status::Succeeded);
        done.finished_at = Some(at("2026-11-30T06:22:55.355339Z"));
        done.replay_count = 3;
        let mut failed = sample("wf-1:step-2", pb::Status::Failed);
        failed.tool = "send_reply_to_a_customer_by_email".into();
        failed.attempt = 2;
        failed.retryable = true;
        failed.error = "mailbox refused the message: 550 5.1.1 user unknown\nsecond line".into();
        let table = render_table(
            &[done, failed],
            TableOptions {
                wide: false,
                show_run: false,
            },
        );
        let expected = "\
STARTED_AT            KEY               TOOL                      STATUS              ATTEMPT  REPLAYS  FINISHED_AT           ERROR
2026-11-30T06:20:50Z  43ba67c5ba6df15…  issue_credit              SUCCEEDED           1        3        2026-11-30T06:22:55Z  -
2026-11-30T06:20:50Z  wf-1:step-2       send_reply_to_a_custome…  FAILED (retryable)  2        0        -                     mailbox refused the message: 550 5.1.1…
";
        assert_eq!(table, expected);
    }

    #[test]
    fn wide_shows_whole_cells_and_a_run_column_appears_without_run() {
        let key = "43ba67c5ba6df15d441f50062f986b45a45acf6939a3175662c2afcb9c8678bb";
        let mut e = sample(key, pb::Status::Failed);
        e.error = "line one\nline two".into();
        let table = render_table(
            &[e],
            TableOptions {
                wide: true,
                show_run: true,
            },
        );
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 2, "{table}");
        assert!(lines[0].starts_with("STARTED_AT            KEY"), "{table}");
        assert!(lines[0].contains("  RUN  "), "{table}");
        assert!(lines[1].contains(key), "{table}");
        assert!(lines[1].contains("run-7f3a"), "{table}");
        assert!(lines[1].contains("FAILED (permanent)"), "{table}");
        // The newline is shown, not printed: the row stays one line.
        assert!(lines[1].ends_with("line one\\nline two"), "{table}");
    }

    #[test]
    fn an_empty_listing_is_only_its_count_line() {
        let options = TableOptions {
            wide: false,
            show_run: true,
        };
        assert_eq!(render_table(&[], options), "");
        assert_eq!(count_line(0, false), "0 entries\n");
        assert_eq!(count_line(1, false), "1 entry\n");
        assert_eq!(
            count_line(100, true),
            "100 entries (--limit reached; more match)\n"
        );
    }

    #[test]
    fn an_entry_prints_every_field_one_a_line() {
        let mut e = sample("wf-1:step-2", pb::Status::Succeeded);
        e.result = prost::bytes::Bytes::from_static(b"{\"credit_id\":\"cr-981\"}");
        e.arguments_json = "{\"amount\":200}".into();
        let text = render_entry(&e);
        let names: Vec<&str> = text
            .lines()
            .map(|l| l.split("  ").next().unwrap_or_default())
            .collect();
        assert_eq!(
            names,
            [
                "key",
                "external_ref",
                "run_id",
                "tool",
                "status",
                "attempt",
                "principal",
                "fingerprint",
                "started_at",
                "finished_at",
                "resolved_by",
                "lease_expires_at",
                "expires_at",
                "replay_count",
                "error",
                "retryable",
                "arguments_json",
                "result (UTF-8)",
            ]
        );
        assert!(text.contains("\nstatus            SUCCEEDED\n"), "{text}");
        assert!(
            text.contains("\nstarted_at        2026-11-30T06:20:50.330042Z\n"),
            "{text}"
        );
        assert!(text.contains("\nfinished_at       -\n"), "{text}");
        assert!(
            text.ends_with("result (UTF-8)    {\"credit_id\":\"cr-981\"}\n"),
            "{text}"
        );
    }

    #[test]
    fn a_result_that_is_not_utf8_is_shown_in_base64_and_control_characters_escaped() {
        let mut e = sample("k", pb::Status::Succeeded);
        e.result = prost::bytes::Bytes::from_static(&[0xff, 0x00, 0x41]);
        e.error = "\u{1b}[31mred".into();
        let text = render_entry(&e);
        assert!(text.contains("result (base64)   /wBB\n"), "{text}");
        assert!(text.contains("\\u{1b}[31mred"), "{text}");
        assert!(!text.contains('\u{1b}'), "{text}");
    }

    #[test]
    fn json_follows_the_proto3_mapping_with_every_field_present() {
        let mut e = sample("k-1", pb::Status::Succeeded);
        e.result = prost::bytes::Bytes::from_static(b"{\"id\":1}");
        e.replay_count = 2;
        let v: serde_json::Value = serde_json::from_str(&entry_json_line(&e)).expect("JSON");
        assert_eq!(v["status"], "STATUS_SUCCEEDED");
        assert_eq!(v["runId"], "run-7f3a");
        assert_eq!(v["replayCount"], "2");
        assert_eq!(v["attempt"], 1);
        assert_eq!(v["result"], "eyJpZCI6MX0=");
        assert_eq!(v["resultText"], "{\"id\":1}");
        assert_eq!(v["startedAt"], "2026-11-30T06:20:50.330042Z");
        assert_eq!(v["finishedAt"], serde_json::Value::Null);
        assert_eq!(v["argumentsJson"], "");
        assert_eq!(v["possibleDoubleEffect"], false);
        assert_eq!(v["holdToken"], "");
        assert_eq!(v["approval"], serde_json::Value::Null);
        assert_eq!(v.as_object().map(serde_json::Map::len), Some(22));
        // Bytes that are not text have no resultText; a status from a newer server is its number.
        e.result = prost::bytes::Bytes::from_static(&[0xff]);
        e.status = 9;
        let v: serde_json::Value = serde_json::from_str(&entry_json_pretty(&e)).expect("JSON");
        assert_eq!(v["resultText"], serde_json::Value::Null);
        assert_eq!(v["status"], 9);
    }
}
