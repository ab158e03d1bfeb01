//! `ledger-floor`: the gRPC floor of the benchmark's comparison (`compare`). A server that answers one unary RPC
//! (`bench.v1.FloorService/Call`, `proto/bench/v1/floor.proto`) at once, with no database and
//! no ledger, on the ledger server's own transport:
//!
//! - the same runtime (`#[tokio::main]`: tokio's multi-threaded runtime, one worker per core)
//!   and the same allocator (mimalloc),
//! - the same listener (`connections::Listener`: TCP_NODELAY on every accepted socket, the
//!   descriptor limit raised, the connection cap and the idle timeout),
//! - the same tonic `Server` settings (HTTP/2 keepalive interval and timeout), and the
//!   standard health service, which ledger-bench asks before it starts.
//!
//! It takes the server's own command line (`config::Settings`, flattened), so `--listen`,
//! `--http2-keepalive-interval`, `--http2-keepalive-timeout`, `--max-connections` and
//! `--connection-idle-timeout` have the server's flags, environment variables and defaults;
//! the other settings are accepted and ignored. What the ledger server runs on top of this
//! (its interceptor, the metrics and call-log layers, admission, the ledger, the store) is
//! what the comparison reports as the overhead above the floor.
//!
//! ```text
//! ledger-floor --listen 127.0.0.1:0    # the start-up log line names the port: listen=...
//! ledger-bench --addr http://127.0.0.1:PORT --workload floor --floor-of claim-complete
//! ```

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use idempotency_ledger::connections::{self, ConnectionLimits, Listener};
use idempotency_ledger::observe::telemetry;
use idempotency_ledger::server::Settings;
use prost::bytes::Bytes;
use tokio::net::TcpListener;
use tonic::transport::Server;
use tonic::{Request, Response, Status};

use ledger_bench::floor_pb::floor_service_server::{FloorService, FloorServiceServer};
use ledger_bench::floor_pb::{CallRequest, CallResponse};

/// The largest payload a response carries (a Claim's answer is a few hundred bytes).
const MAX_PAYLOAD: usize = 64 * 1024;
/// Descriptors kept for other than client connections: the runtime's own and a margin (the
/// ledger server also keeps its database pool here; the floor has none).
const RESERVED_DESCRIPTORS: u64 = 64;

/// The gRPC floor: answers bench.v1.FloorService/Call at once, on the ledger server's transport.
#[derive(Parser, Debug)]
#[command(name = "ledger-floor", version)]
struct Args {
    /// The ledger server's settings: only the transport ones apply (--listen, the HTTP/2
    /// keepalive, --max-connections, --connection-idle-timeout); the rest are ignored.
    #[command(flatten, next_help_heading = "The server's settings")]
    settings: Settings,
}

/// The service: a payload of the size asked for, sliced from one zeroed buffer (no copy).
struct Floor {
    zeros: Bytes,
}

#[tonic::async_trait]
impl FloorService for Floor {
    async fn call(&self, request: Request<CallRequest>) -> Result<Response<CallResponse>, Status> {
        let want = request.get_ref().response_payload_bytes as usize;
        if want > MAX_PAYLOAD {
            return Err(Status::invalid_argument(format!(
                "response_payload_bytes is at most {MAX_PAYLOAD}"
            )));
        }
        Ok(Response::new(CallResponse {
            payload: self.zeros.slice(..want),
        }))
    }
}

/// The ledger server's allocator (src/main.rs), so that the floor is the same stack.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let settings = Args::parse().settings;
    if let Err(e) = telemetry::init(settings.log_format, None) {
        eprintln!("ledger-floor: cannot set up logging: {e}");
        return ExitCode::FAILURE;
    }
    match serve(settings).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "ledger-floor failed");
            ExitCode::FAILURE
        }
    }
}

async fn serve(settings: Settings) -> Result<(), Box<dyn std::error::Error>> {
    let listener = TcpListener::bind(settings.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", settings.listen))?;
    let addr: SocketAddr = listener.local_addr()?;
    let listener = Listener::new(listener, connection_limits(&settings));
    let (reporter, health_service) = tonic_health::server::health_reporter();
    reporter.set_serving::<FloorServiceServer<Floor>>().await;
    let floor = Floor {
        zeros: Bytes::from(vec![0u8; MAX_PAYLOAD]),
    };
    // The same line as the ledger server's, so the drivers find the port the same way.
    tracing::info!(listen = %addr, "ledger-floor starting");
    Server::builder()
        .http2_keepalive_interval(Some(settings.http2_keepalive_interval))
        .http2_keepalive_timeout(Some(settings.http2_keepalive_timeout))
        .add_service(health_service)
        .add_service(FloorServiceServer::new(floor))
        .serve_with_incoming_shutdown(listener.incoming(), shutdown_signal())
        .await?;
    tracing::info!("ledger-floor stopped");
    Ok(())
}

/// The ledger server's connection bounds (src/server/mod.rs `connection_limits`), without a
/// database pool to reserve descriptors for.
fn connection_limits(settings: &Settings) -> ConnectionLimits {
    let max_connections = match connections::raise_descriptor_limit() {
        Ok(limit) if settings.max_connections == 0 => {
            connections::connections_for(&limit, RESERVED_DESCRIPTORS)
        }
        Err(_) if settings.max_connections == 0 => 1024,
        _ => settings.max_connections,
    };
    ConnectionLimits {
        max_connections,
        idle_timeout: settings.connection_idle_timeout,
    }
}

/// Resolves on SIGTERM or SIGINT, as the ledger server's does.
async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut sigterm) => {
                sigterm.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}
