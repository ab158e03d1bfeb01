//! WatchApprovals misses nothing: two servers on one PostgreSQL database (one of them a few
//! milliseconds away from it, as a server in another zone is) and sixteen writers create,
//! approve, deny and use requests while a watcher on the near server drops its stream and
//! resumes from its cursor again and again. Each event the history holds reaches the watcher
//! exactly once, its cursors rising: an event's id is taken in commit order, so no event can
//! become visible behind a cursor already delivered (the far server's transactions, which
//! take an id and commit a few milliseconds later, are what would otherwise land behind it).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idempotency_ledger::grpc::pb;
use idempotency_ledger::grpc::pb::ledger_service_client::LedgerServiceClient;
use tokio_stream::StreamExt as _;
use tonic::transport::Channel;

use crate::support::ServerProcess;
use crate::support::postgres::PgCluster;
use crate::support::proxy::Proxy;

const WRITERS: usize = 16;
const REQUESTS_PER_WRITER: usize = 6;
const ROUNDS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_watcher_resuming_from_its_cursor_sees_every_event_two_servers_and_sixteen_writers_write()
{
    let url = PgCluster::shared().create_database();
    let upstream = format!("127.0.0.1:{}", PgCluster::shared().port())
        .parse()
        .expect("addr");
    let far = Proxy::start(upstream).await;
    far.set_latency(Duration::from_millis(3));
    let servers = [
        ServerProcess::start(&url, &[]).await,
        ServerProcess::start(&far.url_for(&url), &[]).await,
    ];
    let clients = [servers[0].client().await, servers[1].client().await];
    for round in 0..ROUNDS {
        let done = Arc::new(AtomicBool::new(false));
        let watcher = tokio::spawn(watch_until_quiet(clients[0].clone(), round, done.clone()));
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| tokio::spawn(write(clients.clone(), round, w)))
            .collect();
        for writer in writers {
            writer.await.expect("writer");
        }
        done.store(true, Ordering::Release);
        let seen = watcher.await.expect("watcher");
        let expected = history_of_round(&clients[1], round).await;
        let mut counted: BTreeMap<(String, String), usize> = BTreeMap::new();
        for (key, kind) in &seen {
            *counted.entry((key.clone(), kind.clone())).or_default() += 1;
        }
        let missed: Vec<_> = expected
            .iter()
            .filter(|event| !counted.contains_key(event))
            .collect();
        let twice: Vec<_> = counted.iter().filter(|(_, n)| **n > 1).collect();
        assert!(
            missed.is_empty() && twice.is_empty(),
            "round {round}: the watcher missed {} and saw {} twice of the {} events the history \
             holds\nmissed: {missed:?}\ntwice: {twice:?}",
            missed.len(),
            twice.len(),
            expected.len()
        );
        assert_eq!(seen.len(), expected.len(), "round {round}");
    }
}

/// One writer's requests of `round`, alternating between the servers: each asked on one, then
/// approved (and used) or denied on the other.
async fn write(mut clients: [LedgerServiceClient<Channel>; 2], round: usize, writer: usize) {
    for n in 0..REQUESTS_PER_WRITER {
        let (asker, decider) = if n.is_multiple_of(2) { (0, 1) } else { (1, 0) };
        let request = pb::ClaimRequest {
            run_id: format!("round-{round}-writer-{writer}"),
            tool: "issue_refund".into(),
            arguments_json: format!(r#"{{"order":"o-{n}","amount":250}}"#),
            require_approval: true,
            ..Default::default()
        };
        let asked = clients[asker]
            .claim(request.clone())
            .await
            .expect("claim")
            .into_inner();
        assert_eq!(asked.outcome(), pb::Outcome::AwaitingApproval);
        let entry = asked.entry.expect("entry");
        let approve = !(writer + n).is_multiple_of(3);
        clients[decider]
            .decide(pb::DecideRequest {
                key: entry.key.clone(),
                fingerprint: entry.fingerprint.clone(),
                decision: if approve {
                    pb::Decision::Approve
                } else {
                    pb::Decision::Deny
                }
                .into(),
                reason: "checked".into(),
            })
            .await
            .expect("decide");
        if approve {
            let used = clients[asker]
                .claim(request)
                .await
                .expect("claim")
                .into_inner();
            assert_eq!(used.outcome(), pb::Outcome::Claimed);
        }
    }
}

/// Watches `round`'s events from the first event on, dropping the stream every few events or moments and
/// resuming from the last cursor received, until `done` is set and nothing came for a while.
/// Every (key, kind) received, in order; the cursors must rise.
async fn watch_until_quiet(
    mut client: LedgerServiceClient<Channel>,
    round: usize,
    done: Arc<AtomicBool>,
) -> Vec<(String, String)> {
    let ours = format!("round-{round}-");
    let mut seen = Vec::new();
    let mut cursor: Option<i64> = None;
    let mut quiet_since: Option<tokio::time::Instant> = None;
    let mut reconnects = 0u32;
    loop {
        let after = cursor.map_or_else(|| "0".to_owned(), |c| c.to_string());
        let mut stream = client
            .watch_approvals(pb::WatchApprovalsRequest { after })
            .await
            .expect("watch")
            .into_inner();
        reconnects += 1;
        // A few events, or a moment, then the stream is dropped, as a flaky network would.
        let limit = 3 + (reconnects % 5) as usize;
        let mut got = 0;
        while got < limit {
            match tokio::time::timeout(Duration::from_millis(150), stream.next()).await {
                Ok(Some(Ok(event))) => {
                    let at: i64 = event.cursor.parse().expect("a cursor");
                    assert!(
                        cursor.is_none_or(|c| at > c),
                        "cursor {at} after {cursor:?}: not rising"
                    );
                    cursor = Some(at);
                    let entry = event.entry.expect("the entry");
                    if entry.run_id.starts_with(&ours) {
                        seen.push((entry.key, event.kind));
                    }
                    got += 1;
                    quiet_since = None;
                }
                Ok(Some(Err(e))) => panic!("the watch failed: {e}"),
                Ok(None) | Err(_) => break,
            }
        }
        if got == 0 && done.load(Ordering::Acquire) {
            let since = *quiet_since.get_or_insert_with(tokio::time::Instant::now);
            // Longer than a server's poll for other servers' events.
            if since.elapsed() > Duration::from_secs(2) {
                return seen;
            }
        }
    }
}

/// Every approval event the history holds of `round`'s entries, as WatchApprovals names them:
/// the entries ListEntries shows, each read whole with its history.
async fn history_of_round(
    client: &LedgerServiceClient<Channel>,
    round: usize,
) -> Vec<(String, String)> {
    let mut client = client.clone();
    let mut events = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_entries(pb::ListEntriesRequest {
                page_size: 100,
                page_token: page_token.clone(),
                ..Default::default()
            })
            .await
            .expect("list")
            .into_inner();
        for entry in page.entries {
            if !entry.run_id.starts_with(&format!("round-{round}-")) {
                continue;
            }
            let found = client
                .lookup(pb::LookupRequest {
                    key: entry.key.clone(),
                    include_history: true,
                    ..Default::default()
                })
                .await
                .expect("lookup")
                .into_inner();
            for event in found.history {
                if let Some(kind) = event.kind.strip_prefix("approval_") {
                    events.push((entry.key.clone(), kind.to_owned()));
                }
            }
        }
        if page.next_page_token.is_empty() {
            return events;
        }
        page_token = page.next_page_token;
    }
}
