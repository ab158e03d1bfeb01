//! The operator's writes, for what no worker or claimant will do: `idempotency-ledger resolve
//! KEY` settles an outcome nobody knows, and `idempotency-ledger renew KEY` extends the lease
//! of an attempt in flight. Like the inspection commands they are gRPC clients of a running
//! server ([`super::client`]), and KEY takes the same forms as `entry`'s ([`super::find`]).
//!
//! `resolve` settles as a reconciler does, fenced: it takes the entry with `Reconcile(keys =
//! [KEY])` (which hands it out only if its outcome is unknown, past the server's reconcile
//! grace, and no reconciler holds it), then sends its finding with the attempt and the hold
//! token it was handed, with `resolve_only`. The server applies it only if the entry is still
//! at that attempt under that hold, and says per resolution what became of it; `resolve`
//! tells a refusal as a `Complete` would have been refused: `FAILED_PRECONDITION` with the
//! reason `ALREADY_RESOLVED` (another outcome is recorded), `LEASE_NOT_ENDED` (an attempt is
//! still in its lease; its claimant may yet complete it), `HELD` (a reconciler holds it, or
//! its outcome has been unknown for less than the grace) or `STALE` (it moved on meanwhile).

use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgGroup, Args};

use super::client::{Connection, Failure, Output, connect, report};
use super::find::{KeyArgs, Missing, find_entry, missing_message};
use super::inspect::{entry_json_pretty, render_entry, status_label};
use crate::defaults::parse_duration;
use crate::grpc::pb;

/// `idempotency-ledger resolve KEY --succeeded RESULT | --failed ERROR [--retryable]`.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
#[command(group(ArgGroup::new("outcome").required(true).args(["succeeded", "failed"])))]
pub struct ResolveArgs {
    /// Where the server is.
    #[command(flatten)]
    pub connection: Connection,

    /// Which entry.
    #[command(flatten)]
    pub key: KeyArgs,

    /// The effect happened (the tool's own records show it): RESULT, as UTF-8 text, becomes the
    /// stored result that every repeat of the intent gets back.
    #[arg(long, value_name = "RESULT")]
    pub succeeded: Option<String>,

    /// The effect did not happen: ERROR is stored as the failure, permanent (a repeat gets
    /// PREVIOUSLY_FAILED) unless --retryable.
    #[arg(long, value_name = "ERROR")]
    pub failed: Option<String>,

    /// With --failed: the intent may be tried again, so the next Claim of it gets CLAIMED with
    /// attempt + 1 (the usual case when the effect did not happen).
    // Both: clap counts `requires = "failed"` as met by any member of the outcome group.
    #[arg(long, requires = "failed", conflicts_with = "succeeded")]
    pub retryable: bool,

    /// Who resolves, recorded on the entry as `resolved_by` (default: `cli:` and the
    /// operating-system user, from `USER`).
    #[arg(long, env = "LEDGER_PRINCIPAL", value_name = "NAME")]
    pub principal: Option<String>,

    /// Print the resolved entry as one JSON object, as `entry --json` does.
    #[arg(long)]
    pub json: bool,
}

impl ResolveArgs {
    /// The resolution these flags ask for, of `key`.
    fn resolution(&self, key: &str) -> pb::Resolution {
        match (&self.succeeded, &self.failed) {
            (Some(result), _) => pb::Resolution {
                key: key.to_string(),
                status: pb::Status::Succeeded.into(),
                result: result.clone().into_bytes().into(),
                ..Default::default()
            },
            // clap requires one of the two.
            (None, failed) => pb::Resolution {
                key: key.to_string(),
                status: pb::Status::Failed.into(),
                error: failed.clone().unwrap_or_default(),
                retryable: self.retryable,
                ..Default::default()
            },
        }
    }
}

/// `idempotency-ledger renew KEY --claim-token TOKEN [--lease DURATION]`.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct RenewArgs {
    /// Where the server is.
    #[command(flatten)]
    pub connection: Connection,

    /// Which entry.
    #[command(flatten)]
    pub key: KeyArgs,

    /// The claim token the Claim answered with OUTCOME_CLAIMED: only the holder of the current
    /// attempt may renew its lease.
    #[arg(long, value_name = "TOKEN")]
    pub claim_token: String,

    /// The new lease, counted from now (not added to what is left): `90s`, `15m`, `1h`. The
    /// server's default lease when omitted; longer than the server's --max-lease is refused.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub lease: Option<Duration>,

    /// Print the renewed entry as one JSON object, as `entry --json` does, instead of its key
    /// and the new end of its lease.
    #[arg(long)]
    pub json: bool,
}

/// `idempotency-ledger acknowledge KEY --note TEXT`.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct AcknowledgeArgs {
    /// Where the server is.
    #[command(flatten)]
    pub connection: Connection,

    /// Which entry.
    #[command(flatten)]
    pub key: KeyArgs,

    /// What you found or did (the second credit refunded, say), kept in the entry's history.
    /// At most 1 KiB.
    #[arg(long, value_name = "TEXT")]
    pub note: String,

    /// Who acknowledges, recorded with it in the history (default: `cli:` and the
    /// operating-system user, from `USER`).
    #[arg(long, env = "LEDGER_PRINCIPAL", value_name = "NAME")]
    pub principal: Option<String>,

    /// Print the entry as one JSON object, as `entry --json` does.
    #[arg(long)]
    pub json: bool,
}

/// Runs `acknowledge KEY`: clears the mark of a possible double effect.
pub async fn acknowledge(args: AcknowledgeArgs) -> ExitCode {
    match acknowledged(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => report(&f, &args.connection),
    }
}

async fn acknowledged(args: &AcknowledgeArgs) -> Result<(), Failure> {
    let session = connect(&args.connection).await?;
    let entry = find_entry(&session, &args.key).await?;
    let request = pb::AcknowledgeDoubleEffectRequest {
        key: entry.key.clone(),
        note: args.note.clone(),
        principal: args.principal.clone().unwrap_or_else(|| {
            format!(
                "cli:{}",
                std::env::var("USER").unwrap_or_else(|_| "unknown".into())
            )
        }),
    };
    let after = match session
        .client()
        .acknowledge_double_effect(session.request(request))
        .await
    {
        Ok(answer) => answer.into_inner().entry.ok_or_else(|| {
            Failure::Protocol("the server answered AcknowledgeDoubleEffect without an entry".into())
        })?,
        Err(s) if s.code() == tonic::Code::NotFound => {
            return Err(Failure::NoEntry(missing_message(&entry.key, Missing::Key)));
        }
        Err(s) if s.code() == tonic::Code::FailedPrecondition => {
            return Err(Failure::Refused {
                reason: "NOT_MARKED",
                message: format!(
                    "{} is not marked as a possible double effect (never marked, or \
                     acknowledged already); nothing changed",
                    entry.key
                ),
            });
        }
        Err(s) => return Err(s.into()),
    };
    let mut out = Output::stdout();
    if args.json {
        out.write(&entry_json_pretty(&after))?;
        out.write("\n")?;
    } else {
        out.write(&render_entry(&after))?;
    }
    out.flush()
}

/// Runs `resolve KEY`: records what the outside world says about an unknown outcome.
pub async fn resolve(args: ResolveArgs) -> ExitCode {
    match settle(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => report(&f, &args.connection),
    }
}

/// Runs `renew KEY`: extends the lease of an attempt in flight.
pub async fn renew(args: RenewArgs) -> ExitCode {
    match extend(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => report(&f, &args.connection),
    }
}

async fn settle(args: &ResolveArgs) -> Result<(), Failure> {
    let session = connect(&args.connection).await?;
    let before = find_entry(&session, &args.key).await?;
    let mut asked = args.resolution(&before.key);
    if records(&before, &asked) {
        // Like a repeated Complete: a success that changes nothing, and says so.
        eprintln_note(&format!(
            "{} was already resolved with this outcome: nothing changed",
            before.key
        ));
        return print_entry(args, &before);
    }
    // Refused before anything is held, as a Complete would have been.
    if let Some(refused) = refusal(&before) {
        return Err(refused);
    }
    let principal = args.principal.clone().unwrap_or_else(|| {
        format!(
            "cli:{}",
            std::env::var("USER").unwrap_or_else(|_| "unknown".into())
        )
    });
    // Take the entry, as a reconciler would: the finding is about the attempt it was handed.
    let take = pb::ReconcileRequest {
        keys: vec![before.key.clone()],
        limit: 1,
        principal: principal.clone(),
        ..Default::default()
    };
    let taken = session
        .client()
        .reconcile(session.request(take))
        .await?
        .into_inner();
    let Some(held) = taken.pending.into_iter().find(|e| e.key == before.key) else {
        return Err(Failure::Refused {
            reason: "HELD",
            message: format!(
                "{} was not handed out: a reconciler holds it, or its outcome has been unknown \
                 for less than the server's --reconcile-grace (an action may still be landing); \
                 nothing changed. Try again shortly",
                before.key
            ),
        });
    };
    asked.attempt = held.attempt;
    asked.hold_token = held.hold_token.clone();
    let request = pb::ReconcileRequest {
        resolutions: vec![asked.clone()],
        resolve_only: true,
        principal,
        ..Default::default()
    };
    let answer = session
        .client()
        .reconcile(session.request(request))
        .await?
        .into_inner();
    let result = answer
        .results
        .into_iter()
        .find(|r| r.key == before.key)
        .ok_or_else(|| {
            Failure::Protocol("the server answered the resolution without its result".into())
        })?;
    let after = match (pb::ResolutionOutcome::try_from(result.result), result.entry) {
        (Ok(pb::ResolutionOutcome::ResolutionNotFound), _) | (_, None) => {
            return Err(Failure::NoEntry(missing_message(&before.key, Missing::Key)));
        }
        (Ok(pb::ResolutionOutcome::ResolutionApplied), Some(after)) => after,
        (Ok(pb::ResolutionOutcome::ResolutionStale), Some(_)) => {
            return Err(Failure::Refused {
                reason: "STALE",
                message: format!(
                    "{} moved on while this was being resolved ({}); nothing changed, and \
                     the finding was kept in its history (`entry` shows it)",
                    before.key, result.note
                ),
            });
        }
        (_, Some(after)) => {
            judge(&before, &after, &asked)?;
            after
        }
    };
    // Reconcile answers about outcomes, without the arguments kept for audit; they are those
    // of the same key that Lookup showed, so the entry prints as `entry` prints it.
    let after = pb::Entry {
        arguments_json: before.arguments_json,
        ..after
    };
    print_entry(args, &after)
}

/// Prints the entry `resolve` ends with, as `entry` does.
fn print_entry(args: &ResolveArgs, entry: &pb::Entry) -> Result<(), Failure> {
    let mut out = Output::stdout();
    if args.json {
        out.write(&entry_json_pretty(entry))?;
        out.write("\n")?;
    } else {
        out.write(&render_entry(entry))?;
    }
    out.flush()
}

async fn extend(args: &RenewArgs) -> Result<(), Failure> {
    let session = connect(&args.connection).await?;
    let entry = find_entry(&session, &args.key).await?;
    let lease = args
        .lease
        .map(prost_types::Duration::try_from)
        .transpose()
        .map_err(|e| Failure::Usage(format!("--lease: {e}")))?;
    let request = pb::RenewLeaseRequest {
        key: entry.key.clone(),
        claim_token: args.claim_token.clone(),
        lease,
    };
    let renewed = match session.client().renew_lease(session.request(request)).await {
        Ok(answer) => answer.into_inner().entry.ok_or_else(|| {
            Failure::Protocol("the server answered RenewLease without an entry".into())
        })?,
        Err(s) if s.code() == tonic::Code::NotFound => {
            return Err(Failure::NoEntry(missing_message(&entry.key, Missing::Key)));
        }
        Err(s) => return Err(s.into()),
    };
    let mut out = Output::stdout();
    if args.json {
        out.write(&entry_json_pretty(&renewed))?;
        out.write("\n")?;
    } else {
        out.write(&render_lease(&renewed))?;
    }
    out.flush()
}

/// What `renew` prints: the key and the new end of the lease, as `entry` prints those fields.
pub fn render_lease(e: &pb::Entry) -> String {
    let until = e
        .lease_expires_at
        .as_ref()
        .map_or_else(|| "-".to_string(), ToString::to_string);
    format!("key               {}\nlease_expires_at  {until}\n", e.key)
}

/// How a resolution went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settled {
    /// This call recorded it.
    Now,
    /// The entry already recorded exactly this outcome before the call.
    Already,
}

/// Compares the entry Reconcile answered (`after`) with the resolution asked for.
///
/// # Errors
/// `ALREADY_RESOLVED` when another outcome is recorded; `LEASE_NOT_ENDED` when the attempt is
/// still in its lease; a protocol failure when the server left the outcome unknown.
fn judge(
    before: &pb::Entry,
    after: &pb::Entry,
    asked: &pb::Resolution,
) -> Result<Settled, Failure> {
    if records(after, asked) {
        return Ok(if records(before, asked) {
            Settled::Already
        } else {
            Settled::Now
        });
    }
    Err(refusal(after).unwrap_or_else(|| {
        Failure::Protocol(format!(
            "the server answered the resolution of {} with the entry still {}",
            after.key,
            status_label(after)
        ))
    }))
}

/// Why an entry as it stands cannot be resolved, told as a Complete would be refused: another
/// outcome recorded, or an attempt still in its lease. `None` for an unknown outcome.
fn refusal(after: &pb::Entry) -> Option<Failure> {
    let time =
        |t: Option<&prost_types::Timestamp>| t.map_or_else(|| "-".into(), ToString::to_string);
    match pb::Status::try_from(after.status) {
        Ok(pb::Status::Succeeded | pb::Status::Failed) => Some(Failure::Refused {
            reason: "ALREADY_RESOLVED",
            message: format!(
                "{} is already resolved as {} (at {}) with a different outcome; nothing \
                 changed (`entry` shows it)",
                after.key,
                status_label(after),
                time(after.finished_at.as_ref()),
            ),
        }),
        Ok(pb::Status::Attempting) => Some(Failure::Refused {
            reason: "LEASE_NOT_ENDED",
            message: format!(
                "{} is ATTEMPTING: its claimant holds the lease until {} and may still \
                 complete it; nothing changed. Resolve it once the lease has ended (it then \
                 reads UNKNOWN)",
                after.key,
                time(after.lease_expires_at.as_ref()),
            ),
        }),
        _ => None,
    }
}

/// Whether `entry` records exactly the outcome `asked` describes.
fn records(entry: &pb::Entry, asked: &pb::Resolution) -> bool {
    entry.status == asked.status
        && entry.result == asked.result
        && entry.error == asked.error
        && entry.retryable == asked.retryable
}

/// A line on stderr that is not an error.
fn eprintln_note(text: &str) {
    use std::io::Write as _;
    // Nothing better can be done if stderr itself is gone.
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<Command, String> {
        let mut all = vec!["idempotency-ledger"];
        all.extend(args);
        match Cli::try_parse_from(all) {
            Ok(cli) => cli.command.ok_or_else(|| "no command".to_string()),
            Err(e) => Err(e.to_string()),
        }
    }

    fn resolution_of(args: &[&str]) -> pb::Resolution {
        match parse(args) {
            Ok(Command::Resolve(r)) => r.resolution("k"),
            other => panic!("not resolve: {other:?}"),
        }
    }

    fn entry(status: pb::Status) -> pb::Entry {
        pb::Entry {
            key: "wf-1:step-2".into(),
            status: status.into(),
            ..Default::default()
        }
    }

    #[test]
    fn resolve_takes_exactly_one_outcome() {
        let found = resolution_of(&["resolve", "wf-1:step-2", "--succeeded", "{\"id\":7}"]);
        assert_eq!(found.status(), pb::Status::Succeeded);
        assert_eq!(&found.result[..], b"{\"id\":7}");
        assert!(!found.retryable && found.error.is_empty());
        let missing = resolution_of(&["resolve", "k-1", "--failed", "no such sms", "--retryable"]);
        assert_eq!(missing.status(), pb::Status::Failed);
        assert_eq!(
            (missing.error.as_str(), missing.retryable),
            ("no such sms", true)
        );
        assert!(missing.result.is_empty());
        assert!(!resolution_of(&["resolve", "k-1", "--failed", "gone"]).retryable);
        for refused in [
            vec!["resolve", "k-1"],
            vec!["resolve", "k-1", "--succeeded", "{}", "--failed", "x"],
            vec!["resolve", "k-1", "--succeeded", "{}", "--retryable"],
            vec!["resolve", "--failed", "x"],
        ] {
            assert!(parse(&refused).is_err(), "{refused:?}");
        }
    }

    #[test]
    fn renew_needs_the_claim_token_and_takes_a_duration() {
        let Ok(Command::Renew(args)) = parse(&[
            "renew",
            "wf-1:step-2",
            "--claim-token",
            "0a1b",
            "--lease",
            "15m",
        ]) else {
            panic!("not renew");
        };
        assert_eq!(args.claim_token, "0a1b");
        assert_eq!(args.lease, Some(Duration::from_secs(900)));
        let Ok(Command::Renew(args)) = parse(&["renew", "k-1", "--claim-token", "t"]) else {
            panic!("not renew");
        };
        assert_eq!(args.lease, None);
        assert!(parse(&["renew", "k-1"]).is_err());
        assert!(parse(&["renew", "k-1", "--claim-token", "t", "--lease", "soon"]).is_err());
    }

    #[test]
    fn a_resolution_is_judged_by_the_entry_the_server_answered() {
        let unknown = entry(pb::Status::Unknown);
        let asked = pb::Resolution {
            key: unknown.key.clone(),
            status: pb::Status::Succeeded.into(),
            result: b"{}".to_vec().into(),
            ..Default::default()
        };
        let mut succeeded = entry(pb::Status::Succeeded);
        succeeded.result = b"{}".to_vec().into();
        assert_eq!(judge(&unknown, &succeeded, &asked).ok(), Some(Settled::Now));
        assert_eq!(
            judge(&succeeded, &succeeded, &asked).ok(),
            Some(Settled::Already)
        );
        // Another result, or a failure, is another outcome.
        let mut other = succeeded.clone();
        other.result = b"{\"id\":1}".to_vec().into();
        let mut failed = entry(pb::Status::Failed);
        failed.retryable = true;
        for stands in [other, failed] {
            match judge(&unknown, &stands, &asked) {
                Err(Failure::Refused { reason, message }) => {
                    assert_eq!(reason, "ALREADY_RESOLVED");
                    assert!(message.contains("nothing changed"), "{message}");
                }
                other => panic!("{other:?}"),
            }
        }
        let mut attempting = entry(pb::Status::Attempting);
        attempting.lease_expires_at = Some(prost_types::Timestamp {
            seconds: 1_800_000_000,
            nanos: 0,
        });
        match judge(&attempting, &attempting, &asked) {
            Err(Failure::Refused { reason, message }) => {
                assert_eq!(reason, "LEASE_NOT_ENDED");
                assert!(message.contains("until 2027-01-15T08:00:00Z"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            judge(&unknown, &unknown, &asked),
            Err(Failure::Protocol(_))
        ));
    }

    #[test]
    fn renew_prints_the_key_and_the_new_end_of_the_lease() {
        let mut e = entry(pb::Status::Attempting);
        e.lease_expires_at = Some(prost_types::Timestamp {
            seconds: 1_800_000_000,
            nanos: 5_000,
        });
        assert_eq!(
            render_lease(&e),
            "key               wf-1:step-2\nlease_expires_at  2027-01-15T08:00:00.000005Z\n"
        );
    }
}
