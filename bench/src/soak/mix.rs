//! The soak's load: clients running a mix of claim-complete, replays, held claims and the
//! claims that wait for them, lookups and attempts left UNKNOWN, with one reconciler settling
//! those; every client opens a new connection now and then, so accepted connections come and
//! go as they do in production.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotency_ledger::grpc::pb::ledger_service_client::LedgerServiceClient;
use idempotency_ledger::grpc::pb::{
    ClaimRequest, ClaimResponse, CompleteRequest, LookupRequest, Outcome, ReconcileRequest,
    Resolution, Status as EntryStatus,
};
use idempotency_ledger::proto::code_name;
use tonic::transport::{Channel, Endpoint};

use crate::load::{ARGUMENTS, RESULT, TOOL};

/// The kinds of operation, in the order of [`Counts::ops`].
pub const KINDS: [&str; 7] = [
    "claim-complete",
    "replay",
    "hold",
    "wait",
    "lookup",
    "unknown",
    "reconciled",
];
/// Percent of operations of each kind a client draws (the reconciler's are its own).
const WEIGHTS: [u32; 6] = [45, 20, 10, 10, 10, 5];
/// Completed keys the replays and lookups pick from.
const HOT_KEYS: usize = 100;
/// How long a holder keeps its claim (the tool running).
const HOLD: Duration = Duration::from_millis(20);
/// The wait a waiting Claim carries.
const WAIT: Duration = Duration::from_secs(5);
/// Deadline of each call.
const TIMEOUT: Duration = Duration::from_secs(30);
/// How often the reconciler asks for unresolved entries.
const RECONCILE_EVERY: Duration = Duration::from_secs(1);

/// Operations done and failures seen, shared by the clients.
#[derive(Default)]
pub struct Counts {
    /// Successful operations by kind ([`KINDS`]).
    pub ops: [AtomicU64; 7],
    /// Failures by gRPC code (or `UNEXPECTED_<OUTCOME>`).
    pub errors: Mutex<BTreeMap<String, u64>>,
}

impl Counts {
    /// All successful operations so far.
    pub fn total(&self) -> u64 {
        self.ops.iter().map(|o| o.load(Ordering::Relaxed)).sum()
    }

    fn failed(&self, code: String) {
        if let Ok(mut errors) = self.errors.lock() {
            *errors.entry(code).or_default() += 1;
        }
    }
}

/// What the clients share.
struct Shared {
    endpoint: Endpoint,
    run_tag: String,
    hot: Vec<String>,
    held: Mutex<Vec<String>>,
    counts: Arc<Counts>,
    stop: Arc<AtomicBool>,
    reconnect_every: u64,
}

type Client = LedgerServiceClient<Channel>;

fn failure(s: &tonic::Status) -> String {
    code_name(s.code()).to_string()
}

async fn claim(
    client: &mut Client,
    run_id: &str,
    wait: Option<Duration>,
) -> Result<ClaimResponse, String> {
    let mut request = tonic::Request::new(ClaimRequest {
        run_id: run_id.to_string(),
        tool: TOOL.to_string(),
        arguments_json: ARGUMENTS.to_string(),
        wait: wait.and_then(|w| prost_types::Duration::try_from(w).ok()),
        ..ClaimRequest::default()
    });
    request.set_timeout(TIMEOUT);
    Ok(client
        .claim(request)
        .await
        .map_err(|s| failure(&s))?
        .into_inner())
}

async fn complete(
    client: &mut Client,
    claimed: ClaimResponse,
    status: EntryStatus,
) -> Result<(), String> {
    if claimed.outcome() != Outcome::Claimed {
        return Err(format!(
            "UNEXPECTED_{}",
            claimed
                .outcome()
                .as_str_name()
                .trim_start_matches("OUTCOME_")
        ));
    }
    let succeeded = status == EntryStatus::Succeeded;
    let mut request = tonic::Request::new(CompleteRequest {
        key: claimed.entry.map(|e| e.key).unwrap_or_default(),
        claim_token: claimed.claim_token,
        status: status as i32,
        result: if succeeded {
            RESULT.to_vec().into()
        } else {
            Default::default()
        },
        error: if succeeded {
            String::new()
        } else {
            "the soak does not know".into()
        },
        ..CompleteRequest::default()
    });
    request.set_timeout(TIMEOUT);
    client.complete(request).await.map_err(|s| failure(&s))?;
    Ok(())
}

/// Creates the hot set: [`HOT_KEYS`] completed entries; returns their run ids.
async fn hot_set(endpoint: &Endpoint, run_tag: &str) -> Result<Vec<String>, String> {
    let mut client = Client::new(endpoint.connect().await.map_err(|e| e.to_string())?);
    let mut hot = Vec::with_capacity(HOT_KEYS);
    for i in 0..HOT_KEYS {
        let run_id = format!("soak-{run_tag}-hot-{i}");
        let claimed = claim(&mut client, &run_id, None).await?;
        complete(&mut client, claimed, EntryStatus::Succeeded).await?;
        hot.push(run_id);
    }
    Ok(hot)
}

/// One operation of kind `kind` (an index into [`KINDS`]).
async fn operation(
    client: &mut Client,
    shared: &Shared,
    kind: usize,
    fresh: String,
    pick: usize,
) -> Result<usize, String> {
    match kind {
        1 => {
            let r = claim(client, &shared.hot[pick % shared.hot.len()], None).await?;
            (r.outcome() == Outcome::Replayed)
                .then_some(1)
                .ok_or_else(|| format!("UNEXPECTED_{}", r.outcome().as_str_name()))
        }
        2 => {
            let claimed = claim(client, &fresh, None).await?;
            let held = || shared.held.lock().map_err(|_| "POISONED".to_string());
            held()?.push(fresh.clone());
            tokio::time::sleep(HOLD).await;
            // Withdrawn before completing, so a waiter only takes a key that is still held.
            held()?.retain(|h| *h != fresh);
            complete(client, claimed, EntryStatus::Succeeded).await?;
            Ok(2)
        }
        3 => {
            let target = shared.held.lock().map_err(|_| "POISONED")?.pop();
            match target {
                Some(run_id) => {
                    let r = claim(client, &run_id, Some(WAIT)).await?;
                    match r.outcome() {
                        Outcome::Replayed | Outcome::InProgress => Ok(3),
                        other => Err(format!("UNEXPECTED_{}", other.as_str_name())),
                    }
                }
                None => Box::pin(operation(client, shared, 0, fresh, pick)).await,
            }
        }
        4 => {
            let mut request = tonic::Request::new(LookupRequest {
                run_id: shared.hot[pick % shared.hot.len()].clone(),
                tool: TOOL.to_string(),
                arguments_json: ARGUMENTS.to_string(),
                ..LookupRequest::default()
            });
            request.set_timeout(TIMEOUT);
            client.lookup(request).await.map_err(|s| failure(&s))?;
            Ok(4)
        }
        5 => {
            let claimed = claim(client, &fresh, None).await?;
            complete(client, claimed, EntryStatus::Unknown).await?;
            Ok(5)
        }
        _ => {
            let claimed = claim(client, &fresh, None).await?;
            complete(client, claimed, EntryStatus::Succeeded).await?;
            Ok(0)
        }
    }
}

async fn run_client(id: usize, shared: Arc<Shared>) {
    let mut rng = fastrand::Rng::new();
    let mut n = 0u64;
    while !shared.stop.load(Ordering::Relaxed) {
        let mut client = match shared.endpoint.connect().await {
            Ok(channel) => Client::new(channel),
            Err(_) => {
                shared.counts.failed("CONNECT".into());
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        for _ in 0..shared.reconnect_every {
            if shared.stop.load(Ordering::Relaxed) {
                return;
            }
            n += 1;
            let draw = rng.u32(..100);
            let mut kind = 0;
            let mut bound = 0;
            for (k, w) in WEIGHTS.iter().enumerate() {
                bound += w;
                if draw < bound {
                    kind = k;
                    break;
                }
            }
            let fresh = format!("soak-{}-c{id}-{n}", shared.run_tag);
            match operation(&mut client, &shared, kind, fresh, rng.usize(..)).await {
                Ok(done) => {
                    shared.counts.ops[done].fetch_add(1, Ordering::Relaxed);
                }
                Err(code) => {
                    shared.counts.failed(code);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
}

/// The reconciler: every second, the unresolved entries handed out last time are resolved as
/// SUCCEEDED (the soak's outside world always finds the effect), and new ones are taken.
async fn reconciler(shared: Arc<Shared>) {
    let mut pending: Vec<String> = Vec::new();
    let mut client = None;
    while !shared.stop.load(Ordering::Relaxed) {
        tokio::time::sleep(RECONCILE_EVERY).await;
        if client.is_none() {
            client = shared.endpoint.connect().await.ok().map(Client::new);
        }
        let Some(c) = client.as_mut() else { continue };
        let resolutions: Vec<Resolution> = pending
            .iter()
            .map(|key| Resolution {
                key: key.clone(),
                status: EntryStatus::Succeeded as i32,
                result: RESULT.to_vec().into(),
                ..Resolution::default()
            })
            .collect();
        let mut request = tonic::Request::new(ReconcileRequest {
            limit: 100,
            resolutions,
            principal: "soak-reconciler".into(),
            ..ReconcileRequest::default()
        });
        request.set_timeout(TIMEOUT);
        match c.reconcile(request).await {
            Ok(r) => {
                let r = r.into_inner();
                shared.counts.ops[6].fetch_add(r.resolved.len() as u64, Ordering::Relaxed);
                pending = r.pending.into_iter().map(|e| e.key).collect();
            }
            Err(s) => {
                shared.counts.failed(format!("RECONCILE_{}", failure(&s)));
                client = None;
            }
        }
    }
}

/// Runs `clients` clients and the reconciler against `endpoint` until `stop` is set; each
/// client opens a new connection every `reconnect_every` operations.
///
/// # Errors
///
/// When the hot set cannot be created.
pub async fn run(
    endpoint: Endpoint,
    clients: usize,
    reconnect_every: u64,
    counts: Arc<Counts>,
    stop: Arc<AtomicBool>,
) -> Result<(), String> {
    let run_tag = format!("{}-{}", std::process::id(), crate::host::unix_now());
    let hot = hot_set(&endpoint, &run_tag).await?;
    let shared = Arc::new(Shared {
        endpoint,
        run_tag,
        hot,
        held: Mutex::new(Vec::new()),
        counts,
        stop,
        reconnect_every: reconnect_every.max(1),
    });
    let mut tasks: Vec<_> = (0..clients)
        .map(|id| tokio::spawn(run_client(id, shared.clone())))
        .collect();
    tasks.push(tokio::spawn(reconciler(shared.clone())));
    for task in tasks {
        let _ = task.await;
    }
    Ok(())
}
