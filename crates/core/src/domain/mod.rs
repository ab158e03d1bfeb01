//! The ledger's rules, free of transport and storage: the request fields ([`fields`]),
//! canonical JSON and key derivation ([`canonical`], [`key`]), what of the arguments is kept for audit ([`redact`]), and the
//! entry state machine ([`entry`]). Nothing here imports tonic
//! or sqlx, so every rule is unit-tested without a server or a database.

pub mod approval;
pub mod canonical;
pub mod entry;
pub mod fields;
pub mod history;
pub mod key;
pub mod redact;
pub mod tenant;
pub mod time;

pub use approval::{Approval, ApprovalState, Decision, Policy};
pub use entry::{
    ClaimDecision, CompleteDecision, Completion, Entry, FinalStatus, FindingDecision,
    RenewDecision, StaleReason, Status, decide_claim, decide_complete, decide_finding,
    decide_renew, marks_double_effect,
};
pub use fields::{ClaimToken, ExplicitKey, HoldToken, InvalidField, Principal, RunId, ToolName};
pub use history::{EventKind, HistoryEvent};
pub use key::{ClaimKey, Key};
pub use tenant::Tenant;
pub use time::Micros;
