//! The sentences a Claim answers with, written for the model that reads them.

use crate::domain::Entry;

pub(super) const IN_FLIGHT_NOTE: &str = "This action is already being performed by another attempt of the \
    same request; do not repeat it. No new action was taken. Check again shortly for its result.";

pub(super) const UNKNOWN_NOTE: &str = "An earlier attempt of this action may or may not have taken effect: \
    its outcome is unknown and is being reconciled. Do not repeat it. No new action was taken.";

pub(super) fn replay_note(entry: &Entry) -> String {
    if entry.run_id.is_none() {
        "This action was already performed for this request; returning the earlier result. No \
         new action was taken."
            .to_string()
    } else {
        "This action was already performed in this run; returning the earlier result. No new \
         action was taken."
            .to_string()
    }
}

pub(super) fn failed_note(entry: &Entry) -> String {
    let scope = if entry.run_id.is_none() {
        "for this request"
    } else {
        "in this run"
    };
    let error = if entry.error.is_empty() {
        "no error was given".to_string()
    } else {
        entry.error.clone()
    };
    format!(
        "This action already failed permanently {scope} ({error}). No new action was taken; \
         do not retry it with the same arguments."
    )
}

/// A gated call: a person has been asked; nothing was done.
pub(super) fn awaiting_note(entry: &Entry) -> String {
    let by = entry
        .approval
        .decide_by
        .map(crate::domain::time::rfc3339)
        .unwrap_or_default();
    format!(
        "This action needs a person's approval, and a person has been asked (a decision is due \
         by {by}). Nothing was done. Do not try other ways to do it; tell the user it awaits \
         approval, or call it again with the same arguments once it is decided."
    )
}

/// A denied call: a person declined it; it was not done.
pub(super) fn denied_note(entry: &Entry) -> String {
    let reason = if entry.approval.reason.is_empty() {
        "no reason was given".to_string()
    } else {
        entry.approval.reason.clone()
    };
    format!("A person declined this action: {reason}. It was not done; do not retry it unchanged.")
}
