//! One entry's page: every field, its arguments and result as stored, its timeline.

use super::*;
use crate::domain::{EventKind, HistoryEvent};

// ---- one entry ---------------------------------------------------------------------------

pub(super) async fn entry(console: &Console, call: &Call, who: &Who) -> PageResult {
    let key = call.query.get("key");
    let view = match console
        .ledger()
        .lookup(&who.tenant, LookupInput::by_key(key))
        .await
    {
        Ok(view) => view,
        Err(LedgerError::NotFound | LedgerError::InvalidArgument { .. }) => {
            let body = format!(
                "<h1>No such entry</h1><p>{}</p>",
                esc(&missing_message(key, crate::ledger::find::Missing::Key))
            );
            return Ok(respond::html(
                StatusCode::NOT_FOUND,
                who.page("No such entry", Nav::Entries, &body),
            ));
        }
        Err(e) => return Err(failure(&e)),
    };
    let e = &view.entry;
    let mut body = format!(
        "<h1>Entry {} {}</h1><p class=\"lead mono\">{}</p>",
        esc(&shorten(e.key.as_str(), 17)),
        status_badge(view.status),
        esc(e.key.as_str())
    );
    let history = console
        .ledger()
        .history(&who.tenant, &e.key)
        .await
        .map_err(|e| failure(&e))?;
    if e.possible_double_effect {
        body.push_str(&double_effect_card(
            who,
            &view,
            &history,
            &entry_path(e.key.as_str()),
        ));
    }
    if view.status == Status::Unknown {
        let _ = write!(
            body,
            "<div class=\"card\"><b class=\"warn\">Nobody knows whether this happened.</b> Ask \
             the outside world about <code>{}</code>, then say what it found. \
             <details open><summary>Resolve</summary>{}</details></div>",
            esc(&view.external_ref),
            resolve_form(who, e, &entry_path(e.key.as_str()))
        );
    }
    let opt_time = |t: Option<Micros>| t.map_or("-".to_string(), precise_time);
    let stored = if view.status == e.status {
        String::new()
    } else {
        format!(" (stored {}: its lease ended)", e.status.as_str())
    };
    body.push_str("<h2>Fields</h2><dl class=\"fields\">");
    for (name, value) in [
        ("key", e.key.to_string()),
        ("external_ref", view.external_ref.clone()),
        ("run_id", e.run_id_str().to_owned()),
        ("tool", e.tool.to_string()),
        ("status", format!("{}{stored}", view.status.as_str())),
        ("attempt", e.attempt.to_string()),
        ("retryable", e.retryable.to_string()),
        ("principal", e.principal.to_string()),
        ("resolved_by", e.resolved_by.to_string()),
        ("error", e.error.clone()),
        ("fingerprint", e.fingerprint.clone()),
        ("started_at", precise_time(e.started_at)),
        ("lease_expires_at", precise_time(e.lease_expires_at)),
        ("finished_at", opt_time(e.finished_at)),
        ("expires_at", opt_time(e.expires_at)),
        ("replay_count", e.replay_count.to_string()),
        (
            "possible_double_effect",
            if e.possible_double_effect {
                "true: not yet acknowledged".to_owned()
            } else {
                "false".to_owned()
            },
        ),
    ] {
        let shown = if value.is_empty() {
            "-"
        } else {
            value.as_str()
        };
        let _ = write!(
            body,
            "<dt>{name}</dt><dd class=\"mono\">{}</dd>",
            esc(shown)
        );
    }
    body.push_str("</dl><h2>Timeline</h2><div class=\"card\"><ol class=\"timeline\">");
    for line in timeline(&view, call.now) {
        let _ = write!(body, "<li>{}</li>", esc(&line));
    }
    body.push_str("</ol></div><h2>History</h2>");
    body.push_str(&history_table(&history));
    body.push_str("<h2>Arguments</h2>");
    match &e.arguments {
        Some(arguments) if !arguments.is_empty() => {
            body.push_str(&shown_html(&shown(arguments.as_bytes())));
            body.push_str(
                "<p class=\"muted\">As kept for audit (--store-arguments): canonical, with members \
                 named like secrets redacted unless the server keeps them whole.</p>",
            );
        }
        _ => body.push_str(
            "<p class=\"muted\">None kept (--store-arguments none, or an entry stored before \
             arguments were kept).</p>",
        ),
    }
    body.push_str("<h2>Result</h2>");
    body.push_str(&shown_html(&shown(&e.result)));
    let title = format!("Entry {}", shorten(e.key.as_str(), 17));
    Ok(respond::html(
        StatusCode::OK,
        who.page(&title, Nav::Entries, &body),
    ))
}

/// The entry's life so far and to come, one line an event.
pub(super) fn timeline(view: &EntryView, now: Micros) -> Vec<String> {
    let e = &view.entry;
    let mut lines = vec![format!(
        "{}: attempt {} claimed{}{}",
        time(e.started_at),
        e.attempt,
        match &e.run_id {
            None => String::new(),
            Some(run_id) => format!(" in run {run_id}"),
        },
        if e.principal.is_empty() {
            String::new()
        } else {
            format!(" by {}", e.principal)
        }
    )];
    let lease_end = time(e.lease_expires_at);
    match (e.status, e.finished_at) {
        (Status::Attempting, _) if now < e.lease_expires_at => lines.push(format!(
            "{lease_end}: its lease ends (in {}); then it counts as unknown",
            span(e.lease_expires_at.minus(now))
        )),
        (Status::Attempting, _) => lines.push(format!(
            "{lease_end}: its lease ended without a Complete: unknown since"
        )),
        (Status::Unknown, _) => lines.push(format!(
            "{lease_end}: its claimant reported it unknown{}",
            if e.error.is_empty() {
                String::new()
            } else {
                format!(": {}", e.error)
            }
        )),
        // A denial is said with the approval's lines below.
        (Status::Denied, _) => {}
        (_, Some(finished)) => {
            let by = if e.resolved_by.is_empty() {
                "by its claimant's Complete".to_string()
            } else {
                format!("by {}", e.resolved_by)
            };
            lines.push(format!(
                "{}: {}{} {by}",
                time(finished),
                e.status.as_str(),
                if e.status == Status::Failed && e.retryable {
                    " (retryable)"
                } else {
                    ""
                }
            ));
        }
        (_, None) => {}
    }
    let a = &e.approval;
    if let Some(requested) = a.requested_at {
        lines.push(format!(
            "{}: a person was asked to approve it (decide by {})",
            time(requested),
            a.decide_by.map_or_else(|| "-".to_string(), time)
        ));
    }
    if let Some(decided) = a.decided_at {
        lines.push(format!(
            "{}: {} by {}{}",
            time(decided),
            if a.state == crate::domain::ApprovalState::Denied {
                "denied"
            } else {
                "approved"
            },
            a.decided_by,
            if a.reason.is_empty() {
                String::new()
            } else {
                format!(": {}", a.reason)
            }
        ));
    }
    match a.state {
        crate::domain::ApprovalState::Approved => lines.push(format!(
            "the approval may be used until {}",
            a.execute_by.map_or_else(|| "-".to_string(), time)
        )),
        crate::domain::ApprovalState::Used => {
            lines.push("the approval was used: the call acted".to_string());
        }
        crate::domain::ApprovalState::Expired => {
            lines.push("the request (or the approval) lapsed: nothing was done".to_string());
        }
        _ => {}
    }
    if e.replay_count > 0 {
        lines.push(format!(
            "replayed {} time{} since",
            e.replay_count,
            if e.replay_count == 1 { "" } else { "s" }
        ));
    }
    match e.expires_at {
        Some(at) if at > now => lines.push(format!(
            "{}: expires (in {}); after that its key claims anew",
            time(at),
            span(at.minus(now))
        )),
        Some(at) => lines.push(format!("{}: expired", time(at))),
        None => lines.push("never expires while unresolved".to_string()),
    }
    lines
}

/// What was found about an entry and what people did, oldest first: every finding (applied or
/// not, and why not), the marks of a possible double effect and their acknowledgements.
pub(super) fn history_table(history: &[HistoryEvent]) -> String {
    if history.is_empty() {
        return "<p class=\"muted\">Nothing yet: no reconciler or person has reported on this \
                entry.</p>"
            .to_owned();
    }
    let mut html = String::from(
        "<table class=\"history\"><thead><tr><th>When</th><th>What</th>\
         <th class=\"num\">Attempt</th><th>Who</th><th>Detail</th></tr></thead><tbody>",
    );
    for event in history {
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td class=\"num\">{}</td><td>{}</td><td>{}</td></tr>",
            esc(&precise_time(event.at)),
            esc(event_in_words(&event.kind)),
            event.attempt,
            esc(if event.principal.is_empty() {
                "-"
            } else {
                event.principal.as_str()
            }),
            esc(&event.detail),
        );
    }
    html.push_str("</tbody></table>");
    html
}

/// A history event's kind as a person reads it.
fn event_in_words(kind: &EventKind) -> &str {
    match kind {
        EventKind::FindingApplied => "finding applied",
        EventKind::FindingStale => "stale finding (not applied)",
        EventKind::FindingAlreadyResolved => "finding about a resolved attempt (not applied)",
        EventKind::PossibleDoubleEffect => "marked: possible double effect",
        EventKind::DoubleEffectAcknowledged => "double effect acknowledged",
        EventKind::ApprovalRequested => "approval requested",
        EventKind::ApprovalApproved => "approved",
        EventKind::ApprovalDenied => "denied",
        EventKind::ApprovalExpired => "approval lapsed",
        EventKind::ApprovalUsed => "approval used",
        EventKind::Other(name) => name,
    }
}

/// The warning on an entry marked as a possible double effect: the evidence, and the form
/// that acknowledges it once a person has dealt with it; `back` is where to go after it.
pub(super) fn double_effect_card(
    who: &Who,
    view: &EntryView,
    history: &[HistoryEvent],
    back: &str,
) -> String {
    let e = &view.entry;
    let mut html = format!(
        "<div class=\"card double-effect\"><b class=\"bad\">Possible double effect.</b> A \
         finding says that an earlier attempt's effect exists while a later attempt was \
         started (or after the attempt had been recorded as not done): this intent may have \
         acted twice. Check the outside world for <code>{xref}</code> and undo what must be \
         undone, then acknowledge it here.<ul class=\"evidence\">",
        xref = esc(&view.external_ref),
    );
    for event in history.iter().filter(|ev| {
        matches!(
            ev.kind,
            EventKind::PossibleDoubleEffect | EventKind::FindingStale
        )
    }) {
        let _ = write!(
            html,
            "<li>{} · attempt {} · {} · {}</li>",
            esc(&precise_time(event.at)),
            event.attempt,
            esc(if event.principal.is_empty() {
                "-"
            } else {
                event.principal.as_str()
            }),
            esc(&event.detail)
        );
    }
    let _ = write!(
        html,
        "</ul><details><summary>Acknowledge…</summary>\
         <form class=\"resolve\" method=\"post\" action=\"/acknowledge\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <input type=\"hidden\" name=\"key\" value=\"{key}\">\
         <input type=\"hidden\" name=\"back\" value=\"{back}\">\
         <label>What you found or did (kept in the history)<textarea name=\"note\" rows=\"2\" \
         maxlength=\"1024\" required></textarea></label>\
         <label>Your name (recorded with it)<input type=\"text\" name=\"operator\" \
         maxlength=\"{max}\" value=\"{operator}\"></label>\
         <button type=\"submit\">Acknowledge</button></form></details></div>",
        csrf = esc(&who.csrf),
        key = esc(e.key.as_str()),
        back = esc(back),
        max = MAX_OPERATOR_CHARS,
        operator = esc(&who.operator),
    );
    html
}
