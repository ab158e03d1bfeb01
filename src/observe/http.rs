//! The server's HTTP endpoints besides gRPC: the optional metrics endpoint
//! (`--metrics-listen`), whose `GET /metrics` answers every family in the Prometheus text format
//! (0.0.4) and anything else 404, one request per connection; and [`serve_within`], the bounded
//! HTTP/1.1 server of an axum [`Router`] that it and the operator's console (`crate::console`)
//! both run on.
//!
//! An endpoint is exposed to whatever can reach its port, so [`serve_within`] bounds what a client can
//! hold: a connection that sends no complete request within its [`Limits::read_timeout`] is
//! closed, and so is one that has not finished within its [`Limits::connection_timeout`]; at
//! most [`Limits::max_connections`] are served at once (more wait to be accepted); when the
//! process runs out of descriptors the accept loop backs off (and says so) instead of
//! spinning. hyper's connection builder over our own accept loop, because `axum::serve` sets
//! none of these bounds.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use http::{Method, StatusCode, header};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use super::Metrics;
use super::metrics::CONTENT_TYPE;

/// How long the endpoint waits for a scraper's request headers.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long one connection may last, request and response: a scrape takes milliseconds.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

/// How an HTTP endpoint bounds its clients.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// What the debug log calls the endpoint's connections.
    pub name: &'static str,
    /// Most connections served at once; more wait to be accepted.
    pub max_connections: usize,
    /// How long a connection may take to send a request's headers.
    pub read_timeout: Duration,
    /// How long one connection may stay open.
    pub connection_timeout: Duration,
    /// Whether a connection may carry more than one request.
    pub keep_alive: bool,
}

impl Limits {
    /// The metrics endpoint's: one request per connection (a scraper connects for each scrape
    /// anyway, and an idle connection holds a descriptor for nothing), no cap on connections.
    pub const METRICS: Limits = Limits {
        name: "metrics",
        max_connections: Semaphore::MAX_PERMITS,
        read_timeout: READ_TIMEOUT,
        connection_timeout: CONNECTION_TIMEOUT,
        keep_alive: false,
    };
}

/// Binds the metrics endpoint.
///
/// # Errors
/// The address cannot be bound.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// The metrics endpoint's routes: `GET /metrics`.
pub fn router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/metrics", any(scrape))
        .with_state(metrics)
}

/// Serves `GET /metrics` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    serve_within(listener, router(metrics), Limits::METRICS).await;
}

/// Serves `router` on `listener` within `limits` until the task is dropped (a connection
/// being served then ends within its `connection_timeout`).
pub async fn serve_within(listener: TcpListener, router: Router, limits: Limits) {
    // Backs off (and says so) when descriptors run out, instead of spinning on accept.
    let mut backoff = crate::connections::Backoff::default();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let socket = backoff.accept(&listener, None).await;
        let service = TowerToHyperService::new(router.clone());
        tokio::spawn(async move {
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.read_timeout)
                .keep_alive(limits.keep_alive)
                .serve_connection(TokioIo::new(socket), service);
            match tokio::time::timeout(limits.connection_timeout, connection).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(error = %e, "{} connection failed", limits.name),
                Err(_) => tracing::debug!("{} connection closed after its time", limits.name),
            }
            drop(slot);
        });
    }
}

/// The answer to a request for `/metrics`: the families to a GET, 404 to any other method
/// (HEAD included, as to any other path).
async fn scrape(State(metrics): State<Arc<Metrics>>, method: Method) -> Response {
    if method != Method::GET {
        return StatusCode::NOT_FOUND.into_response();
    }
    match metrics.render() {
        Ok(body) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot encode the metrics");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio::time::Instant;

    use super::*;
    use crate::domain::time::SystemClock;
    use crate::observe::MetricsOptions;

    /// An endpoint on a free port, with `read_timeout`; its address.
    async fn endpoint(read_timeout: Duration) -> SocketAddr {
        let listener = bind("127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let metrics = Metrics::new(Arc::new(SystemClock), &MetricsOptions::default());
        let limits = Limits {
            read_timeout,
            ..Limits::METRICS
        };
        tokio::spawn(serve_within(listener, router(metrics), limits));
        addr
    }

    /// Sends `request` and reads the whole answer (the endpoint closes the connection).
    async fn exchange(addr: SocketAddr, request: &str) -> String {
        let mut socket = TcpStream::connect(addr).await.expect("connect");
        socket.write_all(request.as_bytes()).await.expect("write");
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(10), socket.read_to_string(&mut answer))
            .await
            .expect("the endpoint closes the connection after answering")
            .expect("read");
        answer
    }

    #[tokio::test]
    async fn get_metrics_answers_the_text_format_and_closes() {
        let addr = endpoint(READ_TIMEOUT).await;
        let answer = exchange(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        let (head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: text/plain; version=0.0.4; charset=utf-8"),
            "{head}"
        );
        assert!(
            head.to_ascii_lowercase().contains("connection: close"),
            "{head}"
        );
        assert!(
            body.contains("# TYPE grpc_server_started_total counter\n"),
            "{body}"
        );
    }

    #[tokio::test]
    async fn anything_but_get_metrics_is_not_found() {
        let addr = endpoint(READ_TIMEOUT).await;
        for request in [
            "GET / HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET /metricsx HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET /metrics/ HTTP/1.1\r\nHost: x\r\n\r\n",
            "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
            "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
        ] {
            let answer = exchange(addr, request).await;
            assert!(
                answer.starts_with("HTTP/1.1 404 Not Found\r\n"),
                "{request:?}: {answer}"
            );
            assert!(!answer.contains("grpc_server"), "{request:?}: {answer}");
        }
    }

    #[tokio::test]
    async fn a_scraper_that_says_nothing_is_disconnected_after_the_read_timeout() {
        let timeout = Duration::from_millis(300);
        let addr = endpoint(timeout).await;
        let mut silent = TcpStream::connect(addr).await.expect("connect");
        let connected = Instant::now();
        let mut buf = [0u8; 256];
        let read = tokio::time::timeout(Duration::from_secs(10), silent.read(&mut buf))
            .await
            .expect("the endpoint closes a silent connection");
        // Closed without an answer (or reset), and not before the timeout.
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        assert!(connected.elapsed() >= timeout, "{:?}", connected.elapsed());
        // The endpoint still answers others.
        let answer = exchange(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    }
}
