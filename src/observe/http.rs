//! The optional metrics endpoint (`--metrics-listen`): `GET /metrics` answers every family in
//! the Prometheus text format (0.0.4), anything else 404. Served by hyper's HTTP/1.1 server,
//! one request per connection.
//!
//! It is exposed to whatever can reach the port, so it bounds what a client can hold: a
//! connection that sends no complete request within [`READ_TIMEOUT`] is closed, and so is one
//! that has not finished within [`CONNECTION_TIMEOUT`]; when the process runs out of
//! descriptors the accept loop backs off (and says so) instead of spinning.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use super::Metrics;
use super::metrics::CONTENT_TYPE;

/// How long the endpoint waits for a scraper's request headers.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long one connection may last, request and response: a scrape takes milliseconds.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

/// Binds the metrics endpoint.
///
/// # Errors
/// The address cannot be bound.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves `GET /metrics` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    serve_with(listener, metrics, READ_TIMEOUT, CONNECTION_TIMEOUT).await;
}

async fn serve_with(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    read_timeout: Duration,
    connection_timeout: Duration,
) {
    // Backs off (and says so) when descriptors run out, instead of spinning on accept.
    let mut backoff = crate::connections::Backoff::default();
    loop {
        let socket = backoff.accept(&listener, None).await;
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let response = answer(&metrics, &request);
                async move { Ok::<_, Infallible>(response) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(read_timeout)
                // One request per connection: a scraper connects for each scrape anyway, and
                // an idle connection holds a descriptor for nothing.
                .keep_alive(false)
                .serve_connection(TokioIo::new(socket), service);
            match tokio::time::timeout(connection_timeout, connection).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(error = %e, "metrics connection failed"),
                Err(_) => tracing::debug!("metrics connection closed: it took too long"),
            }
        });
    }
}

/// The answer to one request.
fn answer<B>(metrics: &Metrics, request: &http::Request<B>) -> http::Response<String> {
    let mut response = http::Response::new(String::new());
    if request.method() != http::Method::GET || request.uri().path() != "/metrics" {
        *response.status_mut() = http::StatusCode::NOT_FOUND;
        return response;
    }
    match metrics.render() {
        Ok(body) => {
            *response.body_mut() = body;
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static(CONTENT_TYPE),
            );
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot encode the metrics");
            *response.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
        }
    }
    response
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
        tokio::spawn(serve_with(
            listener,
            metrics,
            read_timeout,
            CONNECTION_TIMEOUT,
        ));
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
