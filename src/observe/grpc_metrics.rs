//! The tower layer that counts the conventional gRPC server families for the ledger service:
//! `grpc_server_started_total` when a call arrives, `grpc_server_handling_seconds` when its
//! response (or trailers-only error) leaves, and `grpc_server_handled_total` with the code the
//! caller got, read from the response headers or, for an answer with a body, its trailers.
//!
//! It goes around the ledger service, outside the authentication interceptor, so that it
//! sees every ledger call, also those refused before a handler runs (authentication, not yet
//! migrated, a message too large or that does not decode), and outside anything that changes
//! the code sent (the rewrite of tonic's own refusals into the ledger's answers), so that it
//! counts the caller's code. Requests for other paths pass through uncounted. A call whose
//! future or response body is dropped before its code was sent (the caller went away) counts
//! as `CANCELLED`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use super::{Metrics, Rpc};

/// Counts the gRPC families of the ledger's calls into a [`Metrics`].
#[derive(Clone, Debug)]
pub struct GrpcMetricsLayer {
    /// Where the counts go.
    metrics: Arc<Metrics>,
}

impl GrpcMetricsLayer {
    /// Counts into `metrics`.
    pub fn new(metrics: Arc<Metrics>) -> GrpcMetricsLayer {
        GrpcMetricsLayer { metrics }
    }
}

impl<S> tower::Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcMetricsService {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// The service [`GrpcMetricsLayer`] makes.
#[derive(Clone, Debug)]
pub struct GrpcMetricsService<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for GrpcMetricsService<S> {
    const NAME: &'static str = S::NAME;
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for GrpcMetricsService<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    ResBody::Error: Into<tonic::codegen::StdError>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let call = Rpc::from_path(request.uri().path())
            .map(|rpc| CallCount::start(self.metrics.clone(), rpc));
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?.map(tonic::body::Body::new);
            Ok(match call {
                Some(call) => call.responded(response),
                None => response,
            })
        })
    }
}

/// The `grpc-status` a header map carries.
fn grpc_status(headers: &http::HeaderMap) -> Option<tonic::Code> {
    tonic::Status::from_header_map(headers).map(|status| status.code())
}

/// One ledger call being counted: started when it arrived; when its future is dropped before
/// the response, it counts as `CANCELLED`.
struct CallCount {
    rpc: Rpc,
    started: Instant,
    /// Taken once the call's latency is observed.
    metrics: Option<Arc<Metrics>>,
}

impl CallCount {
    fn start(metrics: Arc<Metrics>, rpc: Rpc) -> CallCount {
        metrics.grpc_started(rpc);
        CallCount {
            rpc,
            started: Instant::now(),
            metrics: Some(metrics),
        }
    }

    /// The response's headers are out: observes the latency, and counts the code now (a
    /// trailers-only error) or when the trailers pass.
    fn responded(
        mut self,
        response: http::Response<tonic::body::Body>,
    ) -> http::Response<tonic::body::Body> {
        let Some(metrics) = self.metrics.take() else {
            return response;
        };
        metrics.grpc_responded(self.rpc, self.started.elapsed());
        if let Some(code) = grpc_status(response.headers()) {
            metrics.grpc_handled(self.rpc, code);
            return response;
        }
        let rpc = self.rpc;
        response.map(|body| {
            tonic::body::Body::new(CountTrailers {
                inner: body,
                rpc,
                metrics: Some(metrics),
            })
        })
    }
}

impl Drop for CallCount {
    fn drop(&mut self) {
        if let Some(metrics) = self.metrics.take() {
            metrics.grpc_responded(self.rpc, self.started.elapsed());
            metrics.grpc_handled(self.rpc, tonic::Code::Cancelled);
        }
    }
}

/// A response body that counts the call's code when its trailers pass (or `CANCELLED` if the
/// body is dropped before them: the caller went away).
struct CountTrailers {
    inner: tonic::body::Body,
    rpc: Rpc,
    /// Taken once the code is counted.
    metrics: Option<Arc<Metrics>>,
}

impl http_body::Body for CountTrailers {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(trailers) = frame.trailers_ref()
            && let Some(code) = grpc_status(trailers)
            && let Some(metrics) = self.metrics.take()
        {
            metrics.grpc_handled(self.rpc, code);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for CountTrailers {
    fn drop(&mut self) {
        if let Some(metrics) = self.metrics.take() {
            metrics.grpc_handled(self.rpc, tonic::Code::Cancelled);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use tower::{Layer as _, Service as _, ServiceExt as _};

    use super::*;
    use crate::domain::time::SystemClock;
    use crate::observe::MetricsOptions;

    fn metrics() -> Arc<Metrics> {
        Metrics::new(Arc::new(SystemClock), &MetricsOptions::default())
    }

    fn request(path: &str) -> http::Request<tonic::body::Body> {
        http::Request::builder()
            .uri(path)
            .body(tonic::body::Body::empty())
            .expect("request")
    }

    fn series(text: &str, rpc: &str, code: &str) -> Option<String> {
        let prefix = format!("grpc_method=\"{rpc}\",grpc_code=\"{code}\"}} ");
        text.lines()
            .find_map(|l| Some(l.split_once(&prefix)?.1.to_string()))
    }

    #[tokio::test]
    async fn a_trailers_only_error_is_counted_with_its_code_and_other_services_are_not() {
        let m = metrics();
        let mut service = GrpcMetricsLayer::new(m.clone()).layer(tower::service_fn(
            |_: http::Request<tonic::body::Body>| async {
                Ok::<_, Infallible>(
                    tonic::Status::unauthenticated("no").into_http::<tonic::body::Body>(),
                )
            },
        ));
        for path in [
            "/idempotency.v1.LedgerService/Claim",
            "/grpc.health.v1.Health/Check",
        ] {
            let _ = service
                .ready()
                .await
                .expect("ready")
                .call(request(path))
                .await;
        }
        let text = m.render().expect("render");
        assert_eq!(
            series(&text, "Claim", "UNAUTHENTICATED").as_deref(),
            Some("1")
        );
        assert!(!text.contains("Health"), "{text}");
    }

    #[tokio::test]
    async fn a_call_dropped_before_its_answer_counts_as_cancelled() {
        let m = metrics();
        let mut service = GrpcMetricsLayer::new(m.clone()).layer(tower::service_fn(
            |_: http::Request<tonic::body::Body>| async {
                std::future::pending::<Result<http::Response<tonic::body::Body>, Infallible>>()
                    .await
            },
        ));
        let call = service
            .ready()
            .await
            .expect("ready")
            .call(request("/idempotency.v1.LedgerService/Claim"));
        let text = m.render().expect("render");
        assert_eq!(series(&text, "Claim", "CANCELLED"), None, "still running");
        drop(call);
        let text = m.render().expect("render");
        assert_eq!(series(&text, "Claim", "CANCELLED").as_deref(), Some("1"));
        for family in [
            "grpc_server_started_total",
            "grpc_server_handling_seconds_count",
        ] {
            let line = format!(
                "{family}{{grpc_type=\"unary\",grpc_service=\"idempotency.v1.LedgerService\",grpc_method=\"Claim\"}} 1\n"
            );
            assert!(text.contains(&line), "no {line:?} in:\n{text}");
        }
    }
}
