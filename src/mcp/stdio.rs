//! The stdio transport: the client starts the gateway (`idempotency-ledger mcp -- COMMAND …`,
//! the line a desktop client's configuration holds), and the gateway starts COMMAND as the
//! upstream, one JSON-RPC message a line both ways.
//!
//! Every message but a governed `tools/call` goes on unchanged, with its own id: requests,
//! notifications (a cancellation too), the upstream's requests to the client and the client's
//! answers. A governed call goes to the upstream only once the ledger claimed it ([`super::govern`]).
//! The gateway restarts an upstream that exits (after a pause that grows while it keeps
//! exiting), introducing the client again with the `initialize` it sent first (a session-based
//! revision's), and answers what the dead upstream left unanswered: a governed call as unknown,
//! never sent again, any other request with an error. When the client goes away (its end of
//! stdin closes) or the gateway is told to stop, the upstream is stopped: its stdin closed, then
//! SIGTERM, then SIGKILL.

use std::collections::HashMap;
use std::ffi::OsString;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, AsyncRead, AsyncWrite, AsyncWriteExt as _, BufReader};
use tokio::sync::{mpsc, oneshot, watch};

use super::govern::{Answer, Gateway, Upstream};
use super::rpc::{self, Kind};
use child::{spawn_upstream, supervise};

mod child;

/// How long a governed call the client cancelled still waits for the upstream's answer,
/// which records its outcome if it comes (a cancellation does not prove nothing happened).
const CANCEL_GRACE: Duration = Duration::from_secs(5);
/// How long the gateway waits for its own requests (the re-introduction after a restart, the
/// question of the upstream's name).
const OWN_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a person at the client is waited for (the call waits meanwhile); past it the
/// call reads that a person has been asked, and an approver may decide elsewhere.
pub(crate) const ASK_AT_MOST: Duration = Duration::from_secs(600);
/// How long the tool calls in flight may take to finish once the client went away (or the
/// gateway was told to stop), before the upstream is stopped under them.
const DRAIN_GRACE: Duration = Duration::from_secs(10);

/// What became of a request sent on to the upstream, while its answer is awaited.
enum Pending {
    /// The client's: its answer goes back to the client, and the gateway reads what it
    /// teaches (the upstream's name, its tools' hints).
    Client(Observe),
    /// A governed call's, or the gateway's own: its answer goes to the one waiting for it.
    Waiting(oneshot::Sender<Answer>),
}

/// What the gateway learns from the answer to a client's request.
#[derive(Clone, Copy)]
enum Observe {
    Nothing,
    Initialize,
    Discover,
    ToolsList,
}

/// The routing between the client and the upstream, shared by the tasks that read either side.
struct Router {
    gateway: Arc<Gateway>,
    /// Lines to the client's stdout, in order.
    to_client: mpsc::UnboundedSender<Value>,
    /// Messages for the upstream, drained by its current incarnation.
    to_upstream: mpsc::UnboundedSender<Value>,
    /// The requests sent on whose answers are awaited, by id.
    pending: Mutex<HashMap<String, Pending>>,
    /// The tool calls in flight, by id: turned true when the client cancels one; and whether
    /// it is governed.
    cancels: Mutex<HashMap<String, (watch::Sender<bool>, bool)>>,
    /// The client's `initialize` and `notifications/initialized` (a session-based revision's),
    /// sent again to an upstream that restarted.
    introduction: Mutex<Option<(Value, Option<Value>)>>,
    /// The number of the gateway's next own request.
    own: AtomicU64,
    /// The gateway's own requests to the client (a person asked about a gated call), by id:
    /// the client's response goes to the one waiting, never to the upstream.
    asking: Mutex<HashMap<String, oneshot::Sender<Value>>>,
    /// Set when the client's `initialize` said it can be asked (`capabilities.elicitation`).
    client_can_be_asked: AtomicBool,
    /// Set once the gateway stops: an upstream that exits is not restarted.
    stopping: AtomicBool,
}

/// Runs the gateway over the client's `input` and `output` with the upstream `command`, until
/// the client closes `input` or `shutdown` resolves; the upstream is stopped then.
///
/// # Errors
/// The upstream cannot be started at all (its first start).
pub async fn serve(
    gateway: Arc<Gateway>,
    command: Vec<OsString>,
    input: impl AsyncRead + Unpin + Send + 'static,
    output: impl AsyncWrite + Unpin + Send + 'static,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), String> {
    let (to_client, client_lines) = mpsc::unbounded_channel();
    let (to_upstream, upstream_queue) = mpsc::unbounded_channel();
    let router = Arc::new(Router {
        gateway,
        to_client,
        to_upstream,
        pending: Mutex::default(),
        cancels: Mutex::default(),
        introduction: Mutex::default(),
        own: AtomicU64::new(1),
        asking: Mutex::default(),
        client_can_be_asked: AtomicBool::new(false),
        stopping: AtomicBool::new(false),
    });
    let writer = tokio::spawn(write_lines(output, client_lines));
    let first = spawn_upstream(&command)?;
    let (stop_upstream, stopped) = watch::channel(false);
    let supervisor = tokio::spawn(supervise(
        router.clone(),
        command,
        first,
        upstream_queue,
        stopped,
    ));
    tokio::select! {
        () = read_client(router.clone(), input) => {
            tracing::info!("the client closed its end: stopping the upstream");
        }
        () = shutdown => tracing::info!("told to stop: stopping the upstream"),
    }
    // The calls in flight finish first, within a bound: an upstream stopped under a call that
    // acted would leave its outcome unknown for no reason.
    let drained = tokio::time::timeout(DRAIN_GRACE, async {
        while !router.lock_cancels().is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            "calls were still in flight when the upstream was stopped: their outcomes are unknown"
        );
    }
    router.stopping.store(true, Ordering::SeqCst);
    let _ = stop_upstream.send(true);
    let _ = supervisor.await;
    // What is still owed to the client is said before the output closes.
    drop(router);
    let _ = writer.await;
    Ok(())
}

/// Writes each message as one line, flushed, until every sender is gone.
async fn write_lines(
    mut output: impl AsyncWrite + Unpin,
    mut lines: mpsc::UnboundedReceiver<Value>,
) {
    while let Some(message) = lines.recv().await {
        let mut line = message.to_string().into_bytes();
        line.push(b'\n');
        if output.write_all(&line).await.is_err() || output.flush().await.is_err() {
            tracing::info!("the client's end closed: its answers are dropped");
            return;
        }
    }
}

/// Reads the client's messages, one a line, until its end closes.
async fn read_client(router: Arc<Router>, input: impl AsyncRead + Unpin) {
    let mut lines = BufReader::new(input).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Value>(&line) {
            Ok(message) => router.route_client(message),
            Err(e) => router.answer_client(rpc::error(
                None,
                rpc::PARSE_ERROR,
                &format!("not JSON: {e}; nothing was sent on"),
            )),
        }
    }
}

impl Router {
    /// Routes one message of the client's.
    fn route_client(self: &Arc<Self>, message: Value) {
        match rpc::kind(&message) {
            Kind::Request { id, method } => {
                self.learn_client(&message);
                let id = id.clone();
                if method == "tools/call" {
                    self.call_tool(message, id);
                    return;
                }
                let observe = match method {
                    "initialize" => {
                        self.remember_introduction(&message);
                        Observe::Initialize
                    }
                    "server/discover" => Observe::Discover,
                    "tools/list" => Observe::ToolsList,
                    _ => Observe::Nothing,
                };
                self.await_answer(&id, Pending::Client(observe));
                self.send_upstream(message);
            }
            Kind::Notification { method } => {
                match method {
                    "notifications/initialized" => self.remember_initialized(&message),
                    // A governed call's cancellation stays here (see govern's act).
                    "notifications/cancelled" if self.cancel(&message) => return,
                    _ => {}
                }
                self.send_upstream(message);
            }
            Kind::Response { id } => {
                let asked = self.lock_asking().remove(&rpc::id_key(id));
                match asked {
                    Some(waiter) => {
                        let _ = waiter.send(message);
                    }
                    None => self.send_upstream(message),
                }
            }
            Kind::Batch => self.batch(message),
            Kind::Invalid(why) => {
                let id = message
                    .get("id")
                    .filter(|id| id.is_string() || id.is_number());
                self.answer_client(rpc::error(
                    id,
                    rpc::INVALID_REQUEST,
                    &format!("{why}; nothing was sent on"),
                ));
            }
        }
    }

    /// A batch (JSON-RPC arrays, of the 2025-03-26 revision only) goes on as it is, unless it
    /// holds a `tools/call`, which must go through the ledger: then it is refused whole.
    fn batch(&self, message: Value) {
        let calls_a_tool = message.as_array().is_some_and(|items| {
            items
                .iter()
                .any(|m| m.get("method").and_then(Value::as_str) == Some("tools/call"))
        });
        if calls_a_tool {
            self.answer_client(rpc::error(
                None,
                rpc::INVALID_REQUEST,
                "a batch holding tools/call is refused by the idempotency gateway: send each call \
                 on its own; nothing was sent on",
            ));
        } else {
            self.send_upstream(message);
        }
    }

    /// A `tools/call`: answered by the gateway in a task of its own (a governed call may wait
    /// for the ledger, a person's decision or the upstream).
    fn call_tool(self: &Arc<Self>, message: Value, id: Value) {
        let (cancel, cancelled) = watch::channel(false);
        let governed = self.gateway.governs(&message);
        self.lock_cancels()
            .insert(rpc::id_key(&id), (cancel, governed));
        let router = self.clone();
        tokio::spawn(async move {
            let handle = UpstreamHandle(router.clone());
            let answer = router
                .gateway
                .call_tool(None, message, &id, &handle, cancelled)
                .await;
            let cancelled = router
                .lock_cancels()
                .remove(&rpc::id_key(&id))
                .is_some_and(|(cancel, _)| *cancel.borrow());
            // A request the client cancelled is not answered (the protocol's rule), whoever
            // answered it: the upstream, or the ledger (a replay, a call in progress).
            if let Some(answer) = answer
                && !cancelled
            {
                router.answer_client(answer);
            }
        });
    }

    /// The client named itself (in its `initialize`, or a stateless request's `_meta`).
    fn learn_client(&self, message: &Value) {
        let name = message
            .pointer("/params/clientInfo/name")
            .or_else(|| message.pointer("/params/_meta/io.modelcontextprotocol~1clientInfo/name"))
            .and_then(Value::as_str);
        if let Some(name) = name {
            self.gateway.learn_client(name);
        }
    }

    fn remember_introduction(&self, message: &Value) {
        let can_be_asked = message
            .pointer("/params/capabilities/elicitation")
            .is_some_and(Value::is_object);
        self.client_can_be_asked
            .store(can_be_asked, Ordering::SeqCst);
        *self.lock_introduction() = Some((message.clone(), None));
    }

    fn remember_initialized(&self, message: &Value) {
        if let Some((_, initialized)) = self.lock_introduction().as_mut() {
            *initialized = Some(message.clone());
        }
    }

    /// The client cancelled a request: a tool call in flight learns it. `true` when the call
    /// is governed: its cancellation is not passed on.
    fn cancel(&self, message: &Value) -> bool {
        let Some(id) = message.pointer("/params/requestId") else {
            return false;
        };
        match self.lock_cancels().get(&rpc::id_key(id)) {
            Some((cancel, governed)) => {
                let _ = cancel.send(true);
                *governed
            }
            None => false,
        }
    }

    /// Reads what an answer to the client's request teaches the gateway.
    fn observe(&self, observe: Observe, result: &Value) {
        match observe {
            Observe::Nothing => {}
            Observe::Initialize => {
                if let Some(name) = result.pointer("/serverInfo/name").and_then(Value::as_str) {
                    self.gateway.learn_upstream(name);
                }
            }
            Observe::Discover => self.gateway.learn_from_discover(result),
            Observe::ToolsList => self.gateway.learn_tools(result),
        }
    }

    /// Routes one message of the upstream's.
    fn route_upstream(&self, message: Value) {
        let Kind::Response { id } = rpc::kind(&message) else {
            // Its requests and notifications to the client, and anything else it says.
            self.answer_client(message);
            return;
        };
        // The stateless revision stamps the server's name on every result's _meta.
        if let Some(name) = message
            .pointer("/result/_meta/io.modelcontextprotocol~1serverInfo/name")
            .and_then(Value::as_str)
        {
            self.gateway.learn_upstream(name);
        }
        let pending = self.lock_pending().remove(&rpc::id_key(id));
        match pending {
            Some(Pending::Client(observe)) => {
                if let Some(result) = message.get("result") {
                    self.observe(observe, result);
                }
                self.answer_client(message);
            }
            Some(Pending::Waiting(waiter)) => {
                let _ = waiter.send(Answer::Response(message));
            }
            None => tracing::info!(
                id = %id,
                "the upstream answered a request nobody waits for any more: dropped"
            ),
        }
    }

    /// Everything the upstream that exited left unanswered: a governed call (or the gateway's
    /// own request) learns its answer is lost; a client's request is answered with an error.
    fn upstream_gone(&self, why: &str) {
        let pending: Vec<(String, Pending)> = self.lock_pending().drain().collect();
        for (id, pending) in pending {
            match pending {
                Pending::Waiting(waiter) => {
                    let _ = waiter.send(Answer::Lost(why.to_string()));
                }
                Pending::Client(_) => {
                    let id: Value = serde_json::from_str(&id).unwrap_or(Value::Null);
                    self.answer_client(rpc::error(
                        Some(&id),
                        rpc::UNAVAILABLE,
                        &format!("{why}; the request may or may not have been carried out"),
                    ));
                }
            }
        }
    }

    fn await_answer(&self, id: &Value, pending: Pending) {
        self.lock_pending().insert(rpc::id_key(id), pending);
    }

    fn send_upstream(&self, message: Value) {
        // The queue lives as long as the router; a send fails only while the gateway stops.
        let _ = self.to_upstream.send(message);
    }

    fn answer_client(&self, message: Value) {
        let _ = self.to_client.send(message);
    }

    fn lock_pending(&self) -> std::sync::MutexGuard<'_, HashMap<String, Pending>> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn lock_cancels(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, (watch::Sender<bool>, bool)>> {
        self.cancels
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn lock_asking(&self) -> std::sync::MutexGuard<'_, HashMap<String, oneshot::Sender<Value>>> {
        self.asking
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn lock_introduction(&self) -> std::sync::MutexGuard<'_, Option<(Value, Option<Value>)>> {
        self.introduction
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The upstream as a governed call sees it: a request in, its answer out.
struct UpstreamHandle(Arc<Router>);

#[async_trait]
impl Upstream for UpstreamHandle {
    async fn call(&self, request: Value, mut cancelled: watch::Receiver<bool>) -> Answer {
        let Some(id) = request.get("id").cloned() else {
            return Answer::NotSent("a request without an id".to_string());
        };
        let (waiter, answer) = oneshot::channel();
        self.0.await_answer(&id, Pending::Waiting(waiter));
        // Checked after it waits: once the gateway stops, nothing drains the queue, and what
        // waited before is answered by the stop itself.
        if self.0.stopping.load(Ordering::SeqCst) {
            self.0.lock_pending().remove(&rpc::id_key(&id));
            return Answer::NotSent("the gateway is stopping".to_string());
        }
        self.0.send_upstream(request);
        let mut answer = answer;
        tokio::select! {
            got = &mut answer => return got.unwrap_or_else(|_| Answer::Lost("the gateway stopped".to_string())),
            _ = cancelled.wait_for(|c| *c) => {}
        }
        // Cancelled after it was sent: an answer that still comes records the outcome.
        match tokio::time::timeout(CANCEL_GRACE, answer).await {
            Ok(Ok(got)) => got,
            _ => {
                self.0.lock_pending().remove(&rpc::id_key(&id));
                Answer::Lost("the client cancelled the call after it was sent".to_string())
            }
        }
    }

    async fn elicit(&self, params: Value, mut cancelled: watch::Receiver<bool>) -> Option<Value> {
        if !self.0.client_can_be_asked.load(Ordering::SeqCst) {
            return None;
        }
        let n = self.0.own.fetch_add(1, Ordering::Relaxed);
        let id = Value::String(format!("idempotency-ledger-gateway:elicit:{n}"));
        let (waiter, response) = oneshot::channel();
        self.0.lock_asking().insert(rpc::id_key(&id), waiter);
        self.0.answer_client(serde_json::json!({
            "jsonrpc": "2.0",
            "id": id,
            "method": "elicitation/create",
            "params": params,
        }));
        let answered = tokio::select! {
            got = response => got.ok(),
            _ = cancelled.wait_for(|c| *c) => None,
            () = tokio::time::sleep(ASK_AT_MOST) => None,
        };
        self.0.lock_asking().remove(&rpc::id_key(&id));
        answered.and_then(|response| response.get("result").cloned())
    }
}
