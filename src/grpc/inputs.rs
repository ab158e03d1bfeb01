//! Requests in: each RPC's request turned into its use case's typed input. The fields a use
//! case takes typed (run id, tool, key, principal, claim and hold tokens) are parsed here with
//! the domain's `parse`, so a use case never sees a malformed one. A refusal is the one the use
//! case gave before it took them typed: the field's [`InvalidField`] as a [`LedgerError`],
//! turned into its status by [`status`] (`INVALID_ARGUMENT`, reason `INVALID_FIELD`, the same
//! field and message).
//!
//! What depends on the ledger's configuration stays in the use case: the arguments' JSON
//! (canonicalized under its JSON limits), durations against their bounds, how many keys or
//! resolutions one call may send. So the field checks here come before those.

use std::time::Duration;

use tokio::time::Instant;
use tonic::Status;

use super::convert::{
    View, canonicalization, decision, duration, final_status, instant, status_filter, view,
    wait_for,
};
use super::error::status;
use super::pb;
use crate::domain::fields::{InvalidField, optional};
use crate::domain::key::ClaimKey;
use crate::domain::{ClaimToken, FinalStatus, HoldToken, Key, Principal, RunId, ToolName};
use crate::error::LedgerError;
use crate::ledger::{
    AcknowledgeInput, ClaimInput, CompleteInput, DecideInput, ListInput, LookupInput,
    ReconcileInput, RenewInput, ResolutionInput, resolution_not_final, unfenced_resolution,
};

/// A field parsed, or its refusal as the status sent.
fn parsed<T>(result: Result<T, InvalidField>) -> Result<T, Status> {
    result.map_err(|e| status(LedgerError::from(e)))
}

/// A Claim's input, `deadline` being when the caller stops listening. Checked in this order:
/// `view`, `canonicalization`, the durations, then the fields `tool`, `run_id` and `key` (see
/// [`ClaimKey::parse`]: without a key the run id is required; with one it is optional) and
/// `principal`; the use case then checks `arguments_json`, so a request wrong in a field and in
/// its arguments is refused for the field.
///
/// With `same_intent_within` the run is the window's ([`ClaimRequestInput::window`]), so
/// neither `run_id` nor `key` may be sent.
pub(super) fn claim_input(
    r: pb::ClaimRequest,
    deadline: Instant,
) -> Result<ClaimRequestInput, Status> {
    // Checked, then not needed: a Claim's basic view is its full one (its entry never carries
    // arguments_json, and its stored result is what a replay needs).
    view(r.view)?;
    let canonicalization = canonicalization(r.canonicalization)?;
    let lease = duration("lease", r.lease)?;
    let retention = duration("retention", r.retention)?;
    let wait = duration("wait", r.wait)?;
    let wait_for = wait_for(r.wait_for)?;
    let window = duration("same_intent_within", r.same_intent_within)?;
    let key = match window {
        None => parsed(ClaimKey::parse(&r.key, &r.run_id))?,
        Some(_) if !r.run_id.is_empty() || !r.key.is_empty() => {
            return Err(status(LedgerError::invalid(
                "same_intent_within",
                "takes the place of run_id and key: send it with neither",
            )));
        }
        // Replaced by the window's run once the ledger counted it (`Ledger::claim_within`).
        Some(_) => ClaimKey::Derived(RunId::from_stored(String::new())),
    };
    let input = ClaimInput {
        tool: parsed(ToolName::parse(&r.tool))?,
        key,
        principal: parsed(Principal::parse(&r.principal))?,
        arguments_json: r.arguments_json,
        canonicalization,
        lease,
        retention,
        wait,
        wait_for,
        answer_by: Some(deadline),
        require_approval: r.require_approval,
    };
    Ok(ClaimRequestInput { input, window })
}

/// A Claim's input, and its window of intent when the run is the window's.
#[derive(Debug)]
pub(super) struct ClaimRequestInput {
    /// The claim (its key replaced by the window's run when there is a window).
    pub input: ClaimInput,
    /// `same_intent_within`.
    pub window: Option<Duration>,
}

/// A Lookup's input: by `key`, or by `run_id`, `tool` and `arguments_json` (the run id, then
/// the tool are parsed here; the arguments are the use case's), never both. A request with
/// neither, or with both, is refused for field `key`.
pub(super) fn lookup_input(r: pb::LookupRequest) -> Result<LookupInput, Status> {
    let canonicalization = canonicalization(r.canonicalization)?;
    let intent_empty = r.run_id.is_empty() && r.tool.is_empty() && r.arguments_json.is_empty();
    if r.key.is_empty() {
        if intent_empty {
            return Err(status(LedgerError::invalid(
                "key",
                "give either key, or run_id, tool and arguments_json",
            )));
        }
        return Ok(LookupInput::ByIntent {
            run_id: parsed(RunId::parse(&r.run_id))?,
            tool: parsed(ToolName::parse(&r.tool))?,
            arguments_json: r.arguments_json,
            canonicalization,
        });
    }
    if !intent_empty {
        return Err(status(LedgerError::invalid(
            "key",
            "give either key, or run_id, tool and arguments_json, not both",
        )));
    }
    Ok(LookupInput::by_key(parsed(Key::parse(&r.key))?))
}

/// A Complete's input, and the view it answers in: the status and view first, then the key
/// and the claim token.
pub(super) fn complete_input(r: pb::CompleteRequest) -> Result<(CompleteInput, View), Status> {
    let status = final_status("status", r.status)?;
    let view = view(r.view)?;
    let input = CompleteInput {
        key: parsed(Key::parse(&r.key))?,
        claim_token: parsed(ClaimToken::parse(&r.claim_token))?,
        status,
        result: r.result.to_vec(),
        error: r.error,
        retryable: r.retryable,
    };
    Ok((input, view))
}

/// A RenewLease's input: the lease first, then the key and the claim token.
pub(super) fn renew_input(r: pb::RenewLeaseRequest) -> Result<RenewInput, Status> {
    let lease = duration("lease", r.lease)?;
    Ok(RenewInput {
        key: parsed(Key::parse(&r.key))?,
        claim_token: parsed(ClaimToken::parse(&r.claim_token))?,
        lease,
    })
}

/// A Decide's input: the decision, then the key (the fingerprint and reason are the use
/// case's).
pub(super) fn decide_input(r: pb::DecideRequest) -> Result<DecideInput, Status> {
    let decision = decision(r.decision)?;
    Ok(DecideInput {
        key: parsed(Key::parse(&r.key))?,
        fingerprint: r.fingerprint,
        decision,
        reason: r.reason,
    })
}

/// An AcknowledgeDoubleEffect's input: the key, then the principal (the note is the use
/// case's).
pub(super) fn acknowledge_input(
    r: pb::AcknowledgeDoubleEffectRequest,
) -> Result<AcknowledgeInput, Status> {
    Ok(AcknowledgeInput {
        key: parsed(Key::parse(&r.key))?,
        principal: parsed(Principal::parse(&r.principal))?,
        note: r.note,
    })
}

/// An ExtendRun's input: the retention, then the run.
pub(super) fn extend_input(r: pb::ExtendRunRequest) -> Result<(RunId, Option<Duration>), Status> {
    let retention = duration("retention", r.retention)?;
    Ok((parsed(RunId::parse(&r.run_id))?, retention))
}

/// A ListEntries' input: the status and time filters, the page size, then the run and tool
/// filters (empty: no filter). The page token is the use case's (it is bound to the filters).
pub(super) fn list_input(r: pb::ListEntriesRequest) -> Result<ListInput, Status> {
    let status_filter = status_filter(r.status)?;
    let started_after = instant("started_after", r.started_after)?;
    let started_before = instant("started_before", r.started_before)?;
    let page_size = u32::try_from(r.page_size)
        .map_err(|_| status(LedgerError::invalid("page_size", "must not be negative")))?;
    Ok(ListInput {
        run_id: parsed(optional(&r.run_id, RunId::parse))?,
        tool: parsed(optional(&r.tool, ToolName::parse))?,
        status: status_filter,
        started_after,
        started_before,
        page_size,
        page_token: r.page_token,
        possible_double_effect: r.possible_double_effect,
    })
}

/// A Reconcile's input. Checked in this order: each resolution's status, `older_than`, `tool`
/// (empty for all), `principal`, each of `keys` (refused as `keys: [i]: …`), then each
/// resolution's key (`resolutions: [i].key: …`), that its status is a finding (not
/// UNKNOWN), and its hold token (an empty one is refused as unfenced, reason
/// `UNFENCED_RESOLUTION`, as the use case refuses a resolution without its attempt). The use
/// case then checks how many keys and resolutions one call may send, and each resolution's
/// attempt and outcome.
pub(super) fn reconcile_input(r: pb::ReconcileRequest) -> Result<ReconcileInput, Status> {
    let statuses = r
        .resolutions
        .iter()
        .map(|res| final_status("resolutions", res.status))
        .collect::<Result<Vec<_>, Status>>()?;
    let older_than = duration("older_than", r.older_than)?;
    let tool = parsed(optional(&r.tool, ToolName::parse))?;
    let principal = parsed(Principal::parse(&r.principal))?;
    let keys = r
        .keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            Key::parse(k).map_err(|e| {
                status(LedgerError::invalid(
                    "keys",
                    format!("[{i}]: {}", e.message),
                ))
            })
        })
        .collect::<Result<Vec<_>, Status>>()?;
    let resolutions = r
        .resolutions
        .into_iter()
        .zip(statuses)
        .enumerate()
        .map(|(i, (res, found))| resolution_input(i, res, found))
        .collect::<Result<Vec<_>, Status>>()?;
    Ok(ReconcileInput {
        older_than,
        tool,
        limit: r.limit,
        resolutions,
        resolve_only: r.resolve_only,
        keys,
        principal,
    })
}

/// Resolution `i` of a Reconcile, its status converted (`found`): its key, that the status
/// is a finding, and its hold token.
fn resolution_input(
    i: usize,
    r: pb::Resolution,
    found: FinalStatus,
) -> Result<ResolutionInput, Status> {
    let key = Key::parse(&r.key).map_err(|e| {
        status(LedgerError::invalid(
            "resolutions",
            format!("[{i}].key: {}", e.message),
        ))
    })?;
    if found == FinalStatus::Unknown {
        return Err(status(resolution_not_final(i)));
    }
    let hold_token = HoldToken::parse(&r.hold_token).map_err(|_| status(unfenced_resolution(i)))?;
    Ok(ResolutionInput {
        key,
        status: found,
        result: r.result.to_vec(),
        error: r.error,
        retryable: r.retryable,
        attempt: r.attempt,
        hold_token,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(s: &Status) -> (tonic::Code, String) {
        (s.code(), s.message().to_string())
    }

    #[test]
    fn a_window_of_intent_takes_the_place_of_run_and_key_never_beside_them() {
        let window = |run_id: &str, key: &str| pb::ClaimRequest {
            tool: "t".into(),
            arguments_json: "{}".into(),
            run_id: run_id.into(),
            key: key.into(),
            same_intent_within: Some(prost_types::Duration {
                seconds: 600,
                nanos: 0,
            }),
            ..pb::ClaimRequest::default()
        };
        let alone = claim_input(window("", ""), Instant::now()).expect("a window alone");
        assert_eq!(alone.window, Some(Duration::from_secs(600)));
        for (run_id, key) in [("run-1", ""), ("", "k-1"), ("run-1", "k-1")] {
            let refused = claim_input(window(run_id, key), Instant::now()).expect_err("both");
            let expected = status(LedgerError::invalid(
                "same_intent_within",
                "takes the place of run_id and key: send it with neither",
            ));
            assert_eq!(refusal(&refused), refusal(&expected), "{run_id:?} {key:?}");
        }
    }

    #[test]
    fn a_claim_without_key_or_run_is_refused_for_its_run_id() {
        let r = pb::ClaimRequest {
            tool: "t".into(),
            arguments_json: "{}".into(),
            ..pb::ClaimRequest::default()
        };
        let refused = claim_input(r, Instant::now()).expect_err("no run");
        let expected = status(LedgerError::invalid("run_id", "must not be empty"));
        assert_eq!(refusal(&refused), refusal(&expected));
    }

    #[test]
    fn a_field_is_refused_before_the_arguments_are_read() {
        let r = pb::ClaimRequest {
            tool: String::new(),
            run_id: "r".into(),
            arguments_json: "not json".into(),
            ..pb::ClaimRequest::default()
        };
        let refused = claim_input(r, Instant::now()).expect_err("no tool");
        assert!(refused.message().contains("tool"), "{refused:?}");
    }

    #[test]
    fn a_lookup_names_a_key_or_an_intent_never_both_nor_neither() {
        let neither = lookup_input(pb::LookupRequest::default()).expect_err("neither");
        assert_eq!(neither.code(), tonic::Code::InvalidArgument);
        let both = lookup_input(pb::LookupRequest {
            key: "k".into(),
            tool: "t".into(),
            ..pb::LookupRequest::default()
        })
        .expect_err("both");
        assert!(both.message().contains("not both"), "{both:?}");
        let by_key = lookup_input(pb::LookupRequest {
            key: "k".into(),
            ..pb::LookupRequest::default()
        })
        .expect("a key");
        assert!(matches!(by_key, LookupInput::ByKey(k) if k == "k"));
    }

    #[test]
    fn a_resolution_without_a_hold_token_is_unfenced() {
        let r = pb::ReconcileRequest {
            resolutions: vec![pb::Resolution {
                key: "k".into(),
                status: pb::Status::Succeeded.into(),
                attempt: 1,
                ..pb::Resolution::default()
            }],
            ..pb::ReconcileRequest::default()
        };
        let refused = reconcile_input(r).expect_err("no hold");
        assert_eq!(refusal(&refused), refusal(&status(unfenced_resolution(0))));
    }
}
