//! The Streamable HTTP transport: `idempotency-ledger mcp --listen ADDR --upstream URL`, for
//! many clients and any number of gateway replicas (on one PostgreSQL ledger). Each request is
//! checked at the edge first: the `Origin` header (the protocol's rule against DNS rebinding),
//! the bearer token (its tenant, from `--auth-tokens-file`), the body's size; then a governed
//! `tools/call` is answered by the gateway, in a task of its own so that a client that goes
//! away (a broken stream) never leaves a call half done: its outcome is recorded whatever the
//! client does, and the call re-issued with a new id reads it. Every other message is passed
//! to the upstream and its answer streamed back as it comes (status, body and the protocol's
//! headers); the answers that teach the gateway something (`initialize`, `server/discover`,
//! `tools/list`) are read on the way.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use axum::routing::any;
use http_body_util::BodyExt as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::watch;

pub mod ask;

use super::govern::Gateway;
use super::rpc::{self, Kind};
use super::upstream_http::{EventReader, HttpCall, HttpUpstream};
use crate::credentials::Credentials;
use crate::domain::Tenant;

/// The response headers of the upstream a client receives.
const HANDED_BACK: [&str; 4] = [
    "content-type",
    "mcp-session-id",
    "mcp-protocol-version",
    "cache-control",
];

/// What the HTTP edge checks and where it sends what passes.
pub struct Edge {
    /// The ledger side.
    pub gateway: Arc<Gateway>,
    /// The upstream.
    pub upstream: HttpUpstream,
    /// The bearer tokens and their tenants (`--auth-tokens-file`; one tenant without it).
    pub credentials: Credentials,
    /// The origins a browser may call from (`--allowed-origin`), besides the loopback ones
    /// when the gateway listens on loopback.
    pub origins: Vec<String>,
    /// Whether the gateway listens on a loopback address.
    pub loopback: bool,
    /// The largest body taken (`--max-body-bytes`).
    pub max_body: usize,
    /// The governed calls in flight, by tenant, session and id (their cancellations stay
    /// here).
    pub in_flight: std::sync::Mutex<std::collections::HashSet<String>>,
    /// The sessions whose clients can be asked, and the questions asked of them.
    pub asking: Arc<ask::Asking>,
}

/// The edge's routes: every path and method, checked, then routed by the message.
pub fn router(edge: Arc<Edge>) -> Router {
    Router::new().fallback(any(handle)).with_state(edge)
}

/// Serves `router` on `listener` (HTTP/1.1, connections kept alive for streams) until
/// `shutdown` resolves; calls in flight go on in their own tasks.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send,
) {
    let mut backoff = crate::connections::Backoff::default();
    let accepting = async {
        loop {
            let socket = backoff.accept(&listener, None).await;
            let service = TowerToHyperService::new(router.clone());
            tokio::spawn(async move {
                let served = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .serve_connection(TokioIo::new(socket), service)
                    .await;
                if let Err(e) = served {
                    tracing::debug!(error = %e, "a client's connection ended");
                }
            });
        }
    };
    tokio::select! {
        () = accepting => {}
        () = shutdown => tracing::info!("told to stop: no new connection is taken"),
    }
}

/// Whether `addr` is a loopback address.
#[must_use]
pub fn is_loopback(addr: SocketAddr) -> bool {
    addr.ip().is_loopback()
}

/// One request of a client's.
async fn handle(
    State(edge): State<Arc<Edge>>,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Err(refused) = edge.check_origin(&headers) {
        return *refused;
    }
    let tenant = match edge.authenticate(&headers) {
        Ok(tenant) => tenant,
        Err(refused) => return *refused,
    };
    if method != Method::POST {
        // The session-based revisions' GET stream and DELETE of a session: the upstream's.
        if method == Method::DELETE
            && let Some(session) = session_of(&headers)
        {
            edge.asking.forget_session(session);
        }
        return edge.pass(method, &headers, Bytes::new()).await;
    }
    let bytes = match axum::body::to_bytes(body, edge.max_body).await {
        Ok(bytes) => bytes,
        Err(_) => {
            return refusal(
                StatusCode::PAYLOAD_TOO_LARGE,
                None,
                rpc::INVALID_REQUEST,
                &format!(
                    "the body is over {} bytes (--max-body-bytes); nothing was sent on",
                    edge.max_body
                ),
            );
        }
    };
    let message: Value = match serde_json::from_slice(&bytes) {
        Ok(message) => message,
        Err(e) => {
            return refusal(
                StatusCode::BAD_REQUEST,
                None,
                rpc::PARSE_ERROR,
                &format!("not JSON: {e}; nothing was sent on"),
            );
        }
    };
    route(edge, tenant, message, headers, bytes).await
}

/// Routes a message that passed the edge's checks: a `tools/call` to the gateway, what teaches
/// it to the upstream and back through it, anything else straight through.
async fn route(
    edge: Arc<Edge>,
    tenant: Tenant,
    message: Value,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    match rpc::kind(&message) {
        Kind::Request {
            id,
            method: "tools/call",
        } => {
            let id = id.clone();
            edge.clone().call_tool(tenant, message, id, headers).await
        }
        Kind::Request { method, .. }
            if matches!(method, "initialize" | "server/discover" | "tools/list") =>
        {
            let method = method.to_string();
            edge.pass_and_observe(&method, &message, &headers, bytes)
                .await
        }
        Kind::Notification {
            method: "notifications/cancelled",
        } => {
            // A governed call's cancellation stays here: the call runs to its end and its
            // outcome is recorded (see govern's act).
            let governed = message
                .pointer("/params/requestId")
                .is_some_and(|id| edge.in_flight(&tenant, &headers, id, None));
            if governed {
                StatusCode::ACCEPTED.into_response()
            } else {
                edge.pass(Method::POST, &headers, bytes).await
            }
        }
        // The client's answer to the gateway's own question stays here.
        Kind::Response { .. } if edge.asking.answered(&message) => {
            StatusCode::ACCEPTED.into_response()
        }
        Kind::Request { .. } | Kind::Notification { .. } | Kind::Response { .. } => {
            edge.pass(Method::POST, &headers, bytes).await
        }
        Kind::Batch => {
            let calls_a_tool = message.as_array().is_some_and(|items| {
                items
                    .iter()
                    .any(|m| m.get("method").and_then(Value::as_str) == Some("tools/call"))
            });
            if calls_a_tool {
                refusal(
                    StatusCode::BAD_REQUEST,
                    None,
                    rpc::INVALID_REQUEST,
                    "a batch holding tools/call is refused by the idempotency gateway: send each \
                     call on its own; nothing was sent on",
                )
            } else {
                edge.pass(Method::POST, &headers, bytes).await
            }
        }
        Kind::Invalid(why) => {
            let id = message
                .get("id")
                .filter(|id| id.is_string() || id.is_number());
            refusal(
                StatusCode::BAD_REQUEST,
                id,
                rpc::INVALID_REQUEST,
                &format!("{why}; nothing was sent on"),
            )
        }
    }
}

impl Edge {
    /// Refuses a browser's request from an origin not allowed: a page elsewhere must not reach
    /// a gateway on this machine (DNS rebinding). A request without `Origin` (not a browser's)
    /// passes.
    fn check_origin(&self, headers: &HeaderMap) -> Result<(), Box<Response>> {
        let Some(origin) = headers.get(header::ORIGIN) else {
            return Ok(());
        };
        let origin = origin.to_str().unwrap_or("");
        let allowed =
            self.origins.iter().any(|o| o == origin) || (self.loopback && loopback_origin(origin));
        if allowed {
            Ok(())
        } else {
            Err(Box::new(refusal(
                StatusCode::FORBIDDEN,
                None,
                rpc::INVALID_REQUEST,
                &format!(
                    "the origin {origin} is not allowed (--allowed-origin); nothing was sent on"
                ),
            )))
        }
    }

    /// The tenant of the request's bearer token.
    fn authenticate(&self, headers: &HeaderMap) -> Result<Tenant, Box<Response>> {
        let metadata = tonic::metadata::MetadataMap::from_headers(headers.clone());
        match self.credentials.authenticate(&metadata) {
            Ok(identity) => Ok(identity.tenant),
            Err(e) => {
                let mut response = refusal(
                    StatusCode::UNAUTHORIZED,
                    None,
                    rpc::INVALID_REQUEST,
                    &format!("{e}; nothing was sent on"),
                );
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                Err(Box::new(response))
            }
        }
    }

    /// Whether the request `id` of this client (tenant, session) is a governed call in flight;
    /// with `set`, notes (`Some(true)`) or forgets (`Some(false)`) it.
    fn in_flight(
        &self,
        tenant: &Tenant,
        headers: &HeaderMap,
        id: &Value,
        set: Option<bool>,
    ) -> bool {
        let session = session_of(headers).unwrap_or("");
        let key = format!("{}\u{0}{session}\u{0}{}", tenant.as_str(), rpc::id_key(id));
        let mut calls = self
            .in_flight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match set {
            Some(true) => !calls.insert(key),
            Some(false) => calls.remove(&key),
            None => calls.contains(&key),
        }
    }

    /// A `tools/call`, answered by the gateway in a task of its own (see the module's note),
    /// which notes a governed call as in flight while it runs. Its answer is JSON, unless the
    /// call asks its client's user first ([`ask`]): then an event stream, the question first.
    async fn call_tool(
        self: Arc<Self>,
        tenant: Tenant,
        message: Value,
        id: Value,
        headers: HeaderMap,
    ) -> Response {
        let edge = self.clone();
        let (events, mut outs) = tokio::sync::mpsc::unbounded_channel();
        let asker = session_of(&headers)
            .filter(|session| edge.asking.can_ask(session))
            .map(|_| ask::Asker {
                asking: edge.asking.clone(),
                events: events.clone(),
            });
        let task = tokio::spawn(async move {
            let governed = edge.gateway.governs(&message);
            if governed {
                edge.in_flight(&tenant, &headers, &id, Some(true));
            }
            let handle = HttpCall {
                upstream: &edge.upstream,
                headers: headers.clone(),
                asker,
            };
            let (_never, cancelled) = watch::channel(false);
            let answer = edge
                .gateway
                .call_tool(Some(&tenant), message, &id, &handle, cancelled)
                .await;
            if governed {
                edge.in_flight(&tenant, &headers, &id, Some(false));
            }
            let _ = events.send(ask::Out::Final(answer));
        });
        match outs.recv().await {
            Some(ask::Out::Final(Some(answer))) => json_response(StatusCode::OK, &answer),
            Some(ask::Out::Final(None)) => StatusCode::ACCEPTED.into_response(),
            Some(ask::Out::Ask(question)) => ask::event_stream(question, outs),
            None => {
                let e = task.await.err().map(|e| e.to_string()).unwrap_or_default();
                tracing::error!(error = %e, "a tool call's task failed");
                refusal(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    None,
                    rpc::INTERNAL_ERROR,
                    "the gateway failed on this call (a bug); its outcome may be unknown",
                )
            }
        }
    }

    /// Passes a message (or a GET, a DELETE) to the upstream, and streams its answer back.
    async fn pass(&self, method: Method, headers: &HeaderMap, body: Bytes) -> Response {
        match self.upstream.send(method, headers, body).await {
            Ok(response) => {
                let (parts, incoming) = response.into_parts();
                let mut out = Response::new(Body::new(incoming));
                *out.status_mut() = parts.status;
                copy_back(&parts.headers, out.headers_mut());
                out
            }
            Err(why) => refusal(StatusCode::BAD_GATEWAY, None, rpc::UNAVAILABLE, &why),
        }
    }

    /// Passes a request whose answer teaches the gateway (the upstream's name, its tools'
    /// hints): read whole, learned from, handed back as it came.
    async fn pass_and_observe(
        &self,
        method: &str,
        message: &Value,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Response {
        let response = match self.upstream.send(Method::POST, headers, body).await {
            Ok(response) => response,
            Err(why) => return refusal(StatusCode::BAD_GATEWAY, None, rpc::UNAVAILABLE, &why),
        };
        let (parts, incoming) = response.into_parts();
        let bytes = match incoming.collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(e) => {
                return refusal(
                    StatusCode::BAD_GATEWAY,
                    message.get("id"),
                    rpc::UNAVAILABLE,
                    &format!("the upstream's answer broke off: {e}"),
                );
            }
        };
        let answers: Vec<Value> = match serde_json::from_slice::<Value>(&bytes) {
            Ok(answer) => vec![answer],
            Err(_) => EventReader::default().push(&bytes),
        };
        for answer in answers.iter().filter_map(|a| a.get("result")) {
            match method {
                "tools/list" => self.gateway.learn_tools(answer),
                _ => self.gateway.learn_from_discover(answer),
            }
        }
        if method == "initialize"
            && message
                .pointer("/params/capabilities/elicitation")
                .is_some()
            && let Some(session) = parts
                .headers
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
        {
            self.asking.note_session(session);
        }
        if let Some(name) = message
            .pointer("/params/clientInfo/name")
            .or_else(|| message.pointer("/params/_meta/io.modelcontextprotocol~1clientInfo/name"))
            .and_then(Value::as_str)
        {
            self.gateway.learn_client(name);
        }
        let mut out = Response::new(Body::from(bytes));
        *out.status_mut() = parts.status;
        copy_back(&parts.headers, out.headers_mut());
        out
    }
}

/// The session a request belongs to (`Mcp-Session-Id`, session-based revisions).
fn session_of(headers: &HeaderMap) -> Option<&str> {
    headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .filter(|s| !s.is_empty())
}

/// Whether a browser origin is this machine's (`http://localhost:…`, `http://127.0.0.1:…`).
fn loopback_origin(origin: &str) -> bool {
    let host = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .unwrap_or("");
    let host = host.rsplit_once(':').map_or(host, |(h, port)| {
        if port.bytes().all(|b| b.is_ascii_digit()) {
            h
        } else {
            host
        }
    });
    matches!(host, "localhost" | "127.0.0.1" | "[::1]")
}

/// Copies the upstream's protocol headers onto the client's response.
fn copy_back(from: &http::HeaderMap, to: &mut HeaderMap) {
    for name in HANDED_BACK {
        for value in from.get_all(name) {
            to.append(name, value.clone());
        }
    }
}

/// A JSON answer.
fn json_response(status: StatusCode, message: &Value) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        message.to_string(),
    )
        .into_response()
}

/// A JSON-RPC error, with an HTTP status that says the same.
fn refusal(status: StatusCode, id: Option<&Value>, code: i64, message: &str) -> Response {
    json_response(status, &rpc::error(id, code, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_machines_origins_count_as_loopback() {
        for (origin, loopback) in [
            ("http://localhost:6274", true),
            ("http://127.0.0.1", true),
            ("http://[::1]:80", true),
            ("https://localhost", true),
            ("http://localhost.evil.example", false),
            ("http://evil.example", false),
            ("http://127.0.0.1.evil.example:80", false),
            ("null", false),
        ] {
            assert_eq!(loopback_origin(origin), loopback, "{origin}");
        }
    }
}
