//! The operator's console: server-rendered HTML pages served by the server itself over
//! HTTP/1.1 (axum's router on hyper), on loopback by default (`--console-listen`,
//! [`DEFAULT_LISTEN`]). No JavaScript, one inline stylesheet, nothing downloaded.
//!
//! - `/`: what needs a person: the unresolved entries (UNKNOWN, expired leases included),
//!   oldest first, each resolvable there through [`Ledger::reconcile`], the use case behind
//!   the Reconcile RPC, with the operator recorded as `resolved_by`.
//! - `/entries`: every entry by status, tool, run and time; `/find`: an entry by key, key
//!   prefix or `external_ref` ([`crate::ledger::find`]); `/entry`: one entry, every field,
//!   its arguments, its result and its timeline.
//! - `/replay-rate`: the replay rate per tool over the last hour, drawn ([`chart`]) from the
//!   same figures the `ReplayRate` RPC answers.
//! - `/approvals`: the calls awaiting a person's decision, decided there by an approver.
//! - `/signin`, `/signout`: with `--auth-tokens-file`, a session starts with a tenant's token
//!   and shows that tenant's entries only; without it, every session is tenant `default`.
//!
//! Safety: one middleware (`guard`) stands before every route, so that no page can be added
//! without it: a request whose `Host` is a name the console was not told of is refused (DNS
//! rebinding); every POST carries the session's CSRF token (refused with 403 and nothing
//! changed without it) and, when the browser sends one, an `Origin` of this console; and every
//! answer, refusals included, carries a Content-Security-Policy that allows nothing but the
//! page's own stylesheet, `X-Frame-Options: DENY` and `no-store`. Sessions ([`session`]) live
//! in the server's memory behind an HttpOnly, SameSite=Strict cookie.
//!
//! # Why maud
//!
//! The pages are written with maud's `html!`, which escapes every value spliced into it: a
//! stored `<script>` cannot reach a page as markup unless the code says `PreEscaped` (done once,
//! for the stylesheet). maud rather than askama, because the pages are mostly Rust already
//! (loops over entries, a `match` on an outcome, the chart's arithmetic): in maud they stay
//! Rust, checked by the compiler with the code around them, a part of a page is a function
//! returning `Markup`, and there are no template files, no second language and no
//! configuration beside the code. maud escapes `& < > "` and writes every attribute in
//! double quotes, so an apostrophe needs no escape; control characters, which escaping does not
//! touch, are shown as their pictures ([`html::visible`]).

pub mod chart;
pub mod html;
mod pages;
mod respond;
pub mod session;

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::middleware::{self, Next};
use axum::response::Response;
use base64::Engine as _;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;

use crate::credentials::{Credentials, Tenancy};
use crate::domain::Micros;
use crate::domain::time::Clock;
use crate::ledger::Ledger;
use crate::observe::Metrics;
use crate::observe::http::Limits;
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

/// Serves the console on `listener` until the task is dropped, at most [`MAX_CONNECTIONS`]
/// connections at once, each closed when its headers take longer than [`READ_TIMEOUT`] or it
/// lasts longer than [`CONNECTION_TIMEOUT`].
pub async fn serve(listener: TcpListener, console: Console) {
    let limits = Limits {
        name: "console",
        max_connections: MAX_CONNECTIONS,
        read_timeout: READ_TIMEOUT,
        connection_timeout: CONNECTION_TIMEOUT,
        keep_alive: true,
    };
    crate::observe::http::serve_within(listener, console.router(), limits).await;
}

/// An answer: a page, a redirect, or an error page.
pub(crate) type Answer = Response;

/// What the guard learned of a request, for the pages (a request extension): the ledger's
/// time, the live session, and where a page leaves the cookie to set with the answer.
#[derive(Clone)]
pub(crate) struct Visit {
    /// The ledger's time at the request.
    pub now: Micros,
    /// The session's cookie value and the session, when there is a live one.
    pub session: Option<(String, Session)>,
    /// A `Set-Cookie` for the answer: a new session's, or one that clears it.
    set_cookie: Arc<Mutex<Option<HeaderValue>>>,
}

impl<S: Sync> FromRequestParts<S> for Visit {
    type Rejection = Answer;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Visit, Answer> {
        parts.extensions.get::<Visit>().cloned().ok_or_else(|| {
            respond::plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                "This page was not reached through the console's guard.",
            )
        })
    }
}

impl Visit {
    /// Sets the session cookie with the answer: session `id`'s, or one that clears it.
    pub fn set_cookie(&self, console: &Console, id: Option<&str>) {
        let value = HeaderValue::from_str(&console.session_cookie(id)).ok();
        *self
            .set_cookie
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = value;
    }
}

impl Console {
    /// The console's routes, behind its guard.
    fn router(&self) -> Router {
        pages::routes()
            .layer(middleware::from_fn_with_state(self.clone(), guard))
            // The guard read the body with its bound already.
            .layer(DefaultBodyLimit::max(self.inner.max_body))
            .with_state(self.clone())
    }
}

/// Stands before every page: the host check, the CSRF check of every POST (and its `Origin`),
/// the session, and the headers of every answer.
async fn guard(State(console): State<Console>, request: Request, next: Next) -> Response {
    let mut answer = console.admit(request, next).await;
    respond::secure(&mut answer, &console.inner.csp);
    answer
}

impl Console {
    /// The request, on to its page when it passes the guard's checks, with its [`Visit`].
    async fn admit(&self, request: Request, next: Next) -> Response {
        let inner = &self.inner;
        if !self.host_allowed(request.headers()) {
            return respond::plain(
                StatusCode::MISDIRECTED_REQUEST,
                "This console answers to its own address, localhost, and the names given with \
                 --console-host only.",
            );
        }
        let now = inner.clock.now();
        let session = self.session_of(request.headers(), now);
        let mut request = if request.method() == Method::POST {
            match self.form_checked(request, session.as_ref()).await {
                Ok(request) => request,
                Err(refused) => return refused,
            }
        } else {
            request
        };
        if !(inner.ready)() {
            return respond::plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "The server is starting: its store is not migrated yet. Try again in a moment.",
            );
        }
        let set_cookie = Arc::default();
        request.extensions_mut().insert(Visit {
            now,
            session,
            set_cookie: Arc::clone(&set_cookie),
        });
        let mut answer = next.run(request).await;
        let cookie = set_cookie
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(cookie) = cookie {
            answer.headers_mut().append(header::SET_COOKIE, cookie);
        }
        answer
    }

    /// The live session the request's cookie names. A session whose credential was removed
    /// from the tokens file is over.
    fn session_of(&self, headers: &HeaderMap, now: Micros) -> Option<(String, Session)> {
        let inner = &self.inner;
        let (id, session) = self
            .cookie_of(headers)
            .and_then(|id| inner.sessions.get(&id, now).map(|s| (id, s)))?;
        if let Some(SignedIn {
            tenant,
            credential: Some(credential),
            ..
        }) = &session.signed_in
            && inner.credentials.current().tenant_of(credential).as_ref() != Some(tenant)
        {
            inner.sessions.remove(&id);
            return None;
        }
        Some((id, session))
    }

    /// A POST, read whole up to the bound, when it comes from this console's page (its
    /// `Origin`, when the browser sends one) and carries `session`'s CSRF token; else the
    /// refusal (nothing was changed).
    async fn form_checked(
        &self,
        request: Request,
        session: Option<&(String, Session)>,
    ) -> Result<Request, Response> {
        if !self.origin_allowed(request.headers()) {
            return Err(respond::forbidden(
                "The form was not sent from this console.",
            ));
        }
        let (parts, body) = request.into_parts();
        let Ok(bytes) = axum::body::to_bytes(body, self.inner.max_body).await else {
            return Err(respond::plain(
                StatusCode::PAYLOAD_TOO_LARGE,
                "The form is larger than this console accepts (--max-result-bytes).",
            ));
        };
        let sent = form_urlencoded::parse(&bytes)
            .find(|(name, _)| name == "csrf")
            .map(|(_, value)| value);
        let expected = session.map(|(_, s)| s.csrf.as_str());
        if !expected
            .is_some_and(|csrf| sent.is_some_and(|s| !s.is_empty() && same_secret(&s, csrf)))
        {
            return Err(respond::forbidden(
                "This form did not carry this session's CSRF token (it was sent from \
                 elsewhere, or the session ended): nothing was changed. Reload the page and try \
                 again.",
            ));
        }
        Ok(Request::from_parts(parts, Body::from(bytes)))
    }

    /// The session cookie's value, if the request carries one.
    fn cookie_of(&self, headers: &HeaderMap) -> Option<String> {
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
    fn session_cookie(&self, id: Option<&str>) -> String {
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
    fn host_allowed(&self, headers: &HeaderMap) -> bool {
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
    fn origin_allowed(&self, headers: &HeaderMap) -> bool {
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
