//! The command line: `serve` (the default) and `migrate` with the server's settings
//! ([`crate::server::Settings`]), and the commands that are clients of a running server
//! ([`client`]): the inspection commands ([`inspect`]) print what it holds, and the operator's
//! writes ([`operate`]) settle an unknown outcome or extend a lease. Those that take a KEY find
//! the entry by its key, a unique key prefix or its external_ref ([`find`]).

pub mod client;
pub mod find;
pub mod inspect;
pub mod operate;

use clap::{Parser, Subcommand};

use crate::server::Settings;

/// An idempotency ledger for AI agents' tool calls: claim a key before acting, complete it with
/// the result, and get the stored result back on a repeat.
#[derive(Parser, Debug, Clone)]
#[command(name = "idempotency-ledger", version, about, long_about = None)]
pub struct Cli {
    /// What to do; `serve` when omitted.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The server's settings (`serve` and `migrate`; the inspection commands ignore them).
    #[command(flatten, next_help_heading = "Server settings (serve, migrate)")]
    pub settings: Settings,
}

/// The subcommands.
#[derive(Subcommand, Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Run the gRPC server (the default). Migrations run first.
    Serve,
    /// Apply the database migrations and exit.
    Migrate,
    /// List a running server's entries (ListEntries) as a table, or JSON with --json. A client
    /// of the server: the server's settings do not apply.
    Entries(inspect::EntriesArgs),
    /// Print one entry of a running server (Lookup by key, or found by a unique key prefix or
    /// its external_ref), one field a line, or JSON with --json. Exits 1 when there is no such
    /// entry.
    Entry(inspect::EntryArgs),
    /// Settle an entry whose outcome nobody knows (UNKNOWN, or ATTEMPTING past its lease) with
    /// what the outside world says: --succeeded RESULT, or --failed ERROR [--retryable]. One
    /// Reconcile call that hands out nothing. Prints the resolved entry as `entry` does; exits 1
    /// when there is no such entry, 2 when it cannot be resolved (another outcome recorded, an
    /// attempt still in its lease).
    Resolve(operate::ResolveArgs),
    /// Extend the lease of an attempt in flight (RenewLease) with its claim token, so that a
    /// duplicate keeps getting IN_PROGRESS instead of UNKNOWN. Prints the new end of the lease.
    Renew(operate::RenewArgs),
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::observe::telemetry::LogFormat;

    #[test]
    fn serve_is_the_default_subcommand_and_flags_work_on_either_side() {
        let cli = Cli::parse_from(["idempotency-ledger", "--max-wait", "5s"]);
        assert_eq!(cli.command, None);
        assert_eq!(cli.settings.max_wait, Duration::from_secs(5));
        let cli = Cli::parse_from([
            "idempotency-ledger",
            "migrate",
            "--database-url",
            "sqlite://x.db",
        ]);
        assert_eq!(cli.command, Some(Command::Migrate));
        assert_eq!(cli.settings.database_url, "sqlite://x.db");
    }

    #[test]
    fn the_log_format_is_text_unless_json_is_asked_for() {
        assert_eq!(
            crate::server::Settings::defaults().log_format,
            LogFormat::Text
        );
        let cli = Cli::parse_from(["idempotency-ledger", "--log-format", "json"]);
        assert_eq!(cli.settings.log_format, LogFormat::Json);
        assert!(Cli::try_parse_from(["idempotency-ledger", "--log-format", "xml"]).is_err());
    }

    #[test]
    fn a_default_above_its_maximum_is_refused() {
        let cli = Cli::parse_from(["idempotency-ledger", "--default-lease", "2h"]);
        assert!(cli.settings.validate().is_err());
    }
}
