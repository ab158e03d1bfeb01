//! What needs a person: the possible double effects with their evidence and the form that
//! acknowledges each, then the unknown outcomes, oldest first, each with the form that
//! resolves it as a reconciler would.

use super::forms::{double_effect_card, resolve_form};
use super::*;

pub(super) async fn attention(who: Who, Query(query): Query<Params>) -> PageResult {
    let first = query.page_token.is_empty();
    let out = listed(&who, Status::Unknown, query.page_token).await?;
    // First what may have happened twice: nothing settles it but a person.
    let marked = if first {
        double_effects(&who).await?
    } else {
        html! {}
    };
    let body = html! {
        h1 { "Needs a person" }
        (marked)
        p class="lead" {
            "Outcomes nobody knows: reported UNKNOWN by their claimant, or attempts whose lease \
             ended without a Complete. Until someone resolves them, every repeat gets \
             IN_PROGRESS and nothing runs again. Oldest first. Ask the outside world (by the \
             external_ref) whether the action happened, then resolve the entry here, as a \
             reconciler would."
        }
        @if out.entries.is_empty() && first {
            div class="card" {
                b { "Nothing needs a person." } " "
                span class="muted" { "No entry of this tenant is unknown." }
            }
        } @else if out.entries.is_empty() {
            div class="card" { "No more unknown entries." }
        } @else {
            table {
                thead { tr {
                    th { "Age" } th { "Tool" } th { "external_ref" } th class="num" { "Attempt" }
                    th { "Run" } th { "Key" } th { "Why unknown" } th { "Resolve" }
                } }
                tbody { @for view in &out.entries { (unknown_row(&who, view)) } }
            }
            (pager("/", &[], &out.next_page_token))
        }
    };
    Ok(respond::html(
        StatusCode::OK,
        who.page("Needs a person", Nav::Attention, body),
    ))
}

/// A row of the unknown entries, with its resolve form.
fn unknown_row(who: &Who, view: &EntryView) -> Markup {
    let e = &view.entry;
    let why = if e.status == Status::Attempting {
        format!(
            "lease ended {} ago",
            span(who.now.minus(e.lease_expires_at))
        )
    } else if e.error.is_empty() {
        "reported unknown".to_string()
    } else {
        format!("reported unknown: {}", shorten(&e.error, 80))
    };
    html! {
        tr {
            td title={ "started " (time(e.started_at)) } { (span(who.now.minus(e.started_at))) }
            td { (e.tool.as_str()) }
            td class="mono" { (view.external_ref) }
            td class="num" { (e.attempt) }
            td { (shorten(e.run_id_str(), 32)) }
            td class="mono" { (entry_link(e.key.as_str())) }
            td { (why) }
            td { details { summary { "Resolve…" } (resolve_form(who, e, "/")) } }
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct ResolveForm {
    key: String,
    back: String,
    outcome: String,
    attempt: String,
    hold: String,
    result: String,
    error: String,
    operator: String,
}

pub(super) async fn resolve(who: Who, Form(form): Form<ResolveForm>) -> PageResult {
    let console = &who.console;
    let key = form.key.clone();
    let (status, retryable, default_error) = match form.outcome.as_str() {
        "found" => (FinalStatus::Succeeded, false, ""),
        "not_found" => (
            FinalStatus::Failed,
            true,
            "not found in the outside world (resolved in the console)",
        ),
        "failed" => (
            FinalStatus::Failed,
            false,
            "failed for good (resolved in the console)",
        ),
        _ => {
            return Err(bad_request(
                "Choose what the outside world says: found, not found, or failed for good. \
                 Nothing was changed.",
            ));
        }
    };
    let attempt: u32 = match form.attempt.parse() {
        Ok(n) if n > 0 => n,
        _ => {
            return Err(bad_request(
                "The form names no attempt: reload the page and resolve from there. Nothing \
                 was changed.",
            ));
        }
    };
    let (operator, principal) = recorded_as(&who, &form.operator).map_err(|p| bad_request(&p))?;
    let principal = Principal::parse(&principal).map_err(|e| bad_request(&e.message))?;
    let (result, error) = if status == FinalStatus::Succeeded {
        (form.result.into_bytes(), String::new())
    } else {
        let note = form.error.trim();
        let note = if note.is_empty() { default_error } else { note };
        (Vec::new(), note.to_string())
    };
    let key = Key::parse(&key).map_err(|e| bad_request(&e.message))?;
    let completion = Completion::new(status, result, error, retryable)
        .map_err(|e| bad_request(&format!("{}: {}", e.field, e.message)))?;
    let finding = Finding {
        key: key.clone(),
        attempt,
        hold: shown_hold(&form.hold).map_err(|p| bad_request(&p))?,
        completion,
    };
    let ledger = console.ledger().clone();
    // In a task of its own: a browser that goes away does not abandon the write halfway.
    let tenant = who.tenant.clone();
    let by = principal.clone();
    let out = tokio::spawn(async move { ledger.settle(&tenant, &finding, &by).await })
        .await
        .map_err(|e| failure(&LedgerError::Internal(format!("resolution task: {e}"))))?
        .map_err(|e| failure(&e))?;
    console.metrics().resolutions([status]);
    console.metrics().findings(std::slice::from_ref(&out));
    console.sessions().set_operator(&who.id, &operator);
    // As a page of an entry that is not there: never told apart from another tenant's.
    let flash = resolved_flash(&who, &key, attempt, &principal, &out)
        .ok_or_else(|| failure(&LedgerError::NotFound))?;
    console.sessions().flash(&who.id, flash);
    Ok(respond::redirect(&back_to(&form.back, &form.key)))
}

/// The hold the page showed, as its form sends it back: empty when no reconciler had been
/// handed the entry (no hold: the finding then applies only while none is handed it out),
/// else a token parsed as any caller's ([`HoldToken::parse`]), refused when it is not one.
fn shown_hold(text: &str) -> Result<HoldToken, String> {
    if text.is_empty() {
        return Ok(HoldToken::none());
    }
    HoldToken::parse(text).map_err(|e| {
        format!(
            "The form's hold token is not one ({e}): reload the page and resolve from there. \
             Nothing was changed."
        )
    })
}

/// What the operator is told after resolving `key` at `attempt`: applied (and logged), the
/// entry still in its lease, moved on (the finding kept in its history), or already resolved;
/// `None` when the entry is not there.
fn resolved_flash(
    who: &Who,
    key: &Key,
    attempt: u32,
    principal: &Principal,
    out: &crate::ledger::ResolutionResult,
) -> Option<Flash> {
    let short = shorten(key.as_str(), 17);
    let flash = match (&out.outcome, &out.entry) {
        (ResolutionOutcome::Applied, Some(after)) => {
            tracing::info!(
                tenant = who.tenant.as_str(),
                key = crate::observe::telemetry::key_prefix(key.as_str()),
                status = after.entry.status.as_str(),
                resolved_by = %principal,
                "console: resolved an unknown outcome"
            );
            good(format!(
                "Resolved {short} as {}{}, recorded as resolved by {principal}. {}",
                after.entry.status.as_str(),
                if after.entry.retryable {
                    " (retryable)"
                } else {
                    ""
                },
                next_claim(&after.entry.status, after.entry.retryable)
            ))
        }
        (ResolutionOutcome::NotFound, _) | (_, None) => return None,
        (ResolutionOutcome::Stale(StaleReason::NotUnknown), Some(_)) => bad(format!(
            "{short} is still in its lease: its claimant may yet complete it. Nothing was changed."
        )),
        (ResolutionOutcome::Stale(_), Some(after)) => bad(format!(
            "{short} moved on since this page showed it (attempt {attempt}): {}. Your finding \
             was kept in its history, and nothing else was changed; look at the entry as it is \
             now before you resolve it.{}",
            out.note,
            if after.entry.possible_double_effect {
                " It is marked as a possible double effect."
            } else {
                ""
            }
        )),
        (ResolutionOutcome::AlreadyResolved, Some(after)) => bad(format!(
            "{short} was already resolved ({}{}); nothing was changed.{}",
            after.entry.status.as_str(),
            if after.entry.resolved_by.is_empty() {
                String::new()
            } else {
                format!(", by {}", after.entry.resolved_by)
            },
            if out.marked_double_effect {
                " Your finding contradicts it: the entry is now marked as a possible double \
                 effect."
            } else {
                ""
            }
        )),
    };
    Some(flash)
}

/// The entries marked as a possible double effect, each with its evidence and the form that
/// acknowledges it; nothing when there is none.
pub(super) async fn double_effects(who: &Who) -> Result<Markup, Answer> {
    let console = &who.console;
    let marked = console
        .ledger()
        .double_effects(&who.tenant, PAGE_SIZE)
        .await
        .map_err(|e| failure(&e))?;
    let mut cards = Vec::with_capacity(marked.len());
    for view in &marked {
        let history = console
            .ledger()
            .history(&who.tenant, &view.entry.key)
            .await
            .map_err(|e| failure(&e))?;
        cards.push((view, history));
    }
    Ok(html! {
        @if !marked.is_empty() {
            h2 class="bad" {
                "Possible double effects (" (marked.len())
                @if marked.len() as u32 == PAGE_SIZE { "+" }
                ")"
            }
        }
        @for (view, history) in &cards {
            p class="mono" {
                (entry_link(view.entry.key.as_str())) " · " (view.entry.tool.as_str())
                " · attempt " (view.entry.attempt) " · " (view.status.as_str())
            }
            (double_effect_card(who, view, history, "/"))
        }
    })
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct AcknowledgeForm {
    key: String,
    note: String,
    operator: String,
    back: String,
}

pub(super) async fn acknowledge(who: Who, Form(form): Form<AcknowledgeForm>) -> PageResult {
    let key = form.key.clone();
    let (operator, principal) = recorded_as(&who, &form.operator).map_err(|p| bad_request(&p))?;
    let note = form.note.trim().to_string();
    if note.is_empty() {
        return Err(bad_request(
            "Say what you found or did: the note is kept in the entry's history. Nothing was \
             changed.",
        ));
    }
    // The key and principal parsed here; refused as the ledger's refusals are, below.
    let input = Key::parse(&key).and_then(|parsed| {
        Ok(AcknowledgeInput {
            key: parsed,
            note,
            principal: Principal::parse(&principal)?,
        })
    });
    let out = match input {
        Err(e) => Err(LedgerError::from(e)),
        Ok(input) => {
            let ledger = who.console.ledger().clone();
            let tenant = who.tenant.clone();
            tokio::spawn(async move { ledger.acknowledge_double_effect(&tenant, input).await })
                .await
                .map_err(|e| {
                    failure(&LedgerError::Internal(format!("acknowledgement task: {e}")))
                })?
        }
    };
    who.console.sessions().set_operator(&who.id, &operator);
    let short = shorten(&key, 17);
    let flash = match out {
        Ok(_) => good(format!(
            "Acknowledged the possible double effect of {short}, recorded as by {principal}."
        )),
        Err(LedgerError::NotMarked) => bad(format!(
            "{short} is not marked as a possible double effect (acknowledged already?); \
             nothing was changed."
        )),
        Err(LedgerError::NotFound) => bad(format!(
            "{}; nothing was changed.",
            missing_message(&short, crate::ledger::find::Missing::Key)
        )),
        Err(LedgerError::InvalidArgument { message, .. }) => {
            return Err(bad_request(&format!("{message}. Nothing was changed.")));
        }
        Err(e) => return Err(failure(&e)),
    };
    who.console.sessions().flash(&who.id, flash);
    Ok(respond::redirect(&back_to(&form.back, &form.key)))
}

/// What the next Claim of an entry in `status` gets.
fn next_claim(status: &Status, retryable: bool) -> &'static str {
    match (status, retryable) {
        (Status::Succeeded, _) => "The next claim of it is REPLAYED with this result.",
        (Status::Failed, true) => "The next claim of it is CLAIMED again (a new attempt).",
        (Status::Failed, false) => "The next claim of it is PREVIOUSLY_FAILED.",
        _ => "",
    }
}
