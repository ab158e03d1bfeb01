//! The command line: `serve` (the default) and `migrate`, each with the server's settings
//! ([`crate::server::Settings`], also taken without a subcommand), and the commands that are clients of a running server
//! ([`client`]): the inspection commands ([`inspect`]) print what it holds, and the operator's
//! writes ([`operate`]) settle an unknown outcome, extend a lease, or acknowledge a possible
//! double effect. Those that take a KEY find
//! the entry by its key, a unique key prefix or its external_ref ([`find`]).

pub mod approve;
pub mod client;
pub mod find;
pub mod inspect;
pub mod operate;

use clap::{Parser, Subcommand};

use crate::server::Settings;

/// An idempotency ledger for AI agents' tool calls: claim a key before acting, complete it with
/// the result, and get the stored result back on a repeat.
///
/// Without a subcommand it runs the server (`serve`), with the settings below; the other
/// subcommands take only their own flags (`idempotency-ledger entries --help`).
#[derive(Parser, Debug, Clone)]
#[command(
    name = "idempotency-ledger",
    version,
    about,
    long_about = None,
    // A setting before a subcommand would be silently ignored by it: refused instead
    // (`idempotency-ledger --listen X migrate`), since each subcommand reads its own flags.
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    /// What to do; `serve` when omitted.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The server's settings when no subcommand is named (`idempotency-ledger --listen ADDR`
    /// is `idempotency-ledger serve --listen ADDR`).
    #[command(flatten, next_help_heading = "Server settings (serve)")]
    pub settings: Settings,
}

impl Cli {
    /// The command to run: the one named, or `serve` with the settings given without one.
    pub fn into_command(self) -> Command {
        self.command.unwrap_or(Command::Serve(self.settings))
    }
}

/// The subcommands.
#[derive(Subcommand, Debug, Clone)]
pub enum Command {
    /// Run the gRPC server (the default). Migrations run first.
    Serve(Settings),
    /// Apply the database migrations and exit. Takes the server's settings: those of the store
    /// (--database-url, --postgres-pooler, --migrations-database-url, the --db-* settings) and
    /// --log-format apply, the others are accepted and ignored.
    Migrate(Settings),
    /// List a running server's entries (ListEntries) as a table, or JSON with --json. A client
    /// of the server: the server's settings do not apply.
    Entries(inspect::EntriesArgs),
    /// Print one entry of a running server (Lookup by key, or found by a unique key prefix or
    /// its external_ref), one field a line, or JSON with --json. Exits 1 when there is no such
    /// entry.
    Entry(inspect::EntryArgs),
    /// Settle an entry whose outcome nobody knows (UNKNOWN, or ATTEMPTING past its lease) with
    /// what the outside world says: --succeeded RESULT, or --failed ERROR [--retryable]. Takes
    /// the entry as a reconciler would (Reconcile with its key) and sends the finding with the
    /// attempt and hold it was handed, so it settles that attempt only. Prints the resolved
    /// entry as `entry` does; exits 1 when there is no such entry, 2 when it cannot be resolved
    /// (another outcome recorded, an attempt still in its lease, a reconciler holds it or it
    /// has been unknown for less than the server's reconcile grace, or it moved on meanwhile).
    Resolve(operate::ResolveArgs),
    /// Extend the lease of an attempt in flight (RenewLease) with its claim token, so that a
    /// duplicate keeps getting IN_PROGRESS instead of UNKNOWN. Prints the new end of the lease.
    Renew(operate::RenewArgs),
    /// Acknowledge an entry marked as a possible double effect, once a person has dealt with
    /// it (AcknowledgeDoubleEffect): the mark is cleared, and the note kept in its history.
    /// Prints the entry as `entry` does; exits 1 when there is no such entry, 2 when it carries
    /// no mark.
    Acknowledge(operate::AcknowledgeArgs),
    /// List the calls awaiting a person's decision, oldest first, with their arguments as
    /// stored and the fingerprint a decision must name.
    Approvals(approve::ApprovalsArgs),
    /// Approve a call awaiting a decision (Decide), with a token of the approver role: its
    /// next claim acts, once. --fingerprint binds the approval to the arguments you saw.
    Approve(approve::DecideArgs),
    /// Deny a call awaiting a decision (Decide), with a token of the approver role: every
    /// repeat is told the --reason. --fingerprint binds it to the arguments you saw.
    Deny(approve::DecideArgs),
    /// Run the MCP gateway in front of an MCP server: `idempotency-ledger mcp [OPTIONS] --
    /// COMMAND [ARGS…]` (stdio). Each side-effecting tools/call acts once per intent; a repeat
    /// gets the stored result with the ledger's note; an outcome nobody knows is never sent
    /// again.
    Mcp(crate::mcp::McpArgs),
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::observe::telemetry::LogFormat;

    /// The settings of the command `args` runs, which must be `serve` or `migrate`.
    fn settings_of(args: &[&str]) -> (&'static str, Settings) {
        match Cli::try_parse_from(args).map(Cli::into_command) {
            Ok(Command::Serve(settings)) => ("serve", settings),
            Ok(Command::Migrate(settings)) => ("migrate", settings),
            other => panic!("{args:?}: {other:?}"),
        }
    }

    #[test]
    fn serve_is_the_default_subcommand_and_each_server_command_reads_its_own_flags() {
        let (command, settings) = settings_of(&["idempotency-ledger", "--max-wait", "5s"]);
        assert_eq!(command, "serve");
        assert_eq!(settings.max_wait, Duration::from_secs(5));
        let (command, settings) = settings_of(&["idempotency-ledger", "serve", "--max-wait", "5s"]);
        assert_eq!(command, "serve");
        assert_eq!(settings.max_wait, Duration::from_secs(5));
        let (command, settings) = settings_of(&[
            "idempotency-ledger",
            "migrate",
            "--database-url",
            "sqlite://x.db",
        ]);
        assert_eq!(command, "migrate");
        assert_eq!(settings.database_url, "sqlite://x.db");
        // A setting before the subcommand is not silently dropped: it is refused.
        assert!(
            Cli::try_parse_from(["idempotency-ledger", "--max-wait", "5s", "migrate"]).is_err()
        );
    }

    #[test]
    fn the_operator_commands_take_no_server_setting() {
        for command in [
            "entries",
            "entry",
            "resolve",
            "renew",
            "acknowledge",
            "approvals",
            "approve",
            "deny",
        ] {
            let refused = Cli::try_parse_from(["idempotency-ledger", command, "--listen", "x"])
                .expect_err("a server flag")
                .to_string();
            assert!(refused.contains("--listen"), "{command}: {refused}");
        }
        // None of the server's flags is global, so none reaches a subcommand it does not
        // belong to (a merged flag marked `global = true` would show on `entries --help`).
        use clap::CommandFactory;
        let cli = Cli::command();
        let global: Vec<_> = cli
            .get_arguments()
            .filter(|a| a.is_global_set())
            .map(|a| a.get_id().to_string())
            .collect();
        assert!(global.is_empty(), "global flags: {global:?}");
    }

    #[test]
    fn the_log_format_is_text_unless_json_is_asked_for() {
        assert_eq!(
            crate::server::Settings::defaults().log_format,
            LogFormat::Text
        );
        let (_, settings) = settings_of(&["idempotency-ledger", "--log-format", "json"]);
        assert_eq!(settings.log_format, LogFormat::Json);
        assert!(Cli::try_parse_from(["idempotency-ledger", "--log-format", "xml"]).is_err());
    }

    #[test]
    fn a_default_above_its_maximum_is_refused() {
        let (_, settings) = settings_of(&["idempotency-ledger", "--default-lease", "2h"]);
        assert!(settings.validate().is_err());
    }
}
