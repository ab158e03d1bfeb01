//! An entry's history: what happened to it besides its own columns, kept append-only and
//! deleted with the entry. Findings (applied or not, with the attempt each observed and who
//! sent it) and a person's dealings with a possible double effect.

use super::key::Principal;
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
