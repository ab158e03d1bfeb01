//! Typed inputs from a test's own text: the use cases take parsed values (gRPC and the console
//! parse a caller's text where it arrives), so a test parses its literals, which must be valid
//! (`expect`), and builds the inputs most tests send.

use idempotency_ledger::domain::key::ClaimKey;
use idempotency_ledger::domain::{ClaimToken, Key, Principal, RunId, ToolName};
use idempotency_ledger::ledger::{ClaimInput, LookupInput};

/// `text` as a key a caller names (the test's own text: it must be one).
pub fn key(text: impl AsRef<str>) -> Key {
    Key::parse(text.as_ref()).expect("a key")
}

/// `text` as a run id (it must be one).
pub fn run_id(text: &str) -> RunId {
    RunId::parse(text).expect("a run id")
}

/// `text` as a tool name (it must be one).
pub fn tool(text: &str) -> ToolName {
    ToolName::parse(text).expect("a tool")
}

/// `text` as a principal (it must be one).
pub fn principal(text: &str) -> Principal {
    Principal::parse(text).expect("a principal")
}

/// `text` as a claim token a caller sends back (it must not be empty).
pub fn claim_token(text: &str) -> ClaimToken {
    ClaimToken::parse(text).expect("a claim token")
}

/// A claim's key `explicit` (empty to derive one) with the run `run` (empty for none).
pub fn claim_key(explicit: &str, run: &str) -> ClaimKey {
    ClaimKey::parse(explicit, run).expect("a key or a run")
}

/// A claim of `tool` with `args`, its key derived from `run`.
pub fn claim_input(run: &str, tool: &str, args: &str) -> ClaimInput {
    ClaimInput {
        tool: self::tool(tool),
        arguments_json: args.into(),
        key: claim_key("", run),
        canonicalization: Default::default(),
        lease: None,
        retention: None,
        wait: None,
        wait_for: Default::default(),
        answer_by: None,
        principal: Principal::none(),
        require_approval: false,
    }
}

/// A Lookup of the entry Claim derives from `run`, `tool` and `args`.
pub fn intent(run: &str, tool: &str, args: &str) -> LookupInput {
    LookupInput::ByIntent {
        run_id: run_id(run),
        tool: self::tool(tool),
        arguments_json: args.into(),
        canonicalization: Default::default(),
    }
}
