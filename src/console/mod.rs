//! The operator's console: server-rendered HTML pages served by the server itself over
//! HTTP/1.1 (hyper), on loopback by default (`--console-listen`, [`DEFAULT_LISTEN`]). No
//! JavaScript, one inline stylesheet, nothing downloaded.
//!
//! - `/`: what needs a person: the unresolved entries (UNKNOWN, expired leases included),
//!   oldest first, each resolvable there through [`Ledger::reconcile`], the use case behind
//!   the Reconcile RPC, with the operator recorded as `resolved_by`.
//! - `/entries`: every entry by status, tool, run and time; `/find`: an entry by key, key
//!   prefix or `external_ref` ([`crate::ledger::find`]); `/entry`: one entry, every field,
//!   its arguments, its result and its timeline.
//! - `/replay-rate`: the replay rate per tool over the last hour, drawn ([`chart`]) from the
//!   same figures the `ReplayRate` RPC answers.
//! - `/signin`, `/signout`: with `--auth-tokens-file`, a session starts with a tenant's token
//!   and shows that tenant's entries only; without it, every session is tenant `default`.
//!
//! Safety ([`session`] and `respond`): sessions live in the server's memory behind an
//! HttpOnly, SameSite=Strict cookie; every POST carries the session's CSRF token (refused with
//! 403 and nothing changed without it) and, when the browser sends one, an `Origin` of this
//! console; a request whose `Host` is a name the console was not told of is refused (DNS
//! rebinding); every value is escaped ([`html`]); pages carry a Content-Security-Policy that
//! allows nothing but their own stylesheet, `X-Frame-Options: DENY` and `no-store`.

pub mod chart;
pub mod html;
mod pages;
pub mod session;

use std::convert::Infallible;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::BodyExt as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::domain::Micros;
use crate::domain::time::Clock;
use crate::grpc::auth::{Credentials, Tenancy};
use crate::ledger::Ledger;
use crate::observe::Metrics;
use session::{Session, Sessions, SignedIn, same_secret};

/// Where the console listens unless told: loopback only, two ports above the service's
/// default (50051), leaving 50052 to a second server of a developer's.
pub const DEFAULT_LISTEN: &str = crate::defaults::CONSOLE_LISTEN;

/// How long the console waits for a request's headers.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long one connection may stay open (browsers keep them alive between pages).
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(120);

/// Most connections served at once; more wait to be accepted.
pub const MAX_CONNECTIONS: usize = 64;

/// `--console-listen`: an address, or `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listen {
    /// No console.
    Off,
    /// Serve the console on this address.
    At(SocketAddr),
}

impl Listen {
    /// Parses `off` or `HOST:PORT` (an IP address and a port; `[::1]:50053` for IPv6).
    ///
    /// # Errors
    /// Anything else, with what is expected.
    pub fn parse(text: &str) -> Result<Listen, String> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("off") {
            return Ok(Listen::Off);
        }
        text.parse::<SocketAddr>().map(Listen::At).map_err(|_| {
            format!(
                "`{text}` is neither `off` nor an address such as {DEFAULT_LISTEN} (an IP \
                 address and a port)"
            )
        })
    }
}

impl fmt::Display for Listen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Listen::Off => f.write_str("off"),
            Listen::At(addr) => write!(f, "{addr}"),
        }
    }
}

/// The console's URL on `addr`, as the start-up log names it.
pub fn url(addr: SocketAddr) -> String {
    format!("http://{addr}/")
}

/// What the console is configured with besides the ledger.
#[derive(Clone, Debug)]
pub struct Options {
    /// Host names it answers to besides IP addresses and `localhost` (`--console-host`).
    pub hosts: Vec<String>,
    /// How long a session lasts without a request (`--console-session-idle`).
    pub session_idle: Duration,
    /// The largest result (and error) a resolution may carry (`--max-result-bytes`): the
    /// forms' bodies are bounded by it.
    pub max_result_bytes: usize,
}

/// The console of one server: a cheap-to-clone handle.
#[derive(Clone)]
pub struct Console {
    inner: Arc<Inner>,
}

struct Inner {
    /// The use cases, on the server's store and clock.
    ledger: Ledger,
    /// The replay figures and the resolution counts.
    metrics: Arc<Metrics>,
    /// How a token maps to a tenant (or the single tenant): the table in force, which SIGHUP
    /// may replace, so that a session whose token was removed ends with its next request.
    credentials: Credentials,
    /// The ledger's clock: ages, and sessions' expiry.
    clock: Arc<dyn Clock>,
    /// Whether migrations ran, so that the store can be read.
    ready: Box<dyn Fn() -> bool + Send + Sync>,
    sessions: Sessions,
    /// Lowercase host names allowed in `Host` besides IP addresses and `localhost`.
    hosts: Vec<String>,
    /// The cookie's name: it holds the port, since browsers share cookies across the ports of
    /// one host, and two consoles on one machine must not sign each other out.
    cookie: String,
    /// The Content-Security-Policy of every page.
    csp: HeaderValue,
    /// The largest form body read.
    max_body: usize,
}

impl fmt::Debug for Console {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Console")
            .field("cookie", &self.inner.cookie)
            .finish_non_exhaustive()
    }
}

impl Console {
    /// A console over `ledger`, for a listener on `port`.
    pub fn new(
        ledger: Ledger,
        metrics: Arc<Metrics>,
        credentials: Credentials,
        clock: Arc<dyn Clock>,
        ready: impl Fn() -> bool + Send + Sync + 'static,
        port: u16,
        options: &Options,
    ) -> Console {
        let style = base64::engine::general_purpose::STANDARD.encode(Sha256::digest(html::CSS));
        let csp = format!(
            "default-src 'none'; style-src 'sha256-{style}'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'"
        );
        Console {
            inner: Arc::new(Inner {
                ledger,
                metrics,
                credentials,
                clock,
                ready: Box::new(ready),
                sessions: Sessions::new(Micros::from_duration(options.session_idle)),
                hosts: options
                    .hosts
                    .iter()
                    .map(|h| h.trim().to_ascii_lowercase())
                    .filter(|h| !h.is_empty())
                    .collect(),
                cookie: format!("ledger_console_{port}"),
                csp: HeaderValue::from_str(&csp)
                    .unwrap_or_else(|_| HeaderValue::from_static("default-src 'none'")),
                // A resolution's result and error, percent-encoded (up to three bytes each),
                // and room for the other fields.
                max_body: options
                    .max_result_bytes
                    .saturating_mul(6)
                    .saturating_add(64 * 1024),
            }),
        }
    }
}

/// Binds the console's address.
///
/// # Errors
/// The address cannot be bound.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves the console on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, console: Console) {
    let mut backoff = crate::connections::Backoff::default();
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let socket = backoff.accept(&listener, None).await;
        let console = console.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let console = console.clone();
                async move { Ok::<_, Infallible>(console.answer(request).await) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(READ_TIMEOUT)
                .serve_connection(TokioIo::new(socket), service);
            match tokio::time::timeout(CONNECTION_TIMEOUT, connection).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(error = %e, "console connection failed"),
                Err(_) => tracing::debug!("console connection closed after its time"),
            }
            drop(slot);
        });
    }
}

/// A request as the pages see it: its method, path, query and form fields, and its session.
pub(crate) struct Call {
    /// `GET` or `POST`.
    pub method: Method,
    /// The path, without the query.
    pub path: String,
    /// The query's fields (first of each name).
    pub query: Fields,
    /// A POST's form fields (first of each name).
    pub form: Fields,
    /// The session's cookie value and the session, when there is a live one.
    pub session: Option<(String, Session)>,
    /// A cookie to set with the answer (a new session's, or one that clears it).
    pub set_cookie: Option<String>,
    /// The ledger's time at the request.
    pub now: Micros,
}

/// Form or query fields; the first value of each name.
#[derive(Debug, Default)]
pub(crate) struct Fields(Vec<(String, String)>);

impl Fields {
    fn parse(bytes: &[u8]) -> Fields {
        Fields(form_urlencoded::parse(bytes).into_owned().collect())
    }

    /// The first value of `name`, or "".
    pub fn get(&self, name: &str) -> &str {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map_or("", |(_, v)| v.as_str())
    }
}

/// An answer: a page, a redirect, or an error page.
pub(crate) type Answer = Response<String>;

impl Console {
    async fn answer(&self, request: Request<hyper::body::Incoming>) -> Answer {
        let mut answer = self.route(request).await;
        respond::secure(&mut answer, &self.inner.csp);
        answer
    }

    async fn route(&self, request: Request<hyper::body::Incoming>) -> Answer {
        let inner = &self.inner;
        if !self.host_allowed(request.headers()) {
            return respond::plain(
                StatusCode::MISDIRECTED_REQUEST,
                "This console answers to its own address, localhost, and the names given with \
                 --console-host only.",
            );
        }
        let method = request.method().clone();
        if method != Method::GET && method != Method::POST {
            return respond::plain(StatusCode::METHOD_NOT_ALLOWED, "GET or POST only.");
        }
        if method == Method::POST && !self.origin_allowed(request.headers()) {
            return respond::forbidden("The form was not sent from this console.");
        }
        let now = inner.clock.now();
        let path = request.uri().path().to_string();
        let query = Fields::parse(request.uri().query().unwrap_or("").as_bytes());
        let session = self
            .cookie_of(request.headers())
            .and_then(|id| inner.sessions.get(&id, now).map(|s| (id, s)));
        let form = if method == Method::POST {
            match request.into_body().collect_limited(inner.max_body).await {
                Some(bytes) => Fields::parse(&bytes),
                None => {
                    return respond::plain(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "The form is larger than this console accepts (--max-result-bytes).",
                    );
                }
            }
        } else {
            Fields::default()
        };
        let mut call = Call {
            method,
            path,
            query,
            form,
            session,
            set_cookie: None,
            now,
        };
        // A session whose credential was removed from the tokens file is over.
        if let Some((id, session)) = &call.session
            && let Some(SignedIn {
                tenant,
                credential: Some(credential),
                ..
            }) = &session.signed_in
            && inner.credentials.current().tenant_of(credential).as_ref() != Some(tenant)
        {
            inner.sessions.remove(id);
            call.session = None;
        }
        if call.method == Method::POST {
            let sent = call.form.get("csrf");
            let expected = call.session.as_ref().map(|(_, s)| s.csrf.as_str());
            if !expected.is_some_and(|csrf| !sent.is_empty() && same_secret(sent, csrf)) {
                return respond::forbidden(
                    "This form did not carry this session's CSRF token (it was sent from \
                     elsewhere, or the session ended): nothing was changed. Reload the page and \
                     try again.",
                );
            }
        }
        if !(inner.ready)() {
            return respond::plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "The server is starting: its store is not migrated yet. Try again in a moment.",
            );
        }
        let mut answer = match pages::dispatch(self, &mut call).await {
            Ok(answer) => answer,
            Err(answer) => *answer,
        };
        if let Some(cookie) = call.set_cookie.take()
            && let Ok(value) = HeaderValue::from_str(&cookie)
        {
            answer.headers_mut().append(header::SET_COOKIE, value);
        }
        answer
    }

    /// The session cookie's value, if the request carries one.
    fn cookie_of(&self, headers: &http::HeaderMap) -> Option<String> {
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .find(|(name, _)| *name == self.inner.cookie)
            .map(|(_, value)| value.trim().to_string())
    }

    /// The `Set-Cookie` value for session `id` (or one that clears the cookie): HttpOnly,
    /// SameSite=Strict, for the whole console, ending with the browser's session.
    pub(crate) fn session_cookie(&self, id: Option<&str>) -> String {
        match id {
            Some(id) => format!(
                "{}={id}; Path=/; HttpOnly; SameSite=Strict",
                self.inner.cookie
            ),
            None => format!(
                "{}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0",
                self.inner.cookie
            ),
        }
    }

    /// Whether `Host` names this console: an IP address, `localhost`, or a `--console-host`
    /// name. A page that a DNS name of an attacker's points at this address sends that name,
    /// and is refused.
    fn host_allowed(&self, headers: &http::HeaderMap) -> bool {
        let Some(host) = headers.get(header::HOST).and_then(|v| v.to_str().ok()) else {
            // HTTP/1.0 without Host: no browser sends that.
            return false;
        };
        self.name_allowed(host)
    }

    fn name_allowed(&self, authority: &str) -> bool {
        let authority = authority.trim().to_ascii_lowercase();
        let name = if let Some(rest) = authority.strip_prefix('[') {
            // [v6]:port
            match rest.split_once(']') {
                Some((ip, _)) => return ip.parse::<IpAddr>().is_ok(),
                None => return false,
            }
        } else {
            authority
                .rsplit_once(':')
                .map_or(authority.as_str(), |(name, _)| name)
        };
        name == "localhost"
            || name.parse::<IpAddr>().is_ok()
            || self.inner.hosts.iter().any(|h| h == name)
    }

    /// Whether a POST's `Origin` (when the browser sends one) is this console.
    fn origin_allowed(&self, headers: &http::HeaderMap) -> bool {
        let Some(origin) = headers.get(header::ORIGIN) else {
            return true;
        };
        let Ok(origin) = origin.to_str() else {
            return false;
        };
        let host = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let authority = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"));
        authority.is_some_and(|a| a.eq_ignore_ascii_case(host) && self.name_allowed(a))
    }

    pub(crate) fn ledger(&self) -> &Ledger {
        &self.inner.ledger
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The credentials in force now.
    pub(crate) fn tenancy(&self) -> Arc<Tenancy> {
        self.inner.credentials.current()
    }

    pub(crate) fn sessions(&self) -> &Sessions {
        &self.inner.sessions
    }
}

/// Reading a body whole, up to a limit.
trait CollectLimited {
    /// The body's bytes; `None` when it is larger than `limit` or cannot be read.
    async fn collect_limited(self, limit: usize) -> Option<bytes::Bytes>;
}

impl CollectLimited for hyper::body::Incoming {
    async fn collect_limited(self, limit: usize) -> Option<bytes::Bytes> {
        http_body_util::Limited::new(self, limit)
            .collect()
            .await
            .ok()
            .map(http_body_util::Collected::to_bytes)
    }
}

/// Answers and the headers every answer carries.
pub(crate) mod respond {
    use http::{HeaderValue, Response, StatusCode, header};

    use super::Answer;
    use super::html::{Flash, Nav, esc, page};

    /// Sets the headers of every answer: no framing, no sniffing, no referrer beyond this
    /// console (keys are in URLs; within it, browsers then send `Origin` with a form, which
    /// `no-referrer` would make `null`), no caching (pages hold entries), and the
    /// Content-Security-Policy.
    pub fn secure(answer: &mut Answer, csp: &HeaderValue) {
        let headers = answer.headers_mut();
        headers.insert(header::CONTENT_SECURITY_POLICY, csp.clone());
        headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
        headers.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        headers.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("same-origin"),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        headers.insert(
            "cross-origin-opener-policy",
            HeaderValue::from_static("same-origin"),
        );
        headers.insert(
            "cross-origin-resource-policy",
            HeaderValue::from_static("same-origin"),
        );
    }

    /// An HTML page with `status`.
    pub fn html(status: StatusCode, body: String) -> Answer {
        let mut answer = Response::new(body);
        *answer.status_mut() = status;
        answer.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        );
        answer
    }

    /// A short page that only says `message`.
    pub fn plain(status: StatusCode, message: &str) -> Answer {
        let title = status.canonical_reason().unwrap_or("Error");
        let body = format!("<h1>{}</h1><p>{}</p>", esc(title), esc(message));
        html(status, page(title, Nav::None, None, None, &body))
    }

    /// 403 with `message`; nothing was changed.
    pub fn forbidden(message: &str) -> Answer {
        plain(StatusCode::FORBIDDEN, message)
    }

    /// 303 to `location` (a path of this console).
    pub fn redirect(location: &str) -> Answer {
        let mut answer = Response::new(String::new());
        *answer.status_mut() = StatusCode::SEE_OTHER;
        let location = if location.starts_with('/') && !location.starts_with("//") {
            location
        } else {
            "/"
        };
        if let Ok(value) = HeaderValue::from_str(location) {
            answer.headers_mut().insert(header::LOCATION, value);
        }
        answer
    }

    /// A flash message that went as asked.
    pub fn good(text: impl Into<String>) -> Flash {
        Flash {
            text: text.into(),
            good: true,
        }
    }

    /// A flash message that did not.
    pub fn bad(text: impl Into<String>) -> Flash {
        Flash {
            text: text.into(),
            good: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listen_setting_is_an_address_or_off() {
        assert_eq!(Listen::parse("off"), Ok(Listen::Off));
        assert_eq!(Listen::parse(" OFF "), Ok(Listen::Off));
        assert_eq!(
            Listen::parse(DEFAULT_LISTEN),
            Ok(Listen::At("127.0.0.1:50053".parse().expect("addr")))
        );
        assert_eq!(
            Listen::parse("[::1]:8080"),
            Ok(Listen::At("[::1]:8080".parse().expect("addr")))
        );
        for bad in ["", "localhost:50053", "127.0.0.1", "on"] {
            let e = Listen::parse(bad).expect_err(bad);
            assert!(e.contains("neither `off` nor an address"), "{e}");
        }
        assert_eq!(
            url("127.0.0.1:50053".parse().expect("addr")),
            "http://127.0.0.1:50053/"
        );
        assert_eq!(url("[::1]:1".parse().expect("addr")), "http://[::1]:1/");
    }
}
