//! tonic's own refusals (an oversized or undecodable request) answered as the ledger's,
//! once, around the ledger service.

use std::future::Future;

use tonic::Status;

/// A service answering `inner`'s library refusals as `rewrite_transport_refusals` describes: what
/// the server puts around the ledger service, inside its metrics and access log, so that the
/// rewrite happens once and both see the code the caller gets.
#[derive(Clone, Debug)]
pub struct TransportRefusals<S> {
    inner: S,
}

impl<S> TransportRefusals<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> TransportRefusals<S> {
        TransportRefusals { inner }
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for TransportRefusals<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> tower::Service<http::Request<tonic::body::Body>> for TransportRefusals<S>
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<B>,
            Error = std::convert::Infallible,
        > + Send,
    S::Future: Send + 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<tonic::codegen::StdError>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future =
        std::pin::Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(rewrite_transport_refusals(
                response.map(tonic::body::Body::new),
            ))
        })
    }
}

/// tonic answers one kind of bad input itself, before any handler runs: a request over the
/// message-size limit, with OUT_OF_RANGE and no `ErrorInfo`. The ledger answers limits with
/// RESOURCE_EXHAUSTED (as gRPC itself specifies for oversized messages) and every error with an
/// `ErrorInfo`: this rewrites that answer, recognised by its code (the ledger itself never
/// answers OUT_OF_RANGE: `error::tests` holds it), and passes every other one through. (A
/// request that does not decode is refused by the codec itself: `proto::codec`.)
fn rewrite_transport_refusals(
    response: http::Response<tonic::body::Body>,
) -> http::Response<tonic::body::Body> {
    match tonic::Status::from_header_map(response.headers()) {
        Some(status) if status.code() == tonic::Code::OutOfRange => {}
        _ => return response,
    }
    let mut details = tonic_types::ErrorDetails::new();
    details.set_error_info(
        crate::reason::Reason::MessageTooLarge.as_str(),
        crate::proto::ERROR_DOMAIN,
        std::collections::HashMap::new(),
    );
    <Status as tonic_types::StatusExt>::with_error_details(
        tonic::Code::from(crate::reason::Reason::MessageTooLarge.face().grpc as i32),
        "the request is larger than the server's --max-message-bytes",
        details,
    )
    .into_http()
}
