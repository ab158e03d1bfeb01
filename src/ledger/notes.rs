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
