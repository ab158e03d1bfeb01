//! One entry's page: every field, its arguments and result as stored, its timeline.

use super::forms::{double_effect_card, resolve_form, who_of};
use super::*;
use crate::domain::{EventKind, HistoryEvent};

// ---- one entry ---------------------------------------------------------------------------

pub(super) async fn entry(who: Who, Query(Params { key, .. }): Query<Params>) -> PageResult {
    let console = &who.console;
    // A text that is no key names no entry, as one the ledger does not find.
    let found = match Key::parse(&key) {
        Ok(parsed) => {
            console
                .ledger()
                .lookup(&who.tenant, LookupInput::by_key(parsed))
                .await
        }
        Err(e) => Err(LedgerError::from(e)),
    };
    let view = match found {
        Ok(view) => view,
        Err(LedgerError::NotFound | LedgerError::InvalidArgument { .. }) => {
            let body = html! {
                h1 { "No such entry" }
                p { (missing_message(&key, crate::ledger::find::Missing::Key)) }
            };
            return Ok(respond::html(
                StatusCode::NOT_FOUND,
                who.page("No such entry", Nav::Entries, body),
            ));
        }
        Err(e) => return Err(failure(&e)),
    };
    let e = &view.entry;
    let history = console
        .ledger()
        .history(&who.tenant, &e.key)
        .await
        .map_err(|e| failure(&e))?;
    let here = entry_path(e.key.as_str());
    let body = html! {
        h1 { "Entry " (shorten(e.key.as_str(), 17)) " " (status_badge(view.status)) }
        p class="lead mono" { (e.key.as_str()) }
        @if e.possible_double_effect { (double_effect_card(&who, &view, &history, &here)) }
        @if view.status == Status::Unknown {
            div class="card" {
                b class="warn" { "Nobody knows whether this happened." }
                " Ask the outside world about " code { (view.external_ref) }
                ", then say what it found. "
                details open { summary { "Resolve" } (resolve_form(&who, e, &here)) }
            }
        }
        h2 { "Fields" }
        dl class="fields" {
            @for (name, value) in fields(&view) {
                dt { (name) }
                dd class="mono" { @if value.is_empty() { "-" } @else { (value) } }
            }
        }
        h2 { "Timeline" }
        div class="card" { ol class="timeline" { @for line in timeline(&view, who.now) { li { (line) } } } }
        h2 { "History" }
        (history_table(&history))
        h2 { "Arguments" }
        @match &e.arguments {
            Some(arguments) if !arguments.is_empty() => {
                (shown_html(&shown(arguments.as_bytes())))
                p class="muted" {
                    "As kept for audit (--store-arguments): canonical, with members named like \
                     secrets redacted unless the server keeps them whole."
                }
            }
            _ => p class="muted" {
                "None kept (--store-arguments none, or an entry stored before arguments were \
                 kept)."
            },
        }
        h2 { "Result" }
        (shown_html(&shown(&e.result)))
    };
    let title = format!("Entry {}", shorten(e.key.as_str(), 17));
    Ok(respond::html(
        StatusCode::OK,
        who.page(&title, Nav::Entries, body),
    ))
}

/// Every field of the entry, by its name in the proto.
fn fields(view: &EntryView) -> [(&'static str, String); 17] {
    let e = &view.entry;
    let opt_time = |t: Option<Micros>| t.map_or("-".to_string(), precise_time);
    let stored = if view.status == e.status {
        String::new()
    } else {
        format!(" (stored {}: its lease ended)", e.status.as_str())
    };
    [
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
    ]
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
            let by = if e.approval.state == crate::domain::ApprovalState::Expired {
                "as its approval lapsed".to_string()
            } else if e.resolved_by.is_empty() {
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
    lines.extend(approval_lines(&e.approval));
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

/// The timeline's lines of an entry's approval: asked, decided (by whom, why), and what became
/// of it (may be used until, used, lapsed).
fn approval_lines(a: &crate::domain::Approval) -> Vec<String> {
    let mut lines = Vec::new();
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
        crate::domain::ApprovalState::Expired if a.decided_at.is_none() => {
            lines.push("the request lapsed undecided: nothing was done".to_string());
        }
        crate::domain::ApprovalState::Expired => {
            lines.push("the approval lapsed unused: nothing was done".to_string());
        }
        _ => {}
    }
    lines
}

/// What was found about an entry and what people did, oldest first: every finding (applied or
/// not, and why not), the marks of a possible double effect and their acknowledgements.
pub(super) fn history_table(history: &[HistoryEvent]) -> Markup {
    html! {
        @if history.is_empty() {
            p class="muted" {
                "Nothing yet: no reconciler or person has reported on this entry."
            }
        } @else {
            table class="history" {
                thead { tr {
                    th { "When" } th { "What" } th class="num" { "Attempt" } th { "Who" }
                    th { "Detail" }
                } }
                tbody {
                    @for event in history {
                        tr {
                            td { (precise_time(event.at)) }
                            td { (event_in_words(&event.kind)) }
                            td class="num" { (event.attempt) }
                            td { (who_of(event)) }
                            td { (event.detail) }
                        }
                    }
                }
            }
        }
    }
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
