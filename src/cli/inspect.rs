//! Command-line inspection of a running server, for the operator without grpcurl at hand:
//! `idempotency-ledger entries` pages through `ListEntries` and prints a table (or JSON), and
//! `idempotency-ledger entry KEY` prints one `Lookup` answer field by field (or as JSON); KEY
//! may also be a unique key prefix or an `external_ref` ([`super::find`]).
//!
//! It is a plain gRPC client of the service ([`super::client`]): it never opens the store, so
//! it sees exactly what the credential's tenant sees. Printing to stdout is its job; errors go
//! to stderr with the gRPC code, message and `ErrorInfo` reason. Exit statuses: 0 success, 1
//! `entry` of a key there is no entry for, 2 any other failure (as for clap's usage errors).

use std::fmt::Write as _;
use std::process::ExitCode;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use clap::{Args, ValueEnum};
use prost_types::Timestamp;
use serde::Serialize;

use super::client::{Connection, Failure, Output, Session, connect, report};
use super::find::{KeyArgs, find_entry};
use crate::defaults::parse_duration;
use crate::grpc::pb;

/// Longest tool or run id shown in a table cell unless `--wide`.
const NAME_WIDTH: usize = 24;
/// Longest error text shown in a table cell unless `--wide`.
const ERROR_WIDTH: usize = 40;
/// How many characters of the key a table shows unless `--wide`: as many as `external_ref`
/// carries, so the two can be matched by eye.
const KEY_WIDTH: usize = 16;
/// The server's largest page (a larger `page_size` is shortened to it).
const MAX_PAGE_SIZE: u32 = crate::defaults::LIST_MAX_PAGE_SIZE;

/// `idempotency-ledger entries`: the arguments of a listing.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct EntriesArgs {
    /// Where the server is.
    #[command(flatten)]
    pub connection: Connection,

    /// Only entries claimed by this run.
    #[arg(long)]
    pub run: Option<String>,

    /// Only entries of this tool.
    #[arg(long)]
    pub tool: Option<String>,

    /// Only entries in this state (an attempt past its lease counts as `unknown`), in any
    /// case and with or without the proto's `STATUS_` prefix (`failed`, `FAILED`,
    /// `STATUS_FAILED`).
    #[arg(long, value_enum, ignore_case = true)]
    pub status: Option<StatusFilter>,

    /// Only entries whose current attempt started at or after this time: RFC 3339
    /// (`2026-11-30T06:00:00Z`) or a duration ago (`15m`, `24h`, `7d`).
    #[arg(long, value_parser = parse_time_bound)]
    pub since: Option<TimeBound>,

    /// Only entries whose current attempt started before this time: RFC 3339 or a duration ago.
    #[arg(long, value_parser = parse_time_bound)]
    pub until: Option<TimeBound>,

    /// Stop after this many entries (all that match when unset).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub limit: Option<u64>,

    /// Entries asked for per ListEntries call (at most 1000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_PAGE_SIZE)))]
    pub page_size: u32,

    /// Only entries marked as a possible double effect (a finding said an earlier attempt's
    /// effect exists while a later attempt was started). Without it, a table of any listing
    /// starts with those marked entries, if there are any: they need a person first.
    #[arg(long)]
    pub possible_double_effect: bool,

    /// Show whole keys, tools, runs and errors instead of shortening them.
    #[arg(long)]
    pub wide: bool,

    /// Print a JSON array (one entry object a line, proto3 JSON field names) instead of a
    /// table.
    #[arg(long)]
    pub json: bool,
}

/// `idempotency-ledger entry KEY`: the arguments of one lookup.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct EntryArgs {
    /// Where the server is.
    #[command(flatten)]
    pub connection: Connection,

    /// Which entry.
    #[command(flatten)]
    pub key: KeyArgs,

    /// Print one JSON object (proto3 JSON field names) instead of one field a line.
    #[arg(long)]
    pub json: bool,
}

/// An entry state to list (`--status`). Each also answers to its proto name (`STATUS_FAILED`),
/// which is what `entry`, `--json` and grpcurl print; `--status` ignores case.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusFilter {
    /// Claimed, lease not yet expired.
    #[value(alias = "status_attempting")]
    Attempting,
    /// The effect happened; the result is stored.
    #[value(alias = "status_succeeded")]
    Succeeded,
    /// The effect did not happen (retryable or not).
    #[value(alias = "status_failed")]
    Failed,
    /// Nobody knows: reported unknown, or the lease expired without a Complete.
    #[value(alias = "status_unknown")]
    Unknown,
}

impl StatusFilter {
    fn to_pb(self) -> pb::Status {
        match self {
            StatusFilter::Attempting => pb::Status::Attempting,
            StatusFilter::Succeeded => pb::Status::Succeeded,
            StatusFilter::Failed => pb::Status::Failed,
            StatusFilter::Unknown => pb::Status::Unknown,
        }
    }
}

/// A bound of `--since` / `--until`: an instant, or a duration before the command runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeBound {
    /// An RFC 3339 instant.
    At(Timestamp),
    /// That long before now.
    Ago(Duration),
}

impl TimeBound {
    /// The instant this bound means when the command runs at `now`.
    pub fn resolve(self, now: SystemTime) -> Timestamp {
        match self {
            TimeBound::At(t) => t,
            // Far past the epoch reads as the epoch: no entry is older.
            TimeBound::Ago(d) => Timestamp::from(
                now.checked_sub(d)
                    .filter(|t| *t >= SystemTime::UNIX_EPOCH)
                    .unwrap_or(SystemTime::UNIX_EPOCH),
            ),
        }
    }
}

/// Parses `--since` / `--until`: RFC 3339 (`2026-11-30T06:00:00Z`, `2026-11-30T07:00:00+01:00`)
/// or a duration ago with its unit (`90s`, `15m`, `24h`, `7d`).
///
/// # Errors
/// A message naming both accepted forms. A bare number is refused: `2026` is more likely a
/// year cut short than 2026 seconds.
pub fn parse_time_bound(text: &str) -> Result<TimeBound, String> {
    let text = text.trim();
    if let Ok(t) = Timestamp::from_str(text) {
        return Ok(TimeBound::At(t));
    }
    let has_unit = text.chars().any(|c| c.is_ascii_alphabetic());
    match parse_duration(text) {
        Ok(d) if has_unit => Ok(TimeBound::Ago(d)),
        _ => Err(format!(
            "`{text}` is neither an RFC 3339 time (2026-11-30T06:00:00Z) nor a duration ago \
             with its unit (15m, 24h, 7d)"
        )),
    }
}

/// Runs `entries`: lists what the store holds for the token's tenant.
pub async fn entries(args: EntriesArgs) -> ExitCode {
    match list(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => report(&f, &args.connection),
    }
}

/// Runs `entry KEY`: prints one entry.
pub async fn entry(args: EntryArgs) -> ExitCode {
    match show(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => report(&f, &args.connection),
    }
}

async fn list(args: &EntriesArgs) -> Result<(), Failure> {
    let session = connect(&args.connection).await?;
    // Both bounds are fixed once: every page of one listing must carry the same request.
    let now = SystemTime::now();
    let mut request = pb::ListEntriesRequest {
        run_id: args.run.clone().unwrap_or_default(),
        tool: args.tool.clone().unwrap_or_default(),
        status: args
            .status
            .map_or(pb::Status::Unspecified, StatusFilter::to_pb) as i32,
        started_after: args.since.map(|b| b.resolve(now)),
        started_before: args.until.map(|b| b.resolve(now)),
        page_size: 0,
        page_token: String::new(),
        possible_double_effect: args.possible_double_effect,
    };
    let mut out = Output::stdout();
    if !args.json && !args.possible_double_effect {
        out.write(&double_effects_first(&session, args.wide).await?)?;
    }
    let mut rows: Vec<pb::Entry> = Vec::new();
    let mut count: u64 = 0;
    if args.json {
        out.write("[")?;
    }
    // Whether entries beyond --limit match.
    let more = loop {
        let remaining = args.limit.map_or(u64::MAX, |l| l - count);
        let page_size = u64::from(args.page_size).min(remaining);
        request.page_size = i32::try_from(page_size).unwrap_or(i32::MAX);
        let page = session
            .client()
            .list_entries(session.request(request.clone()))
            .await?
            .into_inner();
        let mut entries = page.entries.into_iter();
        for e in entries
            .by_ref()
            .take(usize::try_from(remaining).unwrap_or(usize::MAX))
        {
            if args.json {
                let separator = if count == 0 { "\n" } else { ",\n" };
                out.write(&format!("{separator}{}", entry_json_line(&e)))?;
            } else {
                rows.push(e);
            }
            count += 1;
        }
        let limit_reached = args.limit.is_some_and(|l| count >= l);
        if page.next_page_token.is_empty() {
            break limit_reached && entries.next().is_some();
        }
        if limit_reached {
            break true;
        }
        if page.next_page_token == request.page_token {
            return Err(Failure::Protocol(
                "the server answered the same page token twice".into(),
            ));
        }
        request.page_token = page.next_page_token;
    };
    if args.json {
        out.write(if count == 0 { "]\n" } else { "\n]\n" })?;
    } else {
        let options = TableOptions {
            wide: args.wide,
            show_run: args.run.is_none(),
        };
        out.write(&render_table(&rows, options))?;
        out.write(&count_line(count, more))?;
    }
    out.flush()
}

async fn show(args: &EntryArgs) -> Result<(), Failure> {
    let session = connect(&args.connection).await?;
    let entry = find_entry(&session, &args.key).await?;
    let mut out = Output::stdout();
    if args.json {
        out.write(&entry_json_pretty(&entry))?;
        out.write("\n")?;
    } else {
        let history = history(&session, &entry.key).await?;
        if entry.possible_double_effect {
            out.write(DOUBLE_EFFECT_WARNING)?;
        }
        out.write(&render_entry(&entry))?;
        out.write(&render_history(&history))?;
    }
    out.flush()
}

/// The line that opens what `entry` and `entries` print of an entry marked as a possible
/// double effect.
const DOUBLE_EFFECT_WARNING: &str = "POSSIBLE DOUBLE EFFECT: a finding says an earlier \
    attempt's effect exists while a later attempt was started. Check the outside world by the \
    external_ref, undo what must be undone, then `idempotency-ledger acknowledge KEY --note \
    TEXT`.\n";

/// The history of `key` (Lookup with its history).
async fn history(session: &Session, key: &str) -> Result<Vec<pb::HistoryEvent>, Failure> {
    let request = pb::LookupRequest {
        key: key.to_string(),
        include_history: true,
        ..Default::default()
    };
    Ok(session
        .client()
        .lookup(session.request(request))
        .await?
        .into_inner()
        .history)
}

/// What `entries` prints before its table when any entry of the tenant is marked as a
/// possible double effect: those entries (up to [`DOUBLE_EFFECTS_SHOWN`]), each with its
/// evidence; nothing when there is none.
async fn double_effects_first(session: &Session, wide: bool) -> Result<String, Failure> {
    let request = pb::ListEntriesRequest {
        possible_double_effect: true,
        page_size: DOUBLE_EFFECTS_SHOWN,
        ..Default::default()
    };
    let page = session
        .client()
        .list_entries(session.request(request))
        .await?
        .into_inner();
    if page.entries.is_empty() {
        return Ok(String::new());
    }
    let mut text =
        DOUBLE_EFFECT_WARNING.replace("a finding says", "for each entry below, a finding says");
    text.push_str(&render_table(
        &page.entries,
        TableOptions {
            wide,
            show_run: true,
        },
    ));
    for e in &page.entries {
        for event in history(session, &e.key)
            .await?
            .iter()
            .filter(|ev| ev.kind == "possible_double_effect")
        {
            let _ = writeln!(
                text,
                "  {}  {}",
                if wide {
                    e.key.clone()
                } else {
                    shorten(&e.key, KEY_WIDTH)
                },
                one_line(&event.detail)
            );
        }
    }
    if !page.next_page_token.is_empty() {
        let _ = writeln!(
            text,
            "(more: `entries --possible-double-effect` lists them all)"
        );
    }
    text.push('\n');
    Ok(text)
}

/// How many marked entries `entries` shows before its table.
const DOUBLE_EFFECTS_SHOWN: i32 = 20;

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

// --- rendering -------------------------------------------------------------------------------

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
pub(super) fn status_label(e: &pb::Entry) -> String {
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
fn one_line(text: &str) -> String {
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
fn shorten(text: &str, width: usize) -> String {
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
    fn the_inspection_commands_parse_their_flags_without_any_server_setting() {
        use crate::cli::{Cli, Command};
        use clap::Parser;
        let cli = Cli::parse_from([
            "idempotency-ledger",
            "entries",
            "--server",
            "http://ledger:50051",
            "--run",
            "run-7f3a",
            "--status",
            "failed",
            "--since",
            "24h",
            "--limit",
            "5",
            "--json",
        ]);
        let Some(Command::Entries(args)) = cli.command else {
            panic!("not entries: {:?}", cli.command);
        };
        assert_eq!(args.connection.server, "http://ledger:50051");
        assert_eq!(args.run.as_deref(), Some("run-7f3a"));
        assert_eq!(args.status, Some(StatusFilter::Failed));
        assert_eq!(
            args.since,
            Some(TimeBound::Ago(Duration::from_secs(86_400)))
        );
        assert_eq!(
            (args.limit, args.page_size, args.json),
            (Some(5), 100, true)
        );
        let cli = Cli::parse_from(["idempotency-ledger", "entry", "wf-1:step-2", "--json"]);
        let Some(Command::Entry(args)) = cli.command else {
            panic!("not entry: {:?}", cli.command);
        };
        assert_eq!((args.key.key.text(), args.json), ("wf-1:step-2", true));
        // A page larger than the server's is refused rather than silently shortened.
        assert!(
            Cli::try_parse_from(["idempotency-ledger", "entries", "--page-size", "1001"]).is_err()
        );
        assert!(Cli::try_parse_from(["idempotency-ledger", "entry"]).is_err());
        // A table's shortened key is a prefix; one too short to mean one entry is refused.
        let cli = Cli::parse_from(["idempotency-ledger", "entry", "43ba67c5ba6df15…"]);
        let Some(Command::Entry(args)) = cli.command else {
            panic!("not entry: {:?}", cli.command);
        };
        assert_eq!(args.key.key.text(), "43ba67c5ba6df15");
        assert_eq!(args.key.search_limit, crate::cli::find::SEARCH_LIMIT);
        let refused = Cli::try_parse_from(["idempotency-ledger", "entry", "43b…"])
            .expect_err("too short")
            .to_string();
        assert!(refused.contains("at least 6 characters"), "{refused}");
    }

    #[test]
    fn the_help_of_entry_states_the_prefix_length_and_search_limit_the_code_has() {
        use crate::cli::Cli;
        use crate::cli::find::{MIN_PREFIX_CHARS, SEARCH_LIMIT};
        use clap::CommandFactory;
        let mut command = Cli::command();
        let entry = command.find_subcommand_mut("entry").expect("entry");
        // One space between words: the help is wrapped to the terminal.
        let help = entry
            .render_long_help()
            .to_string()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        assert!(
            help.contains(&format!("at least {MIN_PREFIX_CHARS} characters")),
            "{help}"
        );
        assert!(
            help.contains(&format!("[default: {SEARCH_LIMIT}]")),
            "{help}"
        );
    }

    #[test]
    fn a_status_is_accepted_in_any_case_and_with_its_proto_prefix() {
        use crate::cli::{Cli, Command};
        use clap::Parser;
        let status = |text: &str| match Cli::try_parse_from([
            "idempotency-ledger",
            "entries",
            "--status",
            text,
        ]) {
            Ok(Cli {
                command: Some(Command::Entries(args)),
                ..
            }) => Ok(args.status),
            Ok(other) => panic!("not entries: {other:?}"),
            Err(e) => Err(e.to_string()),
        };
        for text in [
            "failed",
            "Failed",
            "FAILED",
            "STATUS_FAILED",
            "status_failed",
        ] {
            assert_eq!(status(text), Ok(Some(StatusFilter::Failed)), "{text}");
        }
        for (text, want) in [
            ("ATTEMPTING", StatusFilter::Attempting),
            ("Succeeded", StatusFilter::Succeeded),
            ("STATUS_UNKNOWN", StatusFilter::Unknown),
        ] {
            assert_eq!(status(text), Ok(Some(want)), "{text}");
        }
        // Still only the four states: the message lists them.
        for bad in ["STATUS_UNSPECIFIED", "done", "STATUS_"] {
            let refused = status(bad).expect_err(bad);
            assert!(
                refused.contains("attempting, succeeded, failed, unknown"),
                "{refused}"
            );
        }
    }

    #[test]
    fn since_and_until_take_rfc_3339_or_a_duration_ago() {
        assert_eq!(
            parse_time_bound("2026-11-30T06:00:00Z"),
            Ok(TimeBound::At(at("2026-11-30T06:00:00Z")))
        );
        // An offset is the same instant in UTC.
        assert_eq!(
            parse_time_bound("2026-11-30T07:00:00+01:00"),
            Ok(TimeBound::At(at("2026-11-30T06:00:00Z")))
        );
        assert_eq!(
            parse_time_bound("15m"),
            Ok(TimeBound::Ago(Duration::from_secs(900)))
        );
        assert_eq!(
            parse_time_bound("24h"),
            Ok(TimeBound::Ago(Duration::from_secs(86_400)))
        );
        assert_eq!(
            parse_time_bound("7d"),
            Ok(TimeBound::Ago(Duration::from_secs(7 * 86_400)))
        );
        assert_eq!(
            parse_time_bound("500ms"),
            Ok(TimeBound::Ago(Duration::from_millis(500)))
        );
    }

    #[test]
    fn a_bare_number_or_a_malformed_time_is_refused_naming_both_forms() {
        for bad in [
            "2026",
            "900",
            "yesterday",
            "2026-13-01T00:00:00Z",
            "15 minutes",
            "",
        ] {
            let refused = parse_time_bound(bad);
            assert!(refused.is_err(), "{bad:?} was accepted: {refused:?}");
            let message = refused.unwrap_err();
            assert!(
                message.contains("RFC 3339") && message.contains("15m"),
                "{message}"
            );
        }
    }

    #[test]
    fn a_duration_ago_resolves_against_the_time_the_command_runs() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(
            TimeBound::Ago(Duration::from_secs(900)).resolve(now),
            Timestamp {
                seconds: 1_000_000 - 900,
                nanos: 0
            }
        );
        let fixed = at("2026-11-30T06:00:00Z");
        assert_eq!(TimeBound::At(fixed).resolve(now), fixed);
        // Longer ago than the epoch: the epoch.
        assert_eq!(
            TimeBound::Ago(Duration::from_secs(2_000_000)).resolve(now),
            Timestamp::default()
        );
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
