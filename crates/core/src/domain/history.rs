//! An entry's history: what happened to it besides its own columns, kept append-only and
//! deleted with the entry. Findings (applied or not, with the attempt each observed and who
//! sent it), a person's dealings with a possible double effect, and every transition of an
//! approval (the events WatchApprovals streams).

use super::fields::Principal;
use super::time::Micros;

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A finding settled the entry.
    FindingApplied,
    /// A finding changed nothing: a later attempt was started, another hold was handed out
    /// since, or the entry was not unknown.
    FindingStale,
    /// A finding about an attempt that was already resolved changed nothing.
    FindingAlreadyResolved,
    /// A finding said an earlier attempt's effect exists while a later attempt was started
    /// (or after the attempt was recorded as not done): the entry was marked.
    PossibleDoubleEffect,
    /// A person acknowledged the mark of a possible double effect.
    DoubleEffectAcknowledged,
    /// A person was asked to decide (a gated claim).
    ApprovalRequested,
    /// A person approved.
    ApprovalApproved,
    /// A person declined.
    ApprovalDenied,
    /// The request went undecided past `decide_by`, or the approval unused past `execute_by`.
    ApprovalExpired,
    /// The approval was used by the claim that acted.
    ApprovalUsed,
    /// A kind this server does not know (written by a newer one), kept as stored.
    Other(String),
}

impl EventKind {
    /// The name stored and shown.
    #[must_use]
    pub fn as_str(&self) -> &str {
        match self {
            EventKind::FindingApplied => "finding_applied",
            EventKind::FindingStale => "finding_stale",
            EventKind::FindingAlreadyResolved => "finding_already_resolved",
            EventKind::PossibleDoubleEffect => "possible_double_effect",
            EventKind::DoubleEffectAcknowledged => "double_effect_acknowledged",
            EventKind::ApprovalRequested => "approval_requested",
            EventKind::ApprovalApproved => "approval_approved",
            EventKind::ApprovalDenied => "approval_denied",
            EventKind::ApprovalExpired => "approval_expired",
            EventKind::ApprovalUsed => "approval_used",
            EventKind::Other(name) => name,
        }
    }

    /// A stored name; one this server does not know is kept as [`EventKind::Other`].
    #[must_use]
    pub fn parse(s: &str) -> EventKind {
        match s {
            "finding_applied" => EventKind::FindingApplied,
            "finding_stale" => EventKind::FindingStale,
            "finding_already_resolved" => EventKind::FindingAlreadyResolved,
            "possible_double_effect" => EventKind::PossibleDoubleEffect,
            "double_effect_acknowledged" => EventKind::DoubleEffectAcknowledged,
            "approval_requested" => EventKind::ApprovalRequested,
            "approval_approved" => EventKind::ApprovalApproved,
            "approval_denied" => EventKind::ApprovalDenied,
            "approval_expired" => EventKind::ApprovalExpired,
            "approval_used" => EventKind::ApprovalUsed,
            other => EventKind::Other(other.to_owned()),
        }
    }
}

/// One event of an entry's history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryEvent {
    /// When, on the ledger's clock.
    pub at: Micros,
    /// The attempt it concerns (a finding: the attempt it observed).
    pub attempt: u32,
    /// What happened.
    pub kind: EventKind,
    /// Who: a Reconcile's principal, or the person's.
    pub principal: Principal,
    /// What was found or said, in words.
    pub detail: String,
}

impl EventKind {
    /// The approval event's name as WatchApprovals sends it (`requested`, `approved`, …);
    /// `None` for the other kinds.
    #[must_use]
    pub fn approval_event(&self) -> Option<&'static str> {
        Some(match self {
            EventKind::ApprovalRequested => "requested",
            EventKind::ApprovalApproved => "approved",
            EventKind::ApprovalDenied => "denied",
            EventKind::ApprovalExpired => "expired",
            EventKind::ApprovalUsed => "used",
            _ => return None,
        })
    }

    /// The stored names of the approval events.
    pub const APPROVAL_KINDS: [&'static str; 5] = [
        "approval_requested",
        "approval_approved",
        "approval_denied",
        "approval_expired",
        "approval_used",
    ];
}

#[cfg(test)]
mod tests {
    use super::EventKind;

    #[test]
    fn kinds_read_back_as_stored_and_unknown_ones_are_kept() {
        for kind in [
            EventKind::FindingApplied,
            EventKind::FindingStale,
            EventKind::FindingAlreadyResolved,
            EventKind::PossibleDoubleEffect,
            EventKind::DoubleEffectAcknowledged,
            EventKind::ApprovalRequested,
            EventKind::ApprovalApproved,
            EventKind::ApprovalDenied,
            EventKind::ApprovalExpired,
            EventKind::ApprovalUsed,
        ] {
            assert_eq!(EventKind::parse(kind.as_str()), kind);
        }
        assert_eq!(
            EventKind::parse("from_a_newer_server"),
            EventKind::Other("from_a_newer_server".into())
        );
        assert_eq!(EventKind::parse("x_y").as_str(), "x_y");
    }
}
