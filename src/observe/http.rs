//! The optional metrics endpoint (`--metrics-listen`): `GET /metrics` answers every family in
//! the Prometheus text format (0.0.4), anything else 404. One small request per connection.
//!
//! A scraper that connects and says nothing is disconnected after [`READ_TIMEOUT`]; when the
//! process runs out of descriptors the accept loop backs off (and says so) instead of
//! spinning.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::Metrics;
use super::metrics::CONTENT_TYPE;

/// How long the endpoint waits for a scraper's request.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Binds the metrics endpoint.
///
/// # Errors
/// The address cannot be bound.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves `GET /metrics` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    // Backs off (and says so) when descriptors run out, instead of spinning on accept.
    let mut backoff = crate::connections::Backoff::default();
    loop {
        let mut socket = backoff.accept(&listener, None).await;
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            // A scraper that connects and says nothing does not hold the task for ever.
            let Ok(Ok(n)) = tokio::time::timeout(READ_TIMEOUT, socket.read(&mut buf)).await else {
                return;
            };
            let request = String::from_utf8_lossy(&buf[..n]);
            let response = match request
                .starts_with("GET /metrics ")
                .then(|| metrics.render())
            {
                Some(Ok(body)) => format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: {CONTENT_TYPE}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                ),
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "cannot encode the metrics");
                    "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        .to_string()
                }
                None => "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    .to_string(),
            };
            let _ = socket.write_all(response.as_bytes()).await;
            let _ = socket.shutdown().await;
        });
    }
}
