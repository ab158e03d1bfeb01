//! The upstream over Streamable HTTP (`--upstream URL`): each message a POST to its endpoint,
//! with the client's protocol headers passed on (its session, its protocol version, the
//! stateless revision's `Mcp-Method` and `Mcp-Name`, the trace context) and never its
//! credentials: the upstream's come from the gateway's configuration only
//! (`--upstream-header`). An answer comes as one JSON message or as a Server-Sent Events stream
//! that ends with it (notifications before it are dropped for a governed call, which answers
//! once).

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri, header};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use tokio::sync::watch;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::CertificateDer;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;

use super::govern::{Answer, Upstream};

/// An error and its sources, in words: `client error (Connect): invalid peer certificate: …`.
fn chain(error: &dyn std::error::Error) -> String {
    let mut words = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        words.push_str(": ");
        words.push_str(&cause.to_string());
        source = cause.source();
    }
    words
}

/// Why a request did not reach the upstream, and whether it surely never left.
struct Unreached {
    why: String,
    before_sending: bool,
}

/// The TLS client's configuration: the Mozilla roots, and the certificates of `ca`.
fn tls_config(ca: Option<&std::path::Path>) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(ca) = ca {
        let shown = || format!("--upstream-ca {}", ca.display());
        let text = std::fs::read(ca).map_err(|e| format!("{}: {e}", shown()))?;
        let certificates = CertificateDer::pem_slice_iter(&text)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{}: not PEM certificates ({e})", shown()))?;
        if certificates.is_empty() {
            return Err(format!("{}: no PEM certificate in the file", shown()));
        }
        for certificate in certificates {
            roots
                .add(certificate)
                .map_err(|e| format!("{}: {e}", shown()))?;
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// The client headers a message to the upstream carries on, as they came.
pub const PASSED_ON: [&str; 8] = [
    "mcp-session-id",
    "mcp-protocol-version",
    "mcp-method",
    "mcp-name",
    "last-event-id",
    "traceparent",
    "tracestate",
    "accept",
];

/// The upstream's endpoint and how the gateway reaches it.
#[derive(Clone, Debug)]
pub struct HttpUpstream {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    url: Uri,
    /// Headers of the gateway's configuration sent with every message (the upstream's own
    /// credentials), never one a client sent.
    configured: HeaderMap,
}

impl HttpUpstream {
    /// The upstream at `url` (http:// or https://), with `configured` headers (`Name: value`);
    /// over https://, its certificate is checked against the Mozilla roots and the
    /// certificates of `ca` (a PEM file, for a private CA).
    ///
    /// # Errors
    /// A URL that is neither, a header that does not parse, or a CA file that cannot be read.
    pub fn new(
        url: &str,
        configured: &[String],
        ca: Option<&std::path::Path>,
    ) -> Result<HttpUpstream, String> {
        let url: Uri = url
            .parse()
            .map_err(|e| format!("--upstream {url}: not a URL ({e})"))?;
        if !matches!(url.scheme_str(), Some("http" | "https")) {
            return Err(format!(
                "--upstream {url}: write http://… or https://… (the upstream's Streamable HTTP \
                 endpoint)"
            ));
        }
        let mut headers = HeaderMap::new();
        for line in configured {
            let (name, value) = line
                .split_once(':')
                .ok_or_else(|| format!("--upstream-header `{line}`: write `Name: value`"))?;
            let name = HeaderName::try_from(name.trim())
                .map_err(|_| format!("--upstream-header: `{}` is no header name", name.trim()))?;
            let value = HeaderValue::try_from(value.trim())
                .map_err(|_| format!("--upstream-header {name}: the value does not parse"))?;
            headers.append(name, value);
        }
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        // Plain http:// needs the TCP connector to take any scheme.
        connector.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls_config(ca)?)
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        Ok(HttpUpstream {
            client: Client::builder(TokioExecutor::new()).build(connector),
            url,
            configured: headers,
        })
    }

    /// Sends a request with `method` (POST with `body`, GET, DELETE) and the client's
    /// `headers` passed on; the upstream's response, unread.
    ///
    /// # Errors
    /// The upstream cannot be reached, in words.
    pub async fn send(
        &self,
        method: Method,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<http::Response<Incoming>, String> {
        self.request(method, headers, body).await.map_err(|e| e.why)
    }

    /// [`HttpUpstream::send`], saying whether the request was never sent.
    async fn request(
        &self,
        method: Method,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<http::Response<Incoming>, Unreached> {
        let mut request = Request::builder().method(method).uri(self.url.clone());
        if let Some(out) = request.headers_mut() {
            for name in PASSED_ON {
                for value in headers.get_all(name) {
                    out.append(name, value.clone());
                }
            }
            if !body.is_empty() {
                out.insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
            }
            if !out.contains_key(header::ACCEPT) {
                out.insert(
                    header::ACCEPT,
                    HeaderValue::from_static("application/json, text/event-stream"),
                );
            }
            for (name, value) in &self.configured {
                out.insert(name, value.clone());
            }
        }
        let request = request.body(Full::new(body)).map_err(|e| Unreached {
            why: format!("the request to the upstream could not be built: {e}"),
            before_sending: true,
        })?;
        self.client.request(request).await.map_err(|e| Unreached {
            why: format!("the upstream {} cannot be reached: {}", self.url, chain(&e)),
            // A connection that could not be opened (refused, no route, a TLS handshake that
            // failed): the request never left.
            before_sending: e.is_connect(),
        })
    }

    /// Posts `message` and reads the upstream's answer to it (its id): one JSON message, or
    /// the one in its event stream.
    pub async fn exchange(&self, headers: &HeaderMap, message: &Value) -> Answer {
        let body = Bytes::from(message.to_string());
        let response = match self.request(Method::POST, headers, body).await {
            Ok(response) => response,
            Err(Unreached {
                why,
                before_sending: true,
            }) => return Answer::NotSent(why),
            Err(Unreached { why, .. }) => return Answer::Lost(why),
        };
        let id = message.get("id").cloned().unwrap_or(Value::Null);
        read_answer(response, &id).await
    }
}

/// The answer to the request `id` in an upstream's response: its JSON body, or the message of
/// its event stream that answers `id`. A response that breaks before the answer is lost.
pub async fn read_answer(response: http::Response<Incoming>, id: &Value) -> Answer {
    let status = response.status();
    let streamed = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let mut body = response.into_body();
    if !streamed {
        let bytes = match body.collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(e) => return Answer::Lost(format!("the upstream's answer broke off: {e}")),
        };
        return match serde_json::from_slice::<Value>(&bytes) {
            Ok(message) if message.get("id") == Some(id) => Answer::Response(message),
            Ok(message) if message.get("error").is_some() => Answer::Response(message),
            _ => Answer::Lost(format!(
                "the upstream answered HTTP {status} without a JSON-RPC answer"
            )),
        };
    }
    let mut events = EventReader::default();
    loop {
        let frame = match body.frame().await {
            Some(Ok(frame)) => frame,
            Some(Err(e)) => return Answer::Lost(format!("the upstream's stream broke off: {e}")),
            None => return Answer::Lost("the upstream's stream ended without an answer".into()),
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        for message in events.push(&data) {
            if message.get("id") == Some(id)
                && (message.get("result").is_some() || message.get("error").is_some())
            {
                return Answer::Response(message);
            }
        }
    }
}

/// The JSON messages of a Server-Sent Events stream, event by event (`data:` lines joined).
#[derive(Default)]
pub struct EventReader {
    /// Bytes of an unfinished line.
    partial: Vec<u8>,
    /// The data lines of the event being read.
    data: String,
}

impl EventReader {
    /// Reads `bytes`; returns the messages of the events they completed.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Value> {
        let mut messages = Vec::new();
        self.partial.extend_from_slice(bytes);
        while let Some(end) = self.partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                if !self.data.is_empty()
                    && let Ok(message) = serde_json::from_str(&self.data)
                {
                    messages.push(message);
                }
                self.data.clear();
            } else if let Some(data) = line.strip_prefix("data:") {
                if !self.data.is_empty() {
                    self.data.push('\n');
                }
                self.data.push_str(data.strip_prefix(' ').unwrap_or(data));
            }
        }
        messages
    }
}

/// The upstream as one governed call sees it: its messages carry that call's client headers.
pub struct HttpCall<'a> {
    /// The upstream.
    pub upstream: &'a HttpUpstream,
    /// The client's headers of the call, passed on.
    pub headers: HeaderMap,
    /// How to ask the client's user, when its session can be asked.
    pub asker: Option<super::http::ask::Asker>,
}

#[async_trait]
impl Upstream for HttpCall<'_> {
    async fn call(&self, request: Value, _cancelled: watch::Receiver<bool>) -> Answer {
        let mut headers = self.headers.clone();
        // A request the gateway makes on the call's behalf (a paired read) names itself.
        if let Some(method) = request.get("method").and_then(Value::as_str)
            && let Ok(value) = HeaderValue::try_from(method)
        {
            headers.insert("mcp-method", value);
        }
        if let Some(name) = request.pointer("/params/name").and_then(Value::as_str)
            && let Ok(value) = HeaderValue::try_from(name)
        {
            headers.insert("mcp-name", value);
        }
        self.upstream.exchange(&headers, &request).await
    }

    async fn elicit(&self, params: Value, cancelled: watch::Receiver<bool>) -> Option<Value> {
        self.asker.as_ref()?.elicit(params, cancelled).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_read_across_chunks_and_lines() {
        let mut reader = EventReader::default();
        assert!(reader.push(b"event: message\ndata: {\"a\"").is_empty());
        let done = reader.push(b":1}\n\ndata: {\"b\":2}\r\n\r\n: a comment\n\n");
        assert_eq!(
            done,
            vec![serde_json::json!({"a":1}), serde_json::json!({"b":2})]
        );
        let split = reader.push(b"data: {\"c\":\ndata: 3}\n\n");
        assert_eq!(split, vec![serde_json::json!({"c":3})], "data lines join");
    }

    #[test]
    fn http_and_https_and_well_formed_headers_are_taken() {
        assert!(HttpUpstream::new("http://127.0.0.1:9/mcp", &[], None).is_ok());
        assert!(HttpUpstream::new("https://example.com/mcp", &[], None).is_ok());
        assert!(HttpUpstream::new("ftp://example.com/mcp", &[], None).is_err());
        assert!(HttpUpstream::new("not a url", &[], None).is_err());
        let bearer = ["Authorization: Bearer x".to_string()];
        assert!(HttpUpstream::new("http://h/mcp", &bearer, None).is_ok());
        assert!(HttpUpstream::new("http://h/mcp", &["no colon".into()], None).is_err());
        let missing = std::path::Path::new("/nonexistent/ca.pem");
        let refused = HttpUpstream::new("https://h/mcp", &[], Some(missing)).expect_err("no file");
        assert!(refused.contains("/nonexistent/ca.pem"), "{refused}");
    }
}
