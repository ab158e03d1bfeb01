//! The encoded sizes of the RPCs: the floor's calls sized as the ledger's, and the sizes each
//! run saw (`rpc_bytes`), so that the floor's can be checked against the ledger's.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::SystemTime;

use idempotency_ledger::grpc::pb::{
    ClaimRequest, ClaimResponse, CompleteRequest, CompleteResponse, Entry, Outcome,
    Status as EntryStatus,
};
use prost::Message;
use prost::bytes::Bytes;

use super::{ARGUMENTS, FloorOf, RESULT, TOOL, View};
use crate::floor_pb;

/// The floor's calls for one operation of `of`: for each RPC that operation makes, a filler
/// payload and a response size such that the floor's request and response encode to as many
/// bytes as the ledger's would. The ledger's are built here as the server fills them (the
/// server's own answers for ledger-bench's requests: the same key, token, fingerprint and
/// timestamp lengths, the same result and note), so `rpc_bytes` of a real run and of a floor
/// run agree to a few bytes.
pub(crate) fn floor_calls(of: FloorOf, view: View, run_tag: &str) -> Vec<(Bytes, u32)> {
    let hex = |n: usize| "0123456789abcdef".repeat(n.div_ceil(16))[..n].to_string();
    let now = prost_types::Timestamp::from(SystemTime::now());
    let later = |s: i64| prost_types::Timestamp {
        seconds: now.seconds + s,
        nanos: now.nanos,
    };
    let entry = |run_id: &str| Entry {
        key: hex(64),
        run_id: run_id.to_string(),
        tool: TOOL.to_string(),
        fingerprint: hex(64),
        status: EntryStatus::Attempting as i32,
        attempt: 1,
        started_at: Some(now),
        lease_expires_at: Some(later(60)),
        external_ref: format!("idem-{}", hex(16)),
        ..Entry::default()
    };
    let finished = |run_id: &str| Entry {
        status: EntryStatus::Succeeded as i32,
        result: Bytes::from_static(RESULT),
        finished_at: Some(later(0)),
        expires_at: Some(later(86_400)),
        ..entry(run_id)
    };
    let claim_request = |run_id: &str| ClaimRequest {
        run_id: run_id.to_string(),
        tool: TOOL.to_string(),
        arguments_json: ARGUMENTS.to_string(),
        ..ClaimRequest::default()
    };
    let sizes: Vec<(usize, usize)> = match of {
        FloorOf::ClaimComplete => {
            let run_id = format!("bench-{run_tag}-c0-1000");
            let claimed = ClaimResponse {
                outcome: Outcome::Claimed as i32,
                entry: Some(entry(&run_id)),
                claim_token: hex(32),
                ..ClaimResponse::default()
            };
            let complete = CompleteRequest {
                key: hex(64),
                claim_token: hex(32),
                status: EntryStatus::Succeeded as i32,
                result: Bytes::from_static(RESULT),
                view: view.entry_view().into(),
                ..CompleteRequest::default()
            };
            let mut completed = CompleteResponse {
                entry: Some(finished(&run_id)),
                already_completed: false,
            };
            if let (View::Basic, Some(entry)) = (view, &mut completed.entry) {
                entry.result = Bytes::new(); // the basic view leaves out the result sent
            }
            vec![
                (claim_request(&run_id).encoded_len(), claimed.encoded_len()),
                (complete.encoded_len(), completed.encoded_len()),
            ]
        }
        FloorOf::Replay => {
            let run_id = format!("bench-{run_tag}-hot-10");
            let replayed = ClaimResponse {
                outcome: Outcome::Replayed as i32,
                entry: Some(Entry {
                    replay_count: 1000,
                    ..finished(&run_id)
                }),
                note: REPLAY_NOTE.to_string(),
                ..ClaimResponse::default()
            };
            vec![(claim_request(&run_id).encoded_len(), replayed.encoded_len())]
        }
    };
    sizes
        .into_iter()
        .map(|(request, response)| {
            let payload = filler(request, |n| {
                floor_pb::CallRequest {
                    payload: Bytes::from(vec![0; n]),
                    // Any value of the same varint length as the one sent.
                    response_payload_bytes: response as u32,
                }
                .encoded_len()
            });
            let response_payload = filler(response, |n| {
                floor_pb::CallResponse {
                    payload: Bytes::from(vec![0; n]),
                }
                .encoded_len()
            });
            (Bytes::from(vec![0; payload]), response_payload as u32)
        })
        .collect()
}

/// The longest filler `n` whose message, `len(n)`, encodes to at most `target` bytes.
fn filler(target: usize, len: impl Fn(usize) -> usize) -> usize {
    (0..=target).rev().find(|&n| len(n) <= target).unwrap_or(0)
}

/// The note the server attaches to a replay within a run (crates/core/src/ledger/notes.rs `replay_note`).
const REPLAY_NOTE: &str = "This action was already performed in this run; returning the \
    earlier result. No new action was taken.";

/// The kinds of RPC whose encoded sizes are reported.
#[derive(Clone, Copy)]
pub(crate) enum RpcKind {
    ClaimClaimed,
    ClaimReplayed,
    Complete,
    Lookup,
    FloorFirst,
    FloorSecond,
}

const RPC_KINDS: [(RpcKind, &str); 6] = [
    (RpcKind::ClaimClaimed, "Claim (CLAIMED)"),
    (RpcKind::ClaimReplayed, "Claim (REPLAYED)"),
    (RpcKind::Complete, "Complete"),
    (RpcKind::Lookup, "Lookup"),
    (RpcKind::FloorFirst, "Floor call 1"),
    (RpcKind::FloorSecond, "Floor call 2"),
];

/// The first (request, response) encoded sizes seen of each kind, indexed by `RpcKind`.
static RPC_BYTES: [OnceLock<[usize; 2]>; 6] = [const { OnceLock::new() }; 6];

pub(crate) fn note_bytes(kind: RpcKind, request: usize, response: &impl Message) {
    let slot = &RPC_BYTES[kind as usize];
    if slot.get().is_none() {
        let _ = slot.set([request, response.encoded_len()]);
    }
}

/// The sizes seen so far, by the kind's name.
pub(crate) fn rpc_bytes() -> BTreeMap<String, [usize; 2]> {
    RPC_KINDS
        .iter()
        .filter_map(|&(kind, name)| Some((name.to_string(), *RPC_BYTES[kind as usize].get()?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_s_calls_encode_to_the_ledger_s_sizes_within_a_few_bytes() {
        for (of, calls) in [(FloorOf::ClaimComplete, 2), (FloorOf::Replay, 1)] {
            let floor = floor_calls(of, View::Basic, "1234-1700000000000");
            assert_eq!(floor.len(), calls);
            for (payload, response) in floor {
                assert!(!payload.is_empty() && response > 50, "{of:?}");
            }
        }
    }

    #[test]
    fn the_filler_is_the_longest_that_fits() {
        assert_eq!(filler(10, |n| n + 2), 8);
        assert_eq!(filler(1, |n| n + 2), 0);
    }
}
