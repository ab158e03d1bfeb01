//! The operations: what each client does, one at a time, and how each RPC is made and timed.

use std::error::Error;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use idempotency_ledger::grpc::pb::{
    ClaimRequest, ClaimResponse, CompleteRequest, LookupRequest, Outcome, Status as EntryStatus,
};
use idempotency_ledger::proto::code_name;
use prost::Message;
use prost::bytes::Bytes;
use sha2::Digest;
use tokio::time::Instant;
use tonic::Request;

use super::sizes::{RpcKind, note_bytes};
use super::tally::{CLAIM, COMPLETE, OP, Sample, Tally, WAIT};
use super::{ARGUMENTS, Auth, Client, RESULT, Shared, TOOL, View, Workload};
use crate::floor_pb;

/// Creates --hot-keys completed entries, with up to 8 clients at once.
pub(super) async fn create_hot_set(
    shared: &Shared,
    clients: &[Client],
) -> Result<Vec<(String, String)>, Box<dyn Error>> {
    let n = shared.args.hot_keys.max(1);
    let workers = clients.len().min(8);
    let mut tasks = Vec::with_capacity(workers);
    for (w, client) in clients.iter().take(workers).enumerate() {
        let mut client = client.clone();
        let run_ids: Vec<String> = (w..n)
            .step_by(workers)
            .map(|i| format!("bench-{}-hot-{i}", shared.run_tag))
            .collect();
        let (auth, timeout, view) = (shared.auth.clone(), shared.args.timeout, shared.args.view);
        tasks.push(tokio::spawn(async move {
            let mut hot = Vec::with_capacity(run_ids.len());
            for run_id in run_ids {
                let (claim, _) = claim(&mut client, &auth, timeout, &run_id, None).await?;
                expect(&claim, Outcome::Claimed).map_err(|e| format!("{run_id}: {e}"))?;
                let key = claim.entry.map(|e| e.key).unwrap_or_default();
                complete(&mut client, &auth, (timeout, view), &key, claim.claim_token).await?;
                hot.push((run_id, key));
            }
            Ok::<_, String>(hot)
        }));
    }
    let mut hot = Vec::with_capacity(n);
    for task in tasks {
        hot.extend(
            task.await?
                .map_err(|e| format!("creating the hot set: {e}"))?,
        );
    }
    Ok(hot)
}

pub(super) async fn run_client(
    id: usize,
    mut client: Client,
    shared: Arc<Shared>,
    mut tally: Tally,
    mut rng: fastrand::Rng,
) -> Tally {
    let mut n = 0u64;
    loop {
        let start = Instant::now();
        let measured = start >= shared.measure_from;
        if measured {
            if shared.stop_at.is_some_and(|stop| start >= stop) {
                break;
            }
            if shared.args.count.is_some()
                && shared
                    .budget
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(1))
                    .is_err()
            {
                break;
            }
        }
        n += 1;
        let result = operation(&mut client, &shared, id, n, &mut rng).await;
        if measured {
            tally.record(result, Instant::now());
        } else if result.is_err() {
            // Failing already in the warm-up: do not spin.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    tally
}

async fn operation(
    client: &mut Client,
    shared: &Shared,
    id: usize,
    n: u64,
    rng: &mut fastrand::Rng,
) -> Result<Sample, String> {
    let args = &shared.args;
    let fresh = || format!("bench-{}-c{id}-{n}", shared.run_tag);
    let hot = |rng: &mut fastrand::Rng| &shared.hot[rng.usize(..shared.hot.len())];
    match args.workload {
        Workload::ClaimComplete => claim_complete(client, shared, &fresh(), None).await,
        Workload::Replay => {
            let (run_id, _) = hot(rng);
            let (r, took) = claim(client, &shared.auth, args.timeout, run_id, None).await?;
            expect(&r, Outcome::Replayed)?;
            Ok(Sample::single(took, "REPLAYED"))
        }
        Workload::Lookup => {
            let key = if args.preloaded > 0 {
                let i = rng.u64(..args.preloaded);
                hex::encode(sha2::Sha256::digest(format!(
                    "{}{i}",
                    args.preloaded_prefix
                )))
            } else {
                hot(rng).1.clone()
            };
            let request = LookupRequest {
                key,
                ..LookupRequest::default()
            };
            let request_len = request.encoded_len();
            let start = Instant::now();
            let response = client
                .ledger
                .lookup(request_with(&shared.auth, args.timeout, request))
                .await
                .map_err(|s| code_name(s.code()).to_string())?;
            let took = start.elapsed();
            note_bytes(RpcKind::Lookup, request_len, response.get_ref());
            Ok(Sample::single(took, "FOUND"))
        }
        Workload::Floor => floor_op(client, shared).await,
        Workload::MixedWait => {
            let draw = rng.u32(..100);
            if draw < args.wait_percent {
                let target = shared.held.lock().map_err(|_| "POISONED")?.pop();
                if let Some(run_id) = target {
                    let wait = Some(args.wait);
                    let (r, took) =
                        claim(client, &shared.auth, args.timeout, &run_id, wait).await?;
                    let outcome = match r.outcome() {
                        Outcome::Replayed => "WAITED_REPLAYED",
                        Outcome::InProgress => "WAITED_IN_PROGRESS",
                        other => return Err(format!("UNEXPECTED_{}", outcome_name(other))),
                    };
                    let mut sample = Sample::single(took, outcome);
                    sample.times[WAIT] = Some(took);
                    return Ok(sample);
                }
            } else if draw < args.wait_percent + args.hold_percent {
                return claim_complete(client, shared, &fresh(), Some(args.hold_time)).await;
            }
            claim_complete(client, shared, &fresh(), None).await
        }
    }
}

/// Claims a fresh key and completes it; with `hold`, publishes the run_id for waiters and keeps
/// the claim that long first (left out of the latency).
async fn claim_complete(
    client: &mut Client,
    shared: &Shared,
    run_id: &str,
    hold: Option<Duration>,
) -> Result<Sample, String> {
    let timeout = shared.args.timeout;
    let (r, claim_took) = claim(client, &shared.auth, timeout, run_id, None).await?;
    expect(&r, Outcome::Claimed)?;
    let key = r.entry.map(|e| e.key).unwrap_or_default();
    let mut outcome = "CLAIMED_COMPLETED";
    if let Some(hold) = hold {
        let held = || shared.held.lock().map_err(|_| "POISONED".to_string());
        held()?.push(run_id.to_string());
        tokio::time::sleep(hold).await;
        // Withdrawn before completing, so a waiter only takes a key that is still held.
        held()?.retain(|h| h != run_id);
        outcome = "HELD_COMPLETED";
    }
    let call = (timeout, shared.args.view);
    let complete_took = complete(client, &shared.auth, call, &key, r.claim_token).await?;
    let mut times = [None; 4];
    times[OP] = Some(claim_took + complete_took);
    times[CLAIM] = Some(claim_took);
    times[COMPLETE] = Some(complete_took);
    Ok(Sample { times, outcome })
}

async fn claim(
    client: &mut Client,
    auth: &Auth,
    timeout: Duration,
    run_id: &str,
    wait: Option<Duration>,
) -> Result<(ClaimResponse, Duration), String> {
    let request = ClaimRequest {
        run_id: run_id.to_string(),
        tool: TOOL.to_string(),
        arguments_json: ARGUMENTS.to_string(),
        wait: wait.and_then(|w| prost_types::Duration::try_from(w).ok()),
        ..ClaimRequest::default()
    };
    let request_len = request.encoded_len();
    let start = Instant::now();
    let response = client
        .ledger
        .claim(request_with(auth, timeout, request))
        .await
        .map_err(|s| code_name(s.code()).to_string())?;
    let took = start.elapsed();
    let response = response.into_inner();
    let kind = match response.outcome() {
        Outcome::Replayed => RpcKind::ClaimReplayed,
        _ => RpcKind::ClaimClaimed,
    };
    note_bytes(kind, request_len, &response);
    Ok((response, took))
}

/// A Complete of `key`, with the call's deadline and the view it asks for.
async fn complete(
    client: &mut Client,
    auth: &Auth,
    (timeout, view): (Duration, View),
    key: &str,
    claim_token: String,
) -> Result<Duration, String> {
    let request = CompleteRequest {
        key: key.to_string(),
        claim_token,
        status: EntryStatus::Succeeded as i32,
        result: Bytes::from_static(RESULT),
        view: view.entry_view().into(),
        ..CompleteRequest::default()
    };
    let request_len = request.encoded_len();
    let start = Instant::now();
    let response = client
        .ledger
        .complete(request_with(auth, timeout, request))
        .await
        .map_err(|s| code_name(s.code()).to_string())?;
    let took = start.elapsed();
    note_bytes(RpcKind::Complete, request_len, response.get_ref());
    Ok(took)
}

/// One operation against the floor: the calls of `--floor-of`'s operation, one after the other.
async fn floor_op(client: &mut Client, shared: &Shared) -> Result<Sample, String> {
    let mut times = [None; 4];
    let mut total = Duration::ZERO;
    for (i, (payload, response_bytes)) in shared.floor_calls.iter().enumerate() {
        let request = floor_pb::CallRequest {
            payload: payload.clone(),
            response_payload_bytes: *response_bytes,
        };
        let request_len = request.encoded_len();
        let start = Instant::now();
        let response = client
            .floor
            .call(request_with(&shared.auth, shared.args.timeout, request))
            .await
            .map_err(|s| code_name(s.code()).to_string())?;
        let took = start.elapsed();
        let kind = [RpcKind::FloorFirst, RpcKind::FloorSecond][i.min(1)];
        note_bytes(kind, request_len, response.get_ref());
        total += took;
        if shared.floor_calls.len() == 2 {
            times[[CLAIM, COMPLETE][i]] = Some(took);
        }
    }
    times[OP] = Some(total);
    Ok(Sample {
        times,
        outcome: "FLOOR",
    })
}

fn request_with<T>(auth: &Auth, timeout: Duration, msg: T) -> Request<T> {
    let mut request = Request::new(msg);
    request.set_timeout(timeout);
    if let Some(auth) = auth {
        request.metadata_mut().insert("authorization", auth.clone());
    }
    request
}

fn expect(r: &ClaimResponse, wanted: Outcome) -> Result<(), String> {
    if r.outcome() == wanted {
        Ok(())
    } else {
        Err(format!("UNEXPECTED_{}", outcome_name(r.outcome())))
    }
}

fn outcome_name(o: Outcome) -> &'static str {
    o.as_str_name().trim_start_matches("OUTCOME_")
}
