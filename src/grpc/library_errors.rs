//! tonic's own refusals (an oversized or undecodable request) answered as the ledger's,
//! once, around the ledger service.

use std::future::Future;

use tonic::Status;

/// A service answering `inner`'s library refusals as `rewrite_library_errors` describes: what
/// the server puts around the ledger service, inside its metrics and access log, so that the
/// rewrite happens once and both see the code the caller gets.
#[derive(Clone, Debug)]
pub struct LibraryErrors<S> {
    inner: S,
}

impl<S> LibraryErrors<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> LibraryErrors<S> {
        LibraryErrors { inner }
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for LibraryErrors<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> tower::Service<http::Request<tonic::body::Body>> for LibraryErrors<S>
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
            Ok(rewrite_library_errors(response.map(tonic::body::Body::new)))
        })
    }
}

/// tonic answers two kinds of bad input itself, before any handler runs: a request over the
/// message-size limit (OUT_OF_RANGE) and one that does not decode, such as a string field that
/// is not UTF-8 (INTERNAL). The ledger answers limits with RESOURCE_EXHAUSTED (as gRPC itself
/// specifies for oversized messages), malformed input with INVALID_ARGUMENT, and every error
/// with an ErrorInfo: this rewrites those two answers, and passes every other one through.
fn rewrite_library_errors(
    response: http::Response<tonic::body::Body>,
) -> http::Response<tonic::body::Body> {
    let headers = response.headers();
    let code = headers.get("grpc-status").and_then(|v| v.to_str().ok());
    let message = headers
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .unwrap_or("");
    let said = |text: &str| message.contains(text) || message.contains(&text.replace(' ', "%20"));
    let (code, reason, text) = match code {
        Some("11") if said("message length too large") => (
            tonic::Code::ResourceExhausted,
            "MESSAGE_TOO_LARGE",
            "the request is larger than the server's --max-message-bytes",
        ),
        Some("13") if said("failed to decode Protobuf message") => (
            tonic::Code::InvalidArgument,
            "MALFORMED_MESSAGE",
            "the request is not a valid protobuf message of this method (a string field that \
             is not UTF-8, or a field of the wrong type)",
        ),
        _ => return response,
    };
    let mut details = tonic_types::ErrorDetails::new();
    details.set_error_info(
        reason,
        crate::error::ERROR_DOMAIN,
        std::collections::HashMap::new(),
    );
    <Status as tonic_types::StatusExt>::with_error_details(code, text, details).into_http()
}
