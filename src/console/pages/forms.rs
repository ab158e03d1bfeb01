//! The forms a person acts on one entry with, shown on the attention page and on the entry's own
//! page: resolving an outcome nobody knows, and acknowledging a possible double effect.

use super::*;
use crate::domain::{EventKind, HistoryEvent};

/// The form that resolves the entry `e`, as a reconciler's resolution would, fenced by what
/// the page showed: its attempt and its newest hold, sent back so that a person's finding
/// settles that attempt only, and only if no reconciler was handed the entry since; `back` is
/// where to go after it.
pub(super) fn resolve_form(who: &Who, e: &Entry, back: &str) -> Markup {
    html! {
        form class="resolve" method="post" action="/resolve" {
            (csrf_field(&who.csrf))
            (hidden_field("key", e.key.as_str()))
            (hidden_field("attempt", e.attempt))
            (hidden_field("hold", e.hold_token.as_str()))
            (hidden_field("back", back))
            fieldset {
                legend { "What does the outside world say?" }
                label {
                    input type="radio" name="outcome" value="found" required;
                    " Found: it happened (its result below is replayed to every repeat)"
                }
                label {
                    input type="radio" name="outcome" value="not_found";
                    " Not found: it did not happen; a repeat may try again"
                }
                label {
                    input type="radio" name="outcome" value="failed";
                    " Failed for good: it did not happen and must not be tried again"
                }
            }
            label { "Result, with Found (stored as typed)" textarea name="result" rows="3" {} }
            label {
                "Note, with Not found or Failed (stored as the entry's error)"
                input type="text" name="error";
            }
            label {
                "Your name (recorded: resolved_by = console:NAME)"
                input type="text" name="operator" maxlength=(MAX_OPERATOR_CHARS)
                    value=(who.operator);
            }
            button type="submit" { "Resolve" }
        }
    }
}

/// The warning on an entry marked as a possible double effect: the evidence, and the form
/// that acknowledges it once a person has dealt with it; `back` is where to go after it.
pub(super) fn double_effect_card(
    who: &Who,
    view: &EntryView,
    history: &[HistoryEvent],
    back: &str,
) -> Markup {
    let evidence = history.iter().filter(|ev| {
        matches!(
            ev.kind,
            EventKind::PossibleDoubleEffect | EventKind::FindingStale
        )
    });
    html! {
        div class="card double-effect" {
            b class="bad" { "Possible double effect." }
            " A finding says that an earlier attempt's effect exists while a later attempt was \
             started (or after the attempt had been recorded as not done): this intent may have \
             acted twice. Check the outside world for " code { (view.external_ref) }
            " and undo what must be undone, then acknowledge it here."
            ul class="evidence" {
                @for event in evidence {
                    li {
                        (precise_time(event.at)) " · attempt " (event.attempt) " · "
                        (who_of(event)) " · " (event.detail)
                    }
                }
            }
            details {
                summary { "Acknowledge…" }
                form class="resolve" method="post" action="/acknowledge" {
                    (csrf_field(&who.csrf))
                    (hidden_field("key", view.entry.key.as_str()))
                    (hidden_field("back", back))
                    label {
                        "What you found or did (kept in the history)"
                        textarea name="note" rows="2" maxlength="1024" required {}
                    }
                    label {
                        "Your name (recorded with it)"
                        input type="text" name="operator" maxlength=(MAX_OPERATOR_CHARS)
                            value=(who.operator);
                    }
                    button type="submit" { "Acknowledge" }
                }
            }
        }
    }
}

/// Who an event is by, or `-`.
pub(super) fn who_of(event: &HistoryEvent) -> &str {
    if event.principal.is_empty() {
        "-"
    } else {
        event.principal.as_str()
    }
}
