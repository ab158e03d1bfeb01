//! A person's decisions from the command line: `idempotency-ledger approvals` lists the calls
//! awaiting a decision (oldest first, with their arguments as stored and the fingerprint that
//! binds a decision to them), and `approve KEY` / `deny KEY` decide one (Decide), with a token
//! of the approver role. The fingerprint the person saw must be given: a decision binds to the
//! arguments that were shown, never to whatever the key holds now.

use std::fmt::Write as _;
use std::process::ExitCode;

use clap::Args;

use super::client::{Connection, Failure, Output, Session, connect, report};
use super::find::{KeyArgs, Missing, find_entry, missing_message};
use super::inspect::{entry_json_pretty, render_entry};
use crate::grpc::pb;

/// `idempotency-ledger approvals`.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct ApprovalsArgs {
    /// Where the server is.
    #[command(flatten)]
    pub connection: Connection,

    /// Only calls of this tool.
    #[arg(long)]
    pub tool: Option<String>,

    /// Only calls of this run.
    #[arg(long)]
    pub run: Option<String>,
}

/// `idempotency-ledger approve KEY` and `deny KEY`.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct DecideArgs {
    /// Where the server is (the token must have the approver role).
    #[command(flatten)]
    pub connection: Connection,

    /// Which call.
    #[command(flatten)]
    pub key: KeyArgs,

    /// The fingerprint of the arguments you decide about, as `approvals` shows it (its first
    /// 12 hex characters or more): the decision binds to those arguments.
    #[arg(long, value_name = "HEX")]
    pub fingerprint: String,

    /// Why: shown to the agent with a denial, kept with the decision.
    #[arg(long, default_value = "")]
    pub reason: String,

    /// Print the entry as one JSON object, as `entry --json` does.
    #[arg(long)]
    pub json: bool,
}

/// The shortest fingerprint prefix a person may give.
const MIN_FINGERPRINT_PREFIX: usize = 12;

/// Runs `approvals`.
pub async fn approvals(args: ApprovalsArgs) -> ExitCode {
    match list(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => report(&f, &args.connection),
    }
}

/// Runs `approve KEY` (`approve` true) or `deny KEY`.
pub async fn decide(args: DecideArgs, approve: bool) -> ExitCode {
    match decided(&args, approve).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => report(&f, &args.connection),
    }
}

async fn list(args: &ApprovalsArgs) -> Result<(), Failure> {
    let session = connect(&args.connection).await?;
    let mut request = pb::ListEntriesRequest {
        run_id: args.run.clone().unwrap_or_default(),
        tool: args.tool.clone().unwrap_or_default(),
        status: pb::Status::AwaitingApproval.into(),
        page_size: 100,
        ..Default::default()
    };
    let mut out = Output::stdout();
    let mut count = 0;
    let mut approved = 0;
    loop {
        let page = session
            .client()
            .list_entries(session.request(request.clone()))
            .await?
            .into_inner();
        for e in &page.entries {
            out.write(&render_request(e))?;
            if e.approval.as_ref().map(pb::Approval::state) == Some(pb::ApprovalState::Approved) {
                approved += 1;
            } else {
                count += 1;
            }
        }
        if page.next_page_token.is_empty() {
            break;
        }
        request.page_token = page.next_page_token;
    }
    out.write(&match count {
        0 => "no call awaits a decision".to_string(),
        1 => "1 call awaits a decision".to_string(),
        n => format!("{n} calls await a decision"),
    })?;
    out.write(&match approved {
        0 => "\n".to_string(),
        n => format!("; {n} approved, not yet used by the agent\n"),
    })?;
    out.flush()
}

/// One call awaiting a decision, as `approvals` prints it: what it would do, and what to type
/// to decide it.
pub fn render_request(e: &pb::Entry) -> String {
    let time =
        |t: Option<&prost_types::Timestamp>| t.map_or_else(|| "-".into(), ToString::to_string);
    let approval = e.approval.clone().unwrap_or_default();
    let mut text = String::new();
    let run = if e.run_id.is_empty() { "-" } else { &e.run_id };
    if approval.state() == pb::ApprovalState::Approved {
        // Decided already: the agent's next claim acts, until the approval's use-by time.
        let _ = writeln!(
            text,
            "{}  {}  run {run}  APPROVED by {} {}  use by {}",
            e.key,
            e.tool,
            approval.decided_by,
            time(approval.decided_at.as_ref()),
            time(approval.execute_by.as_ref()),
        );
    } else {
        let _ = writeln!(
            text,
            "{}  {}  run {run}  asked {}  decide by {}",
            e.key,
            e.tool,
            time(approval.requested_at.as_ref()),
            time(approval.decide_by.as_ref()),
        );
    }
    let _ = writeln!(
        text,
        "  arguments    {}",
        if e.arguments_json.is_empty() {
            "(not kept: --store-arguments none)"
        } else {
            &e.arguments_json
        }
    );
    let _ = writeln!(
        text,
        "  fingerprint  {}   (approve KEY --fingerprint {})",
        e.fingerprint,
        &e.fingerprint[..MIN_FINGERPRINT_PREFIX.min(e.fingerprint.len())]
    );
    text
}

async fn decided(args: &DecideArgs, approve: bool) -> Result<(), Failure> {
    let given = args.fingerprint.trim().to_ascii_lowercase();
    if given.len() < MIN_FINGERPRINT_PREFIX || !given.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Failure::Usage(format!(
            "--fingerprint: give at least {MIN_FINGERPRINT_PREFIX} hex characters of the \
             fingerprint `approvals` shows"
        )));
    }
    let session = connect(&args.connection).await?;
    let entry = find_entry(&session, &args.key).await?;
    if !entry.fingerprint.starts_with(&given) {
        return Err(Failure::Refused {
            reason: "APPROVAL_MISMATCH",
            message: format!(
                "{} holds other arguments (fingerprint {}) than the ones you decide about \
                 ({given}…); nothing changed. Run `approvals` again and decide what it shows",
                entry.key, entry.fingerprint
            ),
        });
    }
    let after = send(&session, &entry, approve, &args.reason).await?;
    let mut out = Output::stdout();
    if args.json {
        out.write(&entry_json_pretty(&after))?;
        out.write("\n")?;
    } else {
        out.write(&render_entry(&after))?;
    }
    out.flush()
}

/// Sends the decision about `entry` with its fingerprint.
async fn send(
    session: &Session,
    entry: &pb::Entry,
    approve: bool,
    reason: &str,
) -> Result<pb::Entry, Failure> {
    let request = pb::DecideRequest {
        key: entry.key.clone(),
        fingerprint: entry.fingerprint.clone(),
        decision: if approve {
            pb::Decision::Approve
        } else {
            pb::Decision::Deny
        }
        .into(),
        reason: reason.to_string(),
    };
    match session.client().decide(session.request(request)).await {
        Ok(answer) => answer
            .into_inner()
            .entry
            .ok_or_else(|| Failure::Protocol("the server answered Decide without an entry".into())),
        Err(s) if s.code() == tonic::Code::NotFound => {
            Err(Failure::NoEntry(missing_message(&entry.key, Missing::Key)))
        }
        Err(s) => Err(s.into()),
    }
}
