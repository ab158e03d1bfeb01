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

use clap::{Args, ValueEnum};
use prost_types::Timestamp;

use super::client::{Connection, Failure, Output, Session, connect, report};
use super::find::{KeyArgs, find_entry};
use crate::defaults::parse_duration;
use crate::grpc::pb;

mod render;

pub(super) use render::status_label;
use render::{KEY_WIDTH, one_line, shorten};
pub use render::{
    TableOptions, count_line, entry_json_line, entry_json_pretty, render_entry, render_history,
    render_table,
};

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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        Timestamp::from_str(text).expect("RFC 3339")
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
}
