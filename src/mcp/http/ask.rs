//! Asking the person at a session-based client over Streamable HTTP (`--approvals-at-client`):
//! a client whose `initialize` declared `elicitation` can be sent requests on the response
//! stream of its own POST. So a governed call of such a session answers with an event stream
//! once the gateway needs to ask: its `elicitation/create` request first, then the call's
//! answer. The client POSTs its response to that request to the gateway, which hands it to the
//! call waiting for it (never to the upstream). A session this replica did not see initialized
//! (its `initialize` reached another replica) is not asked: its calls read the awaiting note,
//! and an approver decides in the console or the CLI.

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::mcp::rpc;

/// At most this many sessions are remembered as askable; past it, new sessions are not asked
/// (their calls read the awaiting note) until sessions end.
const MOST_SESSIONS: usize = 100_000;

/// What a governed call of an askable session sends its client: a question, or its answer
/// (`None`: no answer, a cancelled call).
#[derive(Debug)]
pub enum Out {
    /// The gateway's `elicitation/create` request.
    Ask(Value),
    /// The call's answer, last.
    Final(Option<Value>),
}

/// The sessions whose clients can be asked, and the questions waiting for their answers.
#[derive(Default)]
pub struct Asking {
    /// Session ids whose `initialize` declared `elicitation`.
    sessions: Mutex<HashSet<String>>,
    /// The gateway's questions in flight, by request id, each with its waiting call.
    waiting: Mutex<HashMap<String, oneshot::Sender<Value>>>,
    /// The number of the next question.
    next: AtomicU64,
}

impl Asking {
    /// Notes that `session`'s client declared it can be asked.
    pub fn note_session(&self, session: &str) {
        let mut sessions = lock(&self.sessions);
        if sessions.len() < MOST_SESSIONS {
            sessions.insert(session.to_owned());
        }
    }

    /// Forgets `session` (its client ended it).
    pub fn forget_session(&self, session: &str) {
        lock(&self.sessions).remove(session);
    }

    /// Whether `session`'s client can be asked.
    pub fn can_ask(&self, session: &str) -> bool {
        lock(&self.sessions).contains(session)
    }

    /// Hands a client's `response` to the gateway question it answers; `false` when it
    /// answers none of them (it is then the upstream's).
    pub fn answered(&self, response: &Value) -> bool {
        let Some(id) = response.get("id") else {
            return false;
        };
        match lock(&self.waiting).remove(&rpc::id_key(id)) {
            Some(call) => {
                let _ = call.send(response.clone());
                true
            }
            None => false,
        }
    }
}

/// A call's way to ask its client: the shared questions, and the call's response stream.
pub struct Asker {
    /// The questions in flight.
    pub asking: std::sync::Arc<Asking>,
    /// The call's response stream.
    pub events: mpsc::UnboundedSender<Out>,
}

impl Asker {
    /// Sends the client an `elicitation/create` request with `params` on the call's stream
    /// and waits for its result: `None` when no answer came in time, the call was cancelled
    /// or the client went away.
    pub async fn elicit(
        &self,
        params: Value,
        mut cancelled: watch::Receiver<bool>,
    ) -> Option<Value> {
        let n = self.asking.next.fetch_add(1, Ordering::Relaxed);
        let id = Value::String(format!("idempotency-ledger-gateway:elicit:{n}"));
        let (waiter, response) = oneshot::channel();
        lock(&self.asking.waiting).insert(rpc::id_key(&id), waiter);
        let question = serde_json::json!({
            "jsonrpc": "2.0",
            "id": id,
            "method": "elicitation/create",
            "params": params,
        });
        let answered = if self.events.send(Out::Ask(question)).is_ok() {
            tokio::select! {
                got = response => got.ok(),
                _ = cancelled.wait_for(|c| *c) => None,
                () = tokio::time::sleep(crate::mcp::stdio::ASK_AT_MOST) => None,
            }
        } else {
            None
        };
        lock(&self.asking.waiting).remove(&rpc::id_key(&id));
        answered.and_then(|response| response.get("result").cloned())
    }
}

/// The response of a call that asked its client: an event stream of the question `first`,
/// then whatever else the call sends on `rest` (its answer last), ending with the call.
pub fn event_stream(first: Value, rest: mpsc::UnboundedReceiver<Out>) -> Response {
    let events = tokio_stream::once(Some(first))
        .chain(UnboundedReceiverStream::new(rest).map(|out| match out {
            Out::Ask(message) | Out::Final(Some(message)) => Some(message),
            Out::Final(None) => None,
        }))
        .filter_map(|message| message)
        .map(|message| Ok::<_, Infallible>(format!("event: message\ndata: {message}\n\n")));
    let mut response = Response::new(Body::from_stream(events));
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// `mutex`, locked (a panic elsewhere leaves its data usable).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_response_reaches_the_question_it_answers_and_no_other() {
        let asking = std::sync::Arc::new(Asking::default());
        let (events, mut stream) = mpsc::unbounded_channel();
        let asker = Asker {
            asking: asking.clone(),
            events,
        };
        let (_keep, cancelled) = watch::channel(false);
        let asked = tokio::spawn(async move {
            asker
                .elicit(serde_json::json!({"message": "may I?"}), cancelled)
                .await
        });
        let Some(Out::Ask(question)) = stream.recv().await else {
            panic!("no question");
        };
        assert_eq!(question["method"], "elicitation/create");
        let other = serde_json::json!({"jsonrpc": "2.0", "id": 7, "result": {}});
        assert!(
            !asking.answered(&other),
            "the upstream's, not the gateway's"
        );
        let answer = serde_json::json!({
            "jsonrpc": "2.0", "id": question["id"], "result": {"action": "accept"}});
        assert!(asking.answered(&answer));
        assert_eq!(
            asked.await.expect("asked"),
            Some(serde_json::json!({"action": "accept"}))
        );
        assert!(!asking.answered(&answer), "used once");
    }
}
