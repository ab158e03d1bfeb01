//! Counters of what the ledger did, and the optional Prometheus text endpoint
//! (`--metrics-listen`, `GET /metrics`) that exposes them. Labels are bounded enums only: never
//! keys, runs, tools or tenants.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::ledger::Outcome;

/// The gRPC codes counted, by their number (0 = OK .. 16 = UNAUTHENTICATED).
const CODES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// The RPCs counted, in the order of [`Rpc`].
const RPCS: [&str; 5] = ["Claim", "Complete", "Lookup", "Reconcile", "ListEntries"];

/// One of the ledger's RPCs.
#[derive(Clone, Copy, Debug)]
pub enum Rpc {
    /// `Claim`.
    Claim = 0,
    /// `Complete`.
    Complete = 1,
    /// `Lookup`.
    Lookup = 2,
    /// `Reconcile`.
    Reconcile = 3,
    /// `ListEntries`.
    ListEntries = 4,
}

/// The ledger's counters; cheap to share, updated with relaxed atomics.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Claims answered, by [`Outcome`] (claimed, replayed, in progress, previously failed).
    claims: [AtomicU64; 4],
    /// Calls handled, by RPC and gRPC code.
    handled: [[AtomicU64; 17]; 5],
    /// Whether the last health probe reached the store.
    store_up: AtomicBool,
}

impl Metrics {
    /// New counters, all zero.
    pub fn new() -> Arc<Metrics> {
        Arc::new(Metrics::default())
    }

    /// Counts a claim's outcome.
    pub fn claim(&self, outcome: Outcome) {
        let i = match outcome {
            Outcome::Claimed => 0,
            Outcome::Replayed => 1,
            Outcome::InProgress => 2,
            Outcome::PreviouslyFailed => 3,
        };
        self.claims[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a handled call of `rpc` that ended with `code`.
    pub fn handled(&self, rpc: Rpc, code: tonic::Code) {
        let c = (code as usize).min(CODES.len() - 1);
        self.handled[rpc as usize][c].fetch_add(1, Ordering::Relaxed);
    }

    /// Records whether the store answered the last probe.
    pub fn set_store_up(&self, up: bool) {
        self.store_up.store(up, Ordering::Relaxed);
    }

    /// The Prometheus text exposition of every counter.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP ledger_claims_total Claims answered, by outcome.\n");
        out.push_str("# TYPE ledger_claims_total counter\n");
        for (name, n) in ["claimed", "replayed", "in_progress", "previously_failed"]
            .iter()
            .zip(&self.claims)
        {
            let _ = writeln!(
                out,
                "ledger_claims_total{{outcome=\"{name}\"}} {}",
                n.load(Ordering::Relaxed)
            );
        }
        out.push_str(
            "# HELP grpc_server_handled_total Ledger calls completed, by method and code.\n",
        );
        out.push_str("# TYPE grpc_server_handled_total counter\n");
        for (method, row) in RPCS.iter().zip(&self.handled) {
            for (code, n) in CODES.iter().zip(row) {
                let n = n.load(Ordering::Relaxed);
                if n > 0 {
                    let _ = writeln!(
                        out,
                        "grpc_server_handled_total{{grpc_service=\"idempotency.v1.LedgerService\",grpc_method=\"{method}\",grpc_code=\"{code}\"}} {n}"
                    );
                }
            }
        }
        out.push_str("# HELP ledger_store_up Whether the last health probe reached the store.\n");
        out.push_str("# TYPE ledger_store_up gauge\n");
        let _ = writeln!(
            out,
            "ledger_store_up {}",
            u8::from(self.store_up.load(Ordering::Relaxed))
        );
        out
    }
}

/// Serves `GET /metrics` on `listener` until the task is dropped. One small request per
/// connection; anything else gets 404.
pub async fn serve_metrics(listener: TcpListener, metrics: Arc<Metrics>) {
    loop {
        let Ok((mut socket, _)) = listener.accept().await else {
            continue;
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            let Ok(n) = socket.read(&mut buf).await else {
                return;
            };
            let request = String::from_utf8_lossy(&buf[..n]);
            let response = if request.starts_with("GET /metrics ") {
                let body = metrics.render();
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
            } else {
                "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    .to_string()
            };
            let _ = socket.write_all(response.as_bytes()).await;
            let _ = socket.shutdown().await;
        });
    }
}

/// Binds the metrics endpoint.
///
/// # Errors
/// The address cannot be bound.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_render_in_the_prometheus_text_format() {
        let m = Metrics::default();
        m.claim(Outcome::Claimed);
        m.claim(Outcome::Replayed);
        m.claim(Outcome::Replayed);
        m.handled(Rpc::Claim, tonic::Code::Ok);
        m.handled(Rpc::Complete, tonic::Code::FailedPrecondition);
        m.set_store_up(true);
        let text = m.render();
        assert!(
            text.contains("ledger_claims_total{outcome=\"replayed\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("ledger_claims_total{outcome=\"claimed\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("grpc_method=\"Complete\",grpc_code=\"FAILED_PRECONDITION\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("ledger_store_up 1\n"), "{text}");
        assert!(
            !text.contains("grpc_method=\"Lookup\""),
            "zero series are omitted: {text}"
        );
    }
}
