//! The calls awaiting a person's decision: oldest first, each with its tool, its arguments as
//! stored, its run, its age and its deadline; an approver approves or denies each with a
//! reason (the form carries the fingerprint of the arguments it showed, so a decision binds to
//! them); others see the list without the forms.

use super::*;
use crate::domain::{ApprovalState, Decision};
use crate::ledger::DecideInput;

/// The longest reason a form may give (the ledger's bound).
const MAX_REASON_CHARS: usize = crate::ledger::MAX_REASON_BYTES;

pub(super) async fn approvals(who: Who, Query(query): Query<Params>) -> PageResult {
    let first = query.page_token.is_empty();
    let out = listed(&who, Status::AwaitingApproval, query.page_token).await?;
    let (asked, approved): (Vec<&EntryView>, Vec<&EntryView>) = out
        .entries
        .iter()
        .partition(|v| v.entry.approval.state != ApprovalState::Approved);
    let body = html! {
        h1 { "Awaiting approval" }
        p class="lead" {
            "Calls that wait for a person's decision: a tool the approval policy gates, or a \
             call that asked for approval. Nothing was done; the agent was told so. Approve, \
             and the call's next claim acts, once; deny, and every repeat is told why. Oldest \
             first."
        }
        @if who.approver.is_none() {
            div class="card muted" {
                "You are signed in without the approver role: you see the requests, not the \
                 forms that decide them (a token with the approver role decides)."
            }
        }
        @if asked.is_empty() && first {
            div class="card" { b { "No call awaits a decision." } }
        } @else if asked.is_empty() {
            div class="card" { "No more calls awaiting a decision." }
        }
        @for view in asked { (request_card(&who, view)) }
        @if !approved.is_empty() {
            h2 { "Approved, not yet used (" (approved.len()) ")" }
            p class="muted" {
                "The agent's next claim of each acts, once, if it comes before the approval's \
                 use-by time; after it, the approval lapses and the next claim asks again."
            }
            @for view in approved { (approved_card(view, who.now)) }
        }
        (pager("/approvals", &[], &out.next_page_token))
    };
    Ok(respond::html(
        StatusCode::OK,
        who.page("Awaiting approval", Nav::Approvals, body),
    ))
}

/// One request: what the call would do, and (for an approver) the decision's form.
fn request_card(who: &Who, view: &EntryView) -> Markup {
    let (e, now) = (&view.entry, who.now);
    let a = &e.approval;
    let due = a.decide_by.map_or_else(String::new, |by| {
        if by > now {
            format!("in {}", span(by.minus(now)))
        } else {
            "lapsed".to_string()
        }
    });
    html! {
        div class="card request" {
            p {
                b { (e.tool.as_str()) } " · run " span class="mono" { (shorten(e.run_id_str(), 40)) }
                " · asked " (span(now.minus(a.requested_at.unwrap_or(e.started_at)))) " ago by "
                @if e.principal.is_empty() { "(no principal)" } @else { (e.principal.as_str()) }
                " · decide by " (a.decide_by.map_or_else(|| "-".to_string(), time)) " (" (due)
                ") · " (entry_link_mono(e.key.as_str()))
            }
            @match &e.arguments {
                Some(arguments) if !arguments.is_empty() => (shown_html(&shown(arguments.as_bytes()))),
                _ => p class="muted" {
                    "The server keeps no arguments (--store-arguments none): decide from the \
                     tool and the run."
                },
            }
            @if who.approver.is_some() {
                form class="resolve decide" method="post" action="/decide" {
                    (csrf_field(&who.csrf))
                    (hidden_field("key", e.key.as_str()))
                    (hidden_field("fingerprint", &e.fingerprint))
                    label {
                        "Reason (shown to the agent with a denial)"
                        input type="text" name="reason" maxlength=(MAX_REASON_CHARS);
                    }
                    div class="buttons" {
                        button type="submit" name="decision" value="approve" { "Approve" } " "
                        button type="submit" name="decision" value="deny" class="deny" { "Deny" }
                    }
                }
            }
        }
    }
}

/// The link to an entry's page in the cards, in the monospaced face.
fn entry_link_mono(key: &str) -> Markup {
    html! { a class="mono" href=(entry_path(key)) { (shorten(key, 17)) } }
}

/// An approved call the agent has not claimed again yet: who approved it, and until when.
fn approved_card(view: &EntryView, now: Micros) -> Markup {
    let e = &view.entry;
    let a = &e.approval;
    let use_by = a.execute_by.map_or_else(
        || "-".to_string(),
        |by| {
            if by > now {
                format!("{} (in {})", time(by), span(by.minus(now)))
            } else {
                format!("{} (lapsed)", time(by))
            }
        },
    );
    html! {
        div class="card request approved" {
            p {
                b { (e.tool.as_str()) } " · run " span class="mono" { (shorten(e.run_id_str(), 40)) }
                " · approved by " (a.decided_by.as_str())
                @if !a.reason.is_empty() { " (" (a.reason) ")" }
                " · use by " (use_by) " · " (entry_link_mono(e.key.as_str()))
            }
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct DecideForm {
    key: String,
    decision: String,
    fingerprint: String,
    reason: String,
}

pub(super) async fn decide(who: Who, Form(form): Form<DecideForm>) -> PageResult {
    let console = &who.console;
    let Some(approver) = who.approver.clone() else {
        return Err(respond::forbidden(
            "Only a token with the approver role decides: nothing was changed.",
        ));
    };
    let key = form.key.clone();
    let decision = match form.decision.as_str() {
        "approve" => Decision::Approve,
        "deny" => Decision::Deny,
        _ => {
            return Err(bad_request("Choose approve or deny. Nothing was changed."));
        }
    };
    // The key parsed here; refused as the ledger's refusals are, below.
    let out = match Key::parse(&key) {
        Err(e) => Err(LedgerError::from(e)),
        Ok(parsed) => {
            let input = DecideInput {
                key: parsed,
                fingerprint: form.fingerprint,
                decision,
                reason: form.reason.trim().to_string(),
            };
            let ledger = console.ledger().clone();
            let tenant = who.tenant.clone();
            let by = approver.clone();
            // In a task of its own: a browser that goes away does not abandon the write halfway.
            tokio::spawn(async move { ledger.decide(&tenant, input, &by).await })
                .await
                .map_err(|e| failure(&LedgerError::Internal(format!("decision task: {e}"))))?
        }
    };
    let short = shorten(&key, 17);
    let flash = match out {
        Ok(decided) => {
            console
                .metrics()
                .decided(decision, decided.changed, decided.took);
            let tool = decided.entry.entry.tool.to_string();
            match (decision, decided.changed) {
                (Decision::Approve, true) => good(format!(
                    "Approved {tool} ({short}), recorded as decided by {approver}: its next \
                     claim acts, once."
                )),
                (Decision::Deny, true) => good(format!(
                    "Denied {tool} ({short}), recorded as decided by {approver}: every repeat \
                     is told why."
                )),
                (_, false) => good(format!(
                    "{tool} ({short}) was already decided that way; nothing changed."
                )),
            }
        }
        Err(LedgerError::ApprovalMismatch) => bad(format!(
            "{short}'s arguments are not the ones this page showed; nothing was changed."
        )),
        Err(LedgerError::AlreadyDecided(state)) => bad(format!(
            "{short} was already decided ({state}) the other way; nothing was changed."
        )),
        Err(LedgerError::NotAwaitingApproval(why)) => bad(format!(
            "{short} awaits no decision: {why}. Nothing was changed."
        )),
        Err(LedgerError::NotFound) => return Err(failure(&LedgerError::NotFound)),
        Err(LedgerError::InvalidArgument { message, .. }) => {
            return Err(bad_request(&format!("{message}. Nothing was changed.")));
        }
        Err(e) => return Err(failure(&e)),
    };
    console.sessions().flash(&who.id, flash);
    Ok(respond::redirect("/approvals"))
}
