//! The console's pages: axum's routes, each a handler that reads the ledger for the session's
//! tenant and writes its HTML with maud's `html!` (every value escaped by construction).

use std::str::FromStr as _;

use axum::Router;
use axum::extract::{Form, FromRequestParts, Query, State};
use axum::http::request::Parts;
use axum::routing::{get, post};
use http::{HeaderValue, Method, StatusCode, header};
use maud::{Markup, html};
use serde::Deserialize;

use super::chart::series_svg;
use super::html::{
    Flash, Nav, Viewer, csrf_field, entry_path, hidden_field, page, precise_time, shorten, shown,
    shown_html, span, time, with_query,
};
use super::respond::{self, bad, good};
use super::session::SignedIn;
use super::{Answer, Console, Visit};
use crate::credentials::{Credential, Identity};
use crate::domain::fields::{HoldToken, Principal};
use crate::domain::key::Key;
use crate::domain::{Completion, Entry, FinalStatus, Micros, StaleReason, Status, Tenant};
use crate::error::LedgerError;
use crate::ledger::find::{KeyQuery, SEARCH_LIMIT, Verdict, missing_message};
use crate::ledger::{
    AcknowledgeInput, EntryView, Finding, ListInput, ListOutput, LookupInput, ResolutionOutcome,
};

mod approvals;
mod attention;
mod entries;
mod entry;
mod forms;
mod rate;

/// A page, or the page of what went wrong (`Err` only shortens the code; both are answers).
type PageResult = Result<Answer, Answer>;

/// Entries a page lists.
const PAGE_SIZE: u32 = 50;

/// Longest operator name a form may give.
const MAX_OPERATOR_CHARS: usize = 64;

/// The console's pages, by path and method; any other path is 404, another method 405.
pub(super) fn routes() -> Router<Console> {
    Router::new()
        .route("/", get(attention::attention))
        .route("/entries", get(entries::entries))
        .route("/find", get(entries::find))
        .route("/entry", get(entry::entry))
        .route("/replay-rate", get(rate::replay_rate))
        .route("/approvals", get(approvals::approvals))
        .route("/signin", get(sign_in_page).post(sign_in))
        .route("/signout", post(sign_out))
        .route("/resolve", post(attention::resolve))
        .route("/acknowledge", post(attention::acknowledge))
        .route("/decide", post(approvals::decide))
        .fallback(async || {
            respond::plain(
                StatusCode::NOT_FOUND,
                "There is no such page in this console.",
            )
        })
        .method_not_allowed_fallback(async || {
            respond::plain(
                StatusCode::METHOD_NOT_ALLOWED,
                "This page does not take that method.",
            )
        })
}

/// The query fields the pages read (`/entry?key=…`, `/entries?status=…&page_token=…`); each
/// page reads its own and ignores the others.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Params {
    /// A list's next page, as the previous one gave it.
    page_token: String,
    /// An entry's key (`/entry`).
    key: String,
    /// What to find (`/find`).
    q: String,
    /// The entries' filters (`/entries`); `tool` also on `/replay-rate`.
    status: String,
    tool: String,
    run: String,
    since: String,
    until: String,
}

/// The session a page is shown to, and the console it is on: a handler that takes it is for
/// signed-in sessions only.
/// Without credentials configured, a request without one gets a new session of tenant
/// `default`; with them, a page asks to sign in and a form is refused.
struct Who {
    /// The console it is on.
    console: Console,
    tenant: Tenant,
    /// The session's cookie value.
    id: String,
    csrf: String,
    operator: String,
    flash: Option<Flash>,
    /// Whether it signed in with a token (so it can sign out).
    signed_in_with_token: bool,
    /// With the approver role (its credential's, or everyone's without credentials
    /// configured): the principal its decisions are recorded as.
    approver: Option<Principal>,
    /// The ledger's time at the request.
    now: Micros,
}

impl Who {
    fn viewer(&self) -> Viewer<'_> {
        Viewer {
            tenant: self.tenant.as_str(),
            sign_out_csrf: self.signed_in_with_token.then_some(self.csrf.as_str()),
        }
    }

    fn page(&self, title: &str, nav: Nav, body: Markup) -> Markup {
        page(title, nav, Some(&self.viewer()), self.flash.as_ref(), body)
    }
}

impl FromRequestParts<Console> for Who {
    type Rejection = Answer;

    async fn from_request_parts(parts: &mut Parts, console: &Console) -> Result<Who, Answer> {
        let visit = Visit::from_request_parts(parts, console).await?;
        if let Some((id, session)) = &visit.session
            && let Some(signed_in) = &session.signed_in
        {
            let approver = match &signed_in.credential {
                Some(credential) => console
                    .tenancy()
                    .identity_of(credential)
                    .and_then(|identity| identity.approver),
                None => Identity::anonymous().approver,
            };
            return Ok(Who {
                console: console.clone(),
                tenant: signed_in.tenant.clone(),
                id: id.clone(),
                csrf: session.csrf.clone(),
                operator: signed_in.operator.clone(),
                flash: session.flash.clone(),
                signed_in_with_token: signed_in.credential.is_some(),
                approver,
                now: visit.now,
            });
        }
        if console.tenancy().requires_credentials() {
            return Err(if parts.method == Method::POST {
                respond::forbidden("Sign in first: nothing was changed.")
            } else {
                respond::redirect("/signin")
            });
        }
        let signed_in = SignedIn {
            tenant: Tenant::default_tenant(),
            credential: None,
            operator: String::new(),
        };
        let (id, session) = console
            .sessions()
            .create(visit.now, Some(signed_in))
            .map_err(|e| failure(&e))?;
        visit.set_cookie(console, Some(&id));
        Ok(Who {
            console: console.clone(),
            tenant: Tenant::default_tenant(),
            id,
            csrf: session.csrf,
            operator: String::new(),
            flash: None,
            signed_in_with_token: false,
            approver: Identity::anonymous().approver,
            now: visit.now,
        })
    }
}

/// The page of a call that failed: the error table's HTTP status ([`Reason::face`], as gRPC
/// reads its code from the same row), the error's own message (never the database's words:
/// those are logged, once, here) and `Retry-After` where waiting helps. The console's one
/// answer to a ledger error.
///
/// [`Reason::face`]: crate::reason::Reason::face
fn failure(error: &LedgerError) -> Answer {
    error.log_detail();
    let face = error.reason().face();
    let status = StatusCode::from_u16(face.http).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let message = if status == StatusCode::INTERNAL_SERVER_ERROR {
        format!("{error}; the server's log has the details.")
    } else {
        format!("{error}.")
    };
    let mut answer = respond::plain(status, &message);
    if let Some(delay) = face.retry_after {
        answer.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(delay.as_secs().max(1)),
        );
    }
    answer
}

// ---- signing in -------------------------------------------------------------------------

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SignInForm {
    token: String,
    operator: String,
}

async fn sign_in_page(State(console): State<Console>, visit: Visit) -> Answer {
    sign_in_form(&console, &visit, None, StatusCode::OK)
}

/// The sign-in page, with the `problem` of a sign-in that was refused.
fn sign_in_form(
    console: &Console,
    visit: &Visit,
    problem: Option<&str>,
    status: StatusCode,
) -> Answer {
    if !console.tenancy().requires_credentials() {
        return respond::redirect("/");
    }
    if visit
        .session
        .as_ref()
        .is_some_and(|(_, s)| s.signed_in.is_some())
        && problem.is_none()
    {
        return respond::redirect("/");
    }
    // The form needs a session for its CSRF token, before anyone signed in.
    let csrf = match &visit.session {
        Some((_, session)) => session.csrf.clone(),
        None => {
            let (id, session) = match console.sessions().create(visit.now, None) {
                Ok(created) => created,
                Err(e) => return failure(&e),
            };
            visit.set_cookie(console, Some(&id));
            session.csrf
        }
    };
    let body = html! {
        div class="signin card" {
            h1 { "Sign in" }
            p class="lead" {
                "With the token of a tenant, as callers send it in "
                code { "authorization: Bearer" }
                ". The console then shows that tenant's entries only."
            }
            @if let Some(problem) = problem { p class="flash bad" { (problem) } }
            form method="post" action="/signin" {
                (csrf_field(&csrf))
                label {
                    "Token"
                    input type="password" name="token" autocomplete="off" required autofocus;
                }
                label {
                    "Your name (optional: recorded as who resolved an entry)"
                    input type="text" name="operator" maxlength=(MAX_OPERATOR_CHARS);
                }
                button type="submit" { "Sign in" }
            }
        }
    };
    respond::html(status, page("Sign in", Nav::None, None, None, body))
}

async fn sign_in(
    State(console): State<Console>,
    visit: Visit,
    Form(form): Form<SignInForm>,
) -> PageResult {
    if !console.tenancy().requires_credentials() {
        return Ok(respond::redirect("/"));
    }
    let operator = match operator_name(&form.operator) {
        Ok(name) => name,
        Err(problem) => {
            return Ok(sign_in_form(
                &console,
                &visit,
                Some(&problem),
                StatusCode::BAD_REQUEST,
            ));
        }
    };
    let credential = Credential::of(&form.token);
    let Some(tenant) = console.tenancy().tenant_of(&credential) else {
        tracing::info!("console: a sign-in with an unknown token was refused");
        return Ok(sign_in_form(
            &console,
            &visit,
            Some("This server knows no such token."),
            StatusCode::UNAUTHORIZED,
        ));
    };
    // A new session id once signed in, so that an id known before cannot be used after.
    if let Some((old, _)) = &visit.session {
        console.sessions().remove(old);
    }
    tracing::info!(tenant = tenant.as_str(), operator = %operator, "console: signed in");
    let signed_in = SignedIn {
        tenant,
        credential: Some(credential),
        operator,
    };
    let (id, _) = console
        .sessions()
        .create(visit.now, Some(signed_in))
        .map_err(|e| failure(&e))?;
    visit.set_cookie(&console, Some(&id));
    Ok(respond::redirect("/"))
}

async fn sign_out(State(console): State<Console>, visit: Visit) -> Answer {
    if let Some((id, _)) = &visit.session {
        console.sessions().remove(id);
    }
    visit.set_cookie(&console, None);
    respond::redirect(if console.tenancy().requires_credentials() {
        "/signin"
    } else {
        "/"
    })
}

/// An operator's name from a form: trimmed, at most [`MAX_OPERATOR_CHARS`] characters, no
/// control characters.
fn operator_name(text: &str) -> Result<String, String> {
    let name = text.trim();
    if name.chars().count() > MAX_OPERATOR_CHARS {
        return Err(format!(
            "Your name may have at most {MAX_OPERATOR_CHARS} characters."
        ));
    }
    if name.chars().any(char::is_control) {
        return Err("Your name may not contain control characters.".into());
    }
    Ok(name.to_string())
}

/// A page of the tenant's entries in `status`, oldest first, from where `page_token` says.
async fn listed(who: &Who, status: Status, page_token: String) -> Result<ListOutput, Answer> {
    let input = ListInput {
        status: Some(status),
        page_size: PAGE_SIZE,
        page_token,
        ..ListInput::default()
    };
    who.console
        .ledger()
        .list_entries(&who.tenant, input)
        .await
        .map_err(|e| failure(&e))
}

/// The link to an entry's page, named by its key's first characters.
fn entry_link(key: &str) -> Markup {
    html! { a href=(entry_path(key)) { (shorten(key, 17)) } }
}

/// The link to a list's next page, when there is one.
fn pager(path: &str, filters: &[(&str, &str)], next_page_token: &str) -> Markup {
    let mut pairs = filters.to_vec();
    pairs.push(("page_token", next_page_token));
    html! {
        @if !next_page_token.is_empty() {
            p class="pager" { a href=(with_query(path, &pairs)) { "Next " (PAGE_SIZE) " →" } }
        }
    }
}

/// A form refused for `problem` (400); nothing was changed.
fn bad_request(problem: &str) -> Answer {
    respond::plain(StatusCode::BAD_REQUEST, problem)
}

/// The operator's name a form gives, and who the ledger records a change as: `console:NAME`,
/// or `console:TENANT` without a name; or what is wrong with the name.
fn recorded_as(who: &Who, name: &str) -> Result<(String, String), String> {
    let operator = operator_name(name)?;
    let principal = if operator.is_empty() {
        format!("console:{}", who.tenant.as_str())
    } else {
        format!("console:{operator}")
    };
    Ok((operator, principal))
}

/// Where a form goes back to: the path it names, or the entry's page.
fn back_to(back: &str, key: &str) -> String {
    if back.starts_with('/') && !back.starts_with("//") {
        back.to_string()
    } else {
        entry_path(key)
    }
}

fn status_badge(status: Status) -> Markup {
    html! { span class={ "badge s-" (status.as_str()) } { (status.as_str()) } }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operator_name_is_short_text() {
        assert_eq!(operator_name("  ada "), Ok("ada".into()));
        assert_eq!(operator_name(""), Ok(String::new()));
        assert!(operator_name(&"x".repeat(65)).is_err());
        assert!(operator_name("a\u{7}b").is_err());
    }

    /// Every error a use case can refuse with reaches the console's page with the error
    /// table's HTTP status (the row gRPC reads its code from), its own message, Retry-After
    /// where waiting helps, and never the database's words.
    #[tokio::test]
    async fn every_reason_is_answered_with_the_tables_status() {
        let mut answered = 0;
        for reason in crate::reason::Reason::all() {
            let Some(error) = crate::grpc::error::samples::sample(reason) else {
                continue;
            };
            answered += 1;
            let page = failure(&error);
            let face = reason.face();
            assert_eq!(page.status().as_u16(), face.http, "{reason}");
            let retry = page
                .headers()
                .get(header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            assert_eq!(
                retry,
                face.retry_after.map(|d| d.as_secs().max(1)),
                "{reason}"
            );
            let body = axum::body::to_bytes(page.into_body(), usize::MAX)
                .await
                .expect("body");
            let body = String::from_utf8_lossy(&body);
            let message = html! { (error.to_string()) }.into_string();
            assert!(body.contains(&message), "{reason}: {body}");
            assert!(
                !body.contains("/var/lib") && !body.contains("block 7"),
                "{reason}: {body}"
            );
        }
        // The transport's reasons (a credential, a role, a limit, a deadline, the codec) are
        // the seven the console never meets as a use case's error.
        assert_eq!(answered, crate::reason::Reason::all().count() - 7);
    }
}
