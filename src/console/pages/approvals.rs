//! The calls awaiting a person's decision: oldest first, each with its tool, its arguments as
//! stored, its run, its age and its deadline; an approver approves or denies each with a
//! reason (the form carries the fingerprint of the arguments it showed, so a decision binds to
//! them); others see the list without the forms.

use super::*;
use crate::domain::{ApprovalState, Decision};
use crate::ledger::DecideInput;

/// The longest reason a form may give (the ledger's bound).
const MAX_REASON_CHARS: usize = crate::ledger::MAX_REASON_BYTES;

pub(super) async fn approvals(console: &Console, call: &Call, who: &Who) -> PageResult {
    let input = ListInput {
        status: Some(Status::AwaitingApproval),
        page_size: PAGE_SIZE,
        page_token: call.query.get("page_token").to_string(),
        ..ListInput::default()
    };
    let page_token = input.page_token.clone();
    let out = console
        .ledger()
        .list_entries(&who.tenant, input)
        .await
        .map_err(|e| failure(&e))?;
    let mut body = String::from("<h1>Awaiting approval</h1>");
    body.push_str(
        "<p class=\"lead\">Calls that wait for a person's decision: a tool the approval \
         policy gates, or a call that asked for approval. Nothing was done; the agent was told \
         so. Approve, and the call's next claim acts, once; deny, and every repeat is told why. \
         Oldest first.</p>",
    );
    if who.approver.is_none() {
        body.push_str(
            "<div class=\"card muted\">You are signed in without the approver role: you see \
             the requests, not the forms that decide them (a token with the approver role \
             decides).</div>",
        );
    }
    let (asked, approved): (Vec<&EntryView>, Vec<&EntryView>) = out
        .entries
        .iter()
        .partition(|v| v.entry.approval.state != ApprovalState::Approved);
    if asked.is_empty() {
        body.push_str(if page_token.is_empty() {
            "<div class=\"card\"><b>No call awaits a decision.</b></div>"
        } else {
            "<div class=\"card\">No more calls awaiting a decision.</div>"
        });
    }
    for view in asked {
        body.push_str(&request_card(who, view, call.now));
    }
    if !approved.is_empty() {
        let _ = write!(
            body,
            "<h2>Approved, not yet used ({})</h2><p class=\"muted\">The agent's next claim of \
             each acts, once, if it comes before the approval's use-by time; after it, the \
             approval lapses and the next claim asks again.</p>",
            approved.len()
        );
        for view in approved {
            body.push_str(&approved_card(view, call.now));
        }
    }
    if !out.next_page_token.is_empty() {
        let _ = write!(
            body,
            "<p class=\"pager\"><a href=\"/approvals{}\">Next {PAGE_SIZE} →</a></p>",
            query(&[("page_token", &out.next_page_token)])
        );
    }
    Ok(respond::html(
        StatusCode::OK,
        who.page("Awaiting approval", Nav::Approvals, &body),
    ))
}

/// One request: what the call would do, and (for an approver) the decision's form.
fn request_card(who: &Who, view: &EntryView, now: Micros) -> String {
    let e = &view.entry;
    let a = &e.approval;
    let at = |m: Option<Micros>| m.map_or_else(|| "-".to_string(), time);
    let due = a.decide_by.map_or_else(String::new, |by| {
        if by > now {
            format!("in {}", span(by.minus(now)))
        } else {
            "lapsed".to_string()
        }
    });
    let mut html = format!(
        "<div class=\"card request\"><p><b>{tool}</b> · run <span class=\"mono\">{run}</span> \
         · asked {age} ago by {who} · decide by {by} ({due}) · \
         <a class=\"mono\" href=\"{href}\">{short}</a></p>",
        tool = esc(e.tool.as_str()),
        run = esc(&shorten(e.run_id_str(), 40)),
        age = esc(&span(now.minus(a.requested_at.unwrap_or(e.started_at)))),
        who = esc(if e.principal.is_empty() {
            "(no principal)"
        } else {
            e.principal.as_str()
        }),
        by = esc(&at(a.decide_by)),
        due = esc(&due),
        href = entry_href(e.key.as_str()),
        short = esc(&shorten(e.key.as_str(), 17)),
    );
    match &e.arguments {
        Some(arguments) if !arguments.is_empty() => {
            html.push_str(&shown_html(&shown(arguments.as_bytes())));
        }
        _ => html.push_str(
            "<p class=\"muted\">The server keeps no arguments (--store-arguments none): \
             decide from the tool and the run.</p>",
        ),
    }
    if who.approver.is_some() {
        let _ = write!(
            html,
            "<form class=\"resolve decide\" method=\"post\" action=\"/decide\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
             <input type=\"hidden\" name=\"key\" value=\"{key}\">\
             <input type=\"hidden\" name=\"fingerprint\" value=\"{fingerprint}\">\
             <label>Reason (shown to the agent with a denial)<input type=\"text\" \
             name=\"reason\" maxlength=\"{max}\"></label>\
             <div class=\"buttons\"><button type=\"submit\" name=\"decision\" \
             value=\"approve\">Approve</button> <button type=\"submit\" name=\"decision\" \
             value=\"deny\" class=\"deny\">Deny</button></div></form>",
            csrf = esc(&who.csrf),
            key = esc(e.key.as_str()),
            fingerprint = esc(&e.fingerprint),
            max = MAX_REASON_CHARS,
        );
    }
    html.push_str("</div>");
    html
}

/// An approved call the agent has not claimed again yet: who approved it, and until when.
fn approved_card(view: &EntryView, now: Micros) -> String {
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
    format!(
        "<div class=\"card request approved\"><p><b>{tool}</b> · run <span class=\"mono\">{run}\
         </span> · approved by {by}{why} · use by {use_by} · <a class=\"mono\" href=\"{href}\">\
         {short}</a></p></div>",
        tool = esc(e.tool.as_str()),
        run = esc(&shorten(e.run_id_str(), 40)),
        by = esc(a.decided_by.as_str()),
        why = if a.reason.is_empty() {
            String::new()
        } else {
            format!(" ({})", esc(&a.reason))
        },
        use_by = esc(&use_by),
        href = entry_href(e.key.as_str()),
        short = esc(&shorten(e.key.as_str(), 17)),
    )
}

pub(super) async fn decide(console: &Console, call: &Call, who: &Who) -> PageResult {
    let Some(approver) = who.approver.clone() else {
        return Err(Box::new(respond::forbidden(
            "Only a token with the approver role decides: nothing was changed.",
        )));
    };
    let key = call.form.get("key").to_string();
    let decision = match call.form.get("decision") {
        "approve" => Decision::Approve,
        "deny" => Decision::Deny,
        _ => {
            return Err(Box::new(respond::plain(
                StatusCode::BAD_REQUEST,
                "Choose approve or deny. Nothing was changed.",
            )));
        }
    };
    let input = DecideInput {
        key: key.clone(),
        fingerprint: call.form.get("fingerprint").to_string(),
        decision,
        reason: call.form.get("reason").trim().to_string(),
    };
    let ledger = console.ledger().clone();
    let tenant = who.tenant.clone();
    let by = approver.clone();
    // In a task of its own: a browser that goes away does not abandon the write halfway.
    let out = tokio::spawn(async move { ledger.decide(&tenant, input, &by).await })
        .await
        .map_err(|e| failure(&LedgerError::Internal(format!("decision task: {e}"))))?;
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
            return Err(Box::new(respond::plain(
                StatusCode::BAD_REQUEST,
                &format!("{message}. Nothing was changed."),
            )));
        }
        Err(e) => return Err(failure(&e)),
    };
    console.sessions().flash(&who.id, flash);
    Ok(respond::redirect("/approvals"))
}
