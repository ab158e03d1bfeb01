//! The console's pages: each reads the ledger for the session's tenant and renders HTML in
//! which every stored value is escaped ([`super::html`]).

use std::fmt::Write as _;
use std::str::FromStr as _;

use http::{HeaderValue, Method, StatusCode, header};

use super::chart::series_svg;
use super::html::{
    Flash, Nav, Viewer, entry_href, entry_path, esc, page, precise_time, query, shorten, shown,
    shown_html, span, time,
};
use super::respond::{self, bad, good};
use super::session::SignedIn;
use super::{Answer, Call, Console};
use crate::domain::key::{ExplicitKey, HoldToken, Key, Principal};
use crate::domain::{Completion, Entry, FinalStatus, Micros, StaleReason, Status, Tenant};
use crate::error::LedgerError;
use crate::grpc::auth::{Credential, Identity};
use crate::ledger::find::{KeyQuery, SEARCH_LIMIT, Verdict, missing_message};
use crate::ledger::{
    AcknowledgeInput, EntryView, Finding, ListInput, LookupInput, ResolutionOutcome,
};

mod approvals;
mod entry;
mod rate;

/// A page, or the page of what went wrong (boxed: `Err` only shortens the code, and an answer
/// is large).
type PageResult = Result<Answer, Box<Answer>>;

/// Entries a page lists.
const PAGE_SIZE: u32 = 50;

/// Longest operator name a form may give.
const MAX_OPERATOR_CHARS: usize = 64;

/// The session a page is shown to.
struct Who {
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
}

impl Who {
    fn viewer(&self) -> Viewer<'_> {
        Viewer {
            tenant: self.tenant.as_str(),
            sign_out_csrf: self.signed_in_with_token.then_some(self.csrf.as_str()),
        }
    }

    fn page(&self, title: &str, nav: Nav, body: &str) -> String {
        page(title, nav, Some(&self.viewer()), self.flash.as_ref(), body)
    }
}

/// Runs the page `call` asks for.
///
/// # Errors
/// The error page to answer with (`Err` only shortens the code; both are answers).
pub(super) async fn dispatch(console: &Console, call: &mut Call) -> PageResult {
    let post = call.method == Method::POST;
    match (post, call.path.as_str()) {
        (false, "/signin") => return sign_in_page(console, call, None, StatusCode::OK),
        (true, "/signin") => return sign_in(console, call),
        (true, "/signout") => return Ok(sign_out(console, call)),
        _ => {}
    }
    let known = matches!(
        call.path.as_str(),
        "/" | "/entries"
            | "/find"
            | "/entry"
            | "/replay-rate"
            | "/resolve"
            | "/acknowledge"
            | "/approvals"
            | "/decide"
    );
    if !known {
        return Err(Box::new(respond::plain(
            StatusCode::NOT_FOUND,
            "There is no such page in this console.",
        )));
    }
    let who = who(console, call)?;
    match (post, call.path.as_str()) {
        (false, "/") => attention(console, call, &who).await,
        (false, "/entries") => entries(console, call, &who).await,
        (false, "/find") => find(console, call, &who).await,
        (false, "/entry") => entry::entry(console, call, &who).await,
        (false, "/replay-rate") => Ok(rate::replay_rate(console, call, &who)),
        (true, "/resolve") => resolve(console, call, &who).await,
        (true, "/acknowledge") => acknowledge(console, call, &who).await,
        (false, "/approvals") => approvals::approvals(console, call, &who).await,
        (true, "/decide") => approvals::decide(console, call, &who).await,
        _ => Err(Box::new(respond::plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "This page does not take that method.",
        ))),
    }
}

/// The signed-in session of `call`. Without credentials configured, a request without one gets
/// a new session of tenant `default`; with them, a page asks to sign in and a form is refused.
fn who(console: &Console, call: &mut Call) -> Result<Who, Box<Answer>> {
    if let Some((id, session)) = &call.session
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
            tenant: signed_in.tenant.clone(),
            id: id.clone(),
            csrf: session.csrf.clone(),
            operator: signed_in.operator.clone(),
            flash: session.flash.clone(),
            signed_in_with_token: signed_in.credential.is_some(),
            approver,
        });
    }
    if console.tenancy().requires_credentials() {
        return Err(Box::new(if call.method == Method::POST {
            respond::forbidden("Sign in first: nothing was changed.")
        } else {
            respond::redirect("/signin")
        }));
    }
    let signed_in = SignedIn {
        tenant: Tenant::default_tenant(),
        credential: None,
        operator: String::new(),
    };
    let (id, session) = console
        .sessions()
        .create(call.now, Some(signed_in))
        .map_err(|e| failure(&e))?;
    call.set_cookie = Some(console.session_cookie(Some(&id)));
    Ok(Who {
        tenant: Tenant::default_tenant(),
        id,
        csrf: session.csrf,
        operator: String::new(),
        flash: None,
        signed_in_with_token: false,
        approver: Identity::anonymous().approver,
    })
}

/// The page of a ledger error: what a person can act on, never the store's own words.
/// The page of a call that failed: the error table's HTTP status ([`Reason::face`], as gRPC
/// reads its code from the same row), the error's own message (never the database's words:
/// those are logged, once, here) and `Retry-After` where waiting helps.
///
/// [`Reason::face`]: crate::reason::Reason::face
fn failure(error: &LedgerError) -> Box<Answer> {
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
    Box::new(answer)
}

// ---- signing in -------------------------------------------------------------------------

fn sign_in_page(
    console: &Console,
    call: &mut Call,
    problem: Option<&str>,
    status: StatusCode,
) -> PageResult {
    if !console.tenancy().requires_credentials() {
        return Ok(respond::redirect("/"));
    }
    if call
        .session
        .as_ref()
        .is_some_and(|(_, s)| s.signed_in.is_some())
        && problem.is_none()
    {
        return Ok(respond::redirect("/"));
    }
    // The form needs a session for its CSRF token, before anyone signed in.
    let csrf = match &call.session {
        Some((_, session)) => session.csrf.clone(),
        None => {
            let (id, session) = console
                .sessions()
                .create(call.now, None)
                .map_err(|e| failure(&e))?;
            call.set_cookie = Some(console.session_cookie(Some(&id)));
            session.csrf
        }
    };
    let mut body = String::from("<div class=\"signin card\"><h1>Sign in</h1>");
    body.push_str(
        "<p class=\"lead\">With the token of a tenant, as callers send it in \
         <code>authorization: Bearer</code>. The console then shows that tenant's entries only.</p>",
    );
    if let Some(problem) = problem {
        let _ = write!(body, "<p class=\"flash bad\">{}</p>", esc(problem));
    }
    let _ = write!(
        body,
        "<form method=\"post\" action=\"/signin\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <label>Token<input type=\"password\" name=\"token\" autocomplete=\"off\" required \
         autofocus></label>\
         <label>Your name (optional: recorded as who resolved an entry)\
         <input type=\"text\" name=\"operator\" maxlength=\"{MAX_OPERATOR_CHARS}\"></label>\
         <button type=\"submit\">Sign in</button></form></div>",
        esc(&csrf)
    );
    Ok(respond::html(
        status,
        page("Sign in", Nav::None, None, None, &body),
    ))
}

fn sign_in(console: &Console, call: &mut Call) -> PageResult {
    if !console.tenancy().requires_credentials() {
        return Ok(respond::redirect("/"));
    }
    let operator = match operator_name(call.form.get("operator")) {
        Ok(name) => name,
        Err(problem) => {
            return sign_in_page(console, call, Some(&problem), StatusCode::BAD_REQUEST);
        }
    };
    let credential = Credential::of(call.form.get("token"));
    let Some(tenant) = console.tenancy().tenant_of(&credential) else {
        tracing::info!("console: a sign-in with an unknown token was refused");
        return sign_in_page(
            console,
            call,
            Some("This server knows no such token."),
            StatusCode::UNAUTHORIZED,
        );
    };
    // A new session id once signed in, so that an id known before cannot be used after.
    if let Some((old, _)) = &call.session {
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
        .create(call.now, Some(signed_in))
        .map_err(|e| failure(&e))?;
    call.set_cookie = Some(console.session_cookie(Some(&id)));
    Ok(respond::redirect("/"))
}

fn sign_out(console: &Console, call: &mut Call) -> Answer {
    if let Some((id, _)) = &call.session {
        console.sessions().remove(id);
    }
    call.set_cookie = Some(console.session_cookie(None));
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

// ---- what needs a person ----------------------------------------------------------------

async fn attention(console: &Console, call: &Call, who: &Who) -> PageResult {
    let input = ListInput {
        status: Some(Status::Unknown),
        page_size: PAGE_SIZE,
        page_token: call.query.get("page_token").to_string(),
        ..ListInput::default()
    };
    let page_token = input.page_token.clone();
    let out = console
        .ledger()
        .list_entries(&who.tenant, input)
        .await
        .map_err(|e| failure(&e))?;
    let mut body = String::from("<h1>Needs a person</h1>");
    // First what may have happened twice: nothing settles it but a person.
    if page_token.is_empty() {
        body.push_str(&double_effects(console, who).await?);
    }
    body.push_str(
        "<p class=\"lead\">Outcomes nobody knows: reported UNKNOWN by their claimant, or \
         attempts whose lease ended without a Complete. Until someone resolves them, every \
         repeat gets IN_PROGRESS and nothing runs again. Oldest first. Ask the outside world \
         (by the external_ref) whether the action happened, then resolve the entry here, as a \
         reconciler would.</p>",
    );
    if out.entries.is_empty() {
        body.push_str(if page_token.is_empty() {
            "<div class=\"card\"><b>Nothing needs a person.</b> <span class=\"muted\">No \
             entry of this tenant is unknown.</span></div>"
        } else {
            "<div class=\"card\">No more unknown entries.</div>"
        });
    } else {
        body.push_str(
            "<table><thead><tr><th>Age</th><th>Tool</th><th>external_ref</th>\
             <th class=\"num\">Attempt</th><th>Run</th><th>Key</th><th>Why unknown</th>\
             <th>Resolve</th></tr></thead><tbody>",
        );
        for view in &out.entries {
            let e = &view.entry;
            let why = if e.status == Status::Attempting {
                format!(
                    "lease ended {} ago",
                    span(call.now.minus(e.lease_expires_at))
                )
            } else if e.error.is_empty() {
                "reported unknown".to_string()
            } else {
                format!("reported unknown: {}", shorten(&e.error, 80))
            };
            let _ = write!(
                body,
                "<tr><td title=\"started {started}\">{age}</td><td>{tool}</td>\
                 <td class=\"mono\">{xref}</td><td class=\"num\">{attempt}</td><td>{run}</td>\
                 <td class=\"mono\"><a href=\"{href}\">{short}</a></td><td>{why}</td>\
                 <td><details><summary>Resolve…</summary>{form}</details></td></tr>",
                started = esc(&time(e.started_at)),
                age = esc(&span(call.now.minus(e.started_at))),
                tool = esc(e.tool.as_str()),
                xref = esc(&view.external_ref),
                attempt = e.attempt,
                run = esc(&shorten(e.run_id_str(), 32)),
                href = entry_href(e.key.as_str()),
                short = esc(&shorten(e.key.as_str(), 17)),
                why = esc(&why),
                form = resolve_form(who, e, "/"),
            );
        }
        body.push_str("</tbody></table>");
        if !out.next_page_token.is_empty() {
            let _ = write!(
                body,
                "<p class=\"pager\"><a href=\"/{}\">Next {PAGE_SIZE} →</a></p>",
                query(&[("page_token", &out.next_page_token)])
            );
        }
    }
    Ok(respond::html(
        StatusCode::OK,
        who.page("Needs a person", Nav::Attention, &body),
    ))
}

/// The form that resolves the entry `e`, as a reconciler's resolution would, fenced by what
/// the page showed: its attempt and its newest hold, sent back so that a person's finding
/// settles that attempt only, and only if no reconciler was handed the entry since; `back` is
/// where to go after it.
fn resolve_form(who: &Who, e: &Entry, back: &str) -> String {
    format!(
        "<form class=\"resolve\" method=\"post\" action=\"/resolve\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <input type=\"hidden\" name=\"key\" value=\"{key}\">\
         <input type=\"hidden\" name=\"attempt\" value=\"{attempt}\">\
         <input type=\"hidden\" name=\"hold\" value=\"{hold}\">\
         <input type=\"hidden\" name=\"back\" value=\"{back}\">\
         <fieldset><legend>What does the outside world say?</legend>\
         <label><input type=\"radio\" name=\"outcome\" value=\"found\" required> Found: it \
         happened (its result below is replayed to every repeat)</label>\
         <label><input type=\"radio\" name=\"outcome\" value=\"not_found\"> Not found: it did \
         not happen; a repeat may try again</label>\
         <label><input type=\"radio\" name=\"outcome\" value=\"failed\"> Failed for good: it \
         did not happen and must not be tried again</label></fieldset>\
         <label>Result, with Found (stored as typed)<textarea name=\"result\" rows=\"3\">\
         </textarea></label>\
         <label>Note, with Not found or Failed (stored as the entry's error)\
         <input type=\"text\" name=\"error\"></label>\
         <label>Your name (recorded: resolved_by = console:NAME)<input type=\"text\" \
         name=\"operator\" maxlength=\"{MAX_OPERATOR_CHARS}\" value=\"{operator}\"></label>\
         <button type=\"submit\">Resolve</button></form>",
        csrf = esc(&who.csrf),
        key = esc(e.key.as_str()),
        attempt = e.attempt,
        hold = esc(e.hold_token.as_str()),
        back = esc(back),
        operator = esc(&who.operator),
    )
}

async fn resolve(console: &Console, call: &Call, who: &Who) -> PageResult {
    let key = call.form.get("key").to_string();
    let back = match call.form.get("back") {
        b if b.starts_with('/') && !b.starts_with("//") => b.to_string(),
        _ => entry_path(&key),
    };
    let (status, retryable, default_error) = match call.form.get("outcome") {
        "found" => (FinalStatus::Succeeded, false, ""),
        "not_found" => (
            FinalStatus::Failed,
            true,
            "not found in the outside world (resolved in the console)",
        ),
        "failed" => (
            FinalStatus::Failed,
            false,
            "failed for good (resolved in the console)",
        ),
        _ => {
            return Err(Box::new(respond::plain(
                StatusCode::BAD_REQUEST,
                "Choose what the outside world says: found, not found, or failed for good. \
                 Nothing was changed.",
            )));
        }
    };
    let bad_request = |text: &str| Box::new(respond::plain(StatusCode::BAD_REQUEST, text));
    let attempt: u32 = match call.form.get("attempt").parse() {
        Ok(n) if n > 0 => n,
        _ => {
            return Err(bad_request(
                "The form names no attempt: reload the page and resolve from there. Nothing \
                 was changed.",
            ));
        }
    };
    let operator = operator_name(call.form.get("operator")).map_err(|p| bad_request(&p))?;
    let principal = if operator.is_empty() {
        format!("console:{}", who.tenant.as_str())
    } else {
        format!("console:{operator}")
    };
    let principal = Principal::parse(&principal).map_err(|e| bad_request(&e.message))?;
    let (result, error) = if status == FinalStatus::Succeeded {
        (call.form.get("result").as_bytes().to_vec(), String::new())
    } else {
        let note = call.form.get("error").trim();
        let note = if note.is_empty() { default_error } else { note };
        (Vec::new(), note.to_string())
    };
    let key = Key::from(ExplicitKey::parse(&key).map_err(|e| bad_request(&e.message))?);
    let completion = Completion::new(status, result, error, retryable)
        .map_err(|e| bad_request(&format!("{}: {}", e.field, e.message)))?;
    let finding = Finding {
        key: key.clone(),
        attempt,
        // The hold the page showed: none when no reconciler had been handed the entry.
        hold: HoldToken::from_stored(call.form.get("hold").to_string()),
        completion,
    };
    let ledger = console.ledger().clone();
    // In a task of its own: a browser that goes away does not abandon the write halfway.
    let tenant = who.tenant.clone();
    let by = principal.clone();
    let out = tokio::spawn(async move { ledger.settle(&tenant, &finding, &by).await })
        .await
        .map_err(|e| failure(&LedgerError::Internal(format!("resolution task: {e}"))))?
        .map_err(|e| failure(&e))?;
    console.metrics().resolutions([status]);
    console.metrics().findings(std::slice::from_ref(&out));
    console.sessions().set_operator(&who.id, &operator);
    let short = shorten(key.as_str(), 17);
    let flash = match (&out.outcome, &out.entry) {
        (ResolutionOutcome::Applied, Some(after)) => {
            tracing::info!(
                tenant = who.tenant.as_str(),
                key = crate::observe::telemetry::key_prefix(key.as_str()),
                status = after.entry.status.as_str(),
                resolved_by = %principal,
                "console: resolved an unknown outcome"
            );
            good(format!(
                "Resolved {short} as {}{}, recorded as resolved by {principal}. {}",
                after.entry.status.as_str(),
                if after.entry.retryable {
                    " (retryable)"
                } else {
                    ""
                },
                next_claim(&after.entry.status, after.entry.retryable)
            ))
        }
        // As a page of an entry that is not there: never told apart from another tenant's.
        (ResolutionOutcome::NotFound, _) | (_, None) => {
            return Err(failure(&LedgerError::NotFound));
        }
        (ResolutionOutcome::Stale(StaleReason::NotUnknown), Some(_)) => bad(format!(
            "{short} is still in its lease: its claimant may yet complete it. Nothing was changed."
        )),
        (ResolutionOutcome::Stale(_), Some(after)) => bad(format!(
            "{short} moved on since this page showed it (attempt {attempt}): {}. Your finding \
             was kept in its history, and nothing else was changed; look at the entry as it is \
             now before you resolve it.{}",
            out.note,
            if after.entry.possible_double_effect {
                " It is marked as a possible double effect."
            } else {
                ""
            }
        )),
        (ResolutionOutcome::AlreadyResolved, Some(after)) => bad(format!(
            "{short} was already resolved ({}{}); nothing was changed.{}",
            after.entry.status.as_str(),
            if after.entry.resolved_by.is_empty() {
                String::new()
            } else {
                format!(", by {}", after.entry.resolved_by)
            },
            if out.marked_double_effect {
                " Your finding contradicts it: the entry is now marked as a possible double \
                 effect."
            } else {
                ""
            }
        )),
    };
    console.sessions().flash(&who.id, flash);
    Ok(respond::redirect(&back))
}

/// The entries marked as a possible double effect, each with its evidence and the form that
/// acknowledges it; nothing when there is none.
async fn double_effects(console: &Console, who: &Who) -> Result<String, Box<Answer>> {
    let marked = console
        .ledger()
        .double_effects(&who.tenant, PAGE_SIZE)
        .await
        .map_err(|e| failure(&e))?;
    if marked.is_empty() {
        return Ok(String::new());
    }
    let mut html = format!(
        "<h2 class=\"bad\">Possible double effects ({}{})</h2>",
        marked.len(),
        if marked.len() as u32 == PAGE_SIZE {
            "+"
        } else {
            ""
        }
    );
    for view in &marked {
        let e = &view.entry;
        let history = console
            .ledger()
            .history(&who.tenant, &e.key)
            .await
            .map_err(|e| failure(&e))?;
        let _ = write!(
            html,
            "<p class=\"mono\"><a href=\"{href}\">{short}</a> · {tool} · attempt {attempt} \
             · {status}</p>",
            href = entry_href(e.key.as_str()),
            short = esc(&shorten(e.key.as_str(), 17)),
            tool = esc(e.tool.as_str()),
            attempt = e.attempt,
            status = esc(view.status.as_str()),
        );
        html.push_str(&entry::double_effect_card(who, view, &history, "/"));
    }
    Ok(html)
}

async fn acknowledge(console: &Console, call: &Call, who: &Who) -> PageResult {
    let key = call.form.get("key").to_string();
    let back = match call.form.get("back") {
        b if b.starts_with('/') && !b.starts_with("//") => b.to_string(),
        _ => entry_path(&key),
    };
    let bad_request = |text: &str| Box::new(respond::plain(StatusCode::BAD_REQUEST, text));
    let operator = operator_name(call.form.get("operator")).map_err(|p| bad_request(&p))?;
    let principal = if operator.is_empty() {
        format!("console:{}", who.tenant.as_str())
    } else {
        format!("console:{operator}")
    };
    let note = call.form.get("note").trim().to_string();
    if note.is_empty() {
        return Err(bad_request(
            "Say what you found or did: the note is kept in the entry's history. Nothing was \
             changed.",
        ));
    }
    let input = AcknowledgeInput {
        key: key.clone(),
        note,
        principal: principal.clone(),
    };
    let ledger = console.ledger().clone();
    let tenant = who.tenant.clone();
    let out = tokio::spawn(async move { ledger.acknowledge_double_effect(&tenant, input).await })
        .await
        .map_err(|e| failure(&LedgerError::Internal(format!("acknowledgement task: {e}"))))?;
    console.sessions().set_operator(&who.id, &operator);
    let short = shorten(&key, 17);
    let flash = match out {
        Ok(_) => good(format!(
            "Acknowledged the possible double effect of {short}, recorded as by {principal}."
        )),
        Err(LedgerError::NotMarked) => bad(format!(
            "{short} is not marked as a possible double effect (acknowledged already?); \
             nothing was changed."
        )),
        Err(LedgerError::NotFound) => bad(format!(
            "{}; nothing was changed.",
            missing_message(&short, crate::ledger::find::Missing::Key)
        )),
        Err(LedgerError::InvalidArgument { message, .. }) => {
            return Err(bad_request(&format!("{message}. Nothing was changed.")));
        }
        Err(e) => return Err(failure(&e)),
    };
    console.sessions().flash(&who.id, flash);
    Ok(respond::redirect(&back))
}

/// What the next Claim of an entry in `status` gets.
fn next_claim(status: &Status, retryable: bool) -> &'static str {
    match (status, retryable) {
        (Status::Succeeded, _) => "The next claim of it is REPLAYED with this result.",
        (Status::Failed, true) => "The next claim of it is CLAIMED again (a new attempt).",
        (Status::Failed, false) => "The next claim of it is PREVIOUSLY_FAILED.",
        _ => "",
    }
}

// ---- entries -----------------------------------------------------------------------------

/// A time bound of a filter: RFC 3339, or a duration before now (`15m`, `24h`, `7d`).
fn time_bound(field: &'static str, text: &str, now: Micros) -> Result<Option<Micros>, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    if let Ok(t) = prost_types::Timestamp::from_str(text) {
        return Ok(Some(Micros(
            t.seconds
                .saturating_mul(1_000_000)
                .saturating_add(i64::from(t.nanos / 1000)),
        )));
    }
    match crate::defaults::parse_duration(text) {
        Ok(d) => Ok(Some(now.minus(Micros::from_duration(d)))),
        Err(_) => Err(format!(
            "{field}: `{text}` is neither an RFC 3339 time (2026-11-30T06:00:00Z) nor a \
             duration ago (15m, 24h, 7d)"
        )),
    }
}

fn status_of(text: &str) -> Result<Option<Status>, String> {
    match text {
        "" | "any" => Ok(None),
        other => Status::parse(&other.to_ascii_uppercase())
            .map(Some)
            .ok_or_else(|| format!("status: `{other}` is not a state")),
    }
}

fn status_badge(status: Status) -> String {
    format!(
        "<span class=\"badge s-{s}\">{s}</span>",
        s = status.as_str()
    )
}

async fn entries(console: &Console, call: &Call, who: &Who) -> PageResult {
    let q = &call.query;
    let (status, tool, run, since, until) = (
        q.get("status"),
        q.get("tool").trim(),
        q.get("run").trim(),
        q.get("since"),
        q.get("until"),
    );
    let filters = |problem: Option<&str>| {
        let mut form = String::from(
            "<form class=\"filters\" method=\"get\" action=\"/entries\"><label>Status<select \
             name=\"status\">",
        );
        for s in ["any", "unknown", "attempting", "succeeded", "failed"] {
            let selected = if status.eq_ignore_ascii_case(s) || (status.is_empty() && s == "any") {
                " selected"
            } else {
                ""
            };
            let _ = write!(form, "<option value=\"{s}\"{selected}>{s}</option>");
        }
        let _ = write!(
            form,
            "</select></label><label>Tool<input type=\"text\" name=\"tool\" value=\"{}\"></label>\
             <label>Run<input type=\"text\" name=\"run\" value=\"{}\"></label>\
             <label>Started since (RFC 3339 or 24h)<input type=\"text\" name=\"since\" \
             value=\"{}\"></label><label>Started before<input type=\"text\" name=\"until\" \
             value=\"{}\"></label><button type=\"submit\">Filter</button></form>\
             <form class=\"filters\" method=\"get\" action=\"/find\"><label>Find by key, key \
             prefix (6+ characters) or external_ref<input type=\"text\" name=\"q\" size=\"70\">\
             </label><button type=\"submit\">Find</button></form>",
            esc(tool),
            esc(run),
            esc(since),
            esc(until)
        );
        if let Some(problem) = problem {
            let _ = write!(form, "<p class=\"flash bad\">{}</p>", esc(problem));
        }
        form
    };
    let parsed = (|| {
        Ok::<_, String>(ListInput {
            run_id: run.to_string(),
            tool: tool.to_string(),
            status: status_of(status)?,
            started_after: time_bound("since", since, call.now)?,
            started_before: time_bound("until", until, call.now)?,
            page_size: PAGE_SIZE,
            page_token: q.get("page_token").to_string(),
            // The possible double effects have their own section on the first page.
            possible_double_effect: false,
        })
    })();
    let input = match parsed {
        Ok(input) => input,
        Err(problem) => {
            let body = format!("<h1>Entries</h1>{}", filters(Some(&problem)));
            return Ok(respond::html(
                StatusCode::BAD_REQUEST,
                who.page("Entries", Nav::Entries, &body),
            ));
        }
    };
    let out = match console.ledger().list_entries(&who.tenant, input).await {
        Ok(out) => out,
        Err(LedgerError::InvalidArgument { field, message, .. }) => {
            let problem = format!("{field}: {message}");
            let body = format!("<h1>Entries</h1>{}", filters(Some(&problem)));
            return Ok(respond::html(
                StatusCode::BAD_REQUEST,
                who.page("Entries", Nav::Entries, &body),
            ));
        }
        Err(e) => return Err(failure(&e)),
    };
    let mut body = format!(
        "<h1>Entries</h1><p class=\"lead\">The audit trail of this tenant, oldest attempt first, \
         as ListEntries answers it.</p>{}",
        filters(None)
    );
    body.push_str(&entry_table(&out.entries, call.now));
    if !out.next_page_token.is_empty() {
        let _ = write!(
            body,
            "<p class=\"pager\"><a href=\"/entries{}\">Next {PAGE_SIZE} →</a></p>",
            query(&[
                ("status", status),
                ("tool", tool),
                ("run", run),
                ("since", since),
                ("until", until),
                ("page_token", &out.next_page_token)
            ])
        );
    }
    Ok(respond::html(
        StatusCode::OK,
        who.page("Entries", Nav::Entries, &body),
    ))
}

fn entry_table(entries: &[EntryView], now: Micros) -> String {
    if entries.is_empty() {
        return "<div class=\"card\">No entry matches.</div>".to_string();
    }
    let mut table = String::from(
        "<table><thead><tr><th>Started</th><th>Status</th><th>Tool</th><th>Run</th>\
         <th class=\"num\">Attempt</th><th class=\"num\">Replays</th><th>external_ref</th>\
         <th>Key</th><th>Resolved by</th></tr></thead><tbody>",
    );
    for view in entries {
        let e = &view.entry;
        let _ = write!(
            table,
            "<tr><td title=\"{ago} ago\">{started}</td><td>{status}</td><td>{tool}</td>\
             <td>{run}</td><td class=\"num\">{attempt}</td><td class=\"num\">{replays}</td>\
             <td class=\"mono\">{xref}</td><td class=\"mono\"><a href=\"{href}\">{short}</a></td>\
             <td>{by}</td></tr>",
            ago = esc(&span(now.minus(e.started_at))),
            started = esc(&time(e.started_at)),
            status = status_badge(view.status),
            tool = esc(&shorten(e.tool.as_str(), 32)),
            run = esc(&shorten(e.run_id_str(), 32)),
            attempt = e.attempt,
            replays = e.replay_count,
            xref = esc(&view.external_ref),
            href = entry_href(e.key.as_str()),
            short = esc(&shorten(e.key.as_str(), 17)),
            by = esc(e.resolved_by.as_str()),
        );
    }
    table.push_str("</tbody></table>");
    table
}

async fn find(console: &Console, call: &Call, who: &Who) -> PageResult {
    let text = call.query.get("q");
    let answer = |status: StatusCode, message: &str, listed: &str| {
        let body = format!(
            "<h1>Find</h1><form class=\"filters\" method=\"get\" action=\"/find\"><label>Key, \
             key prefix (6+ characters) or external_ref<input type=\"text\" name=\"q\" \
             size=\"70\" value=\"{}\"></label><button type=\"submit\">Find</button></form>\
             <p class=\"flash bad\">{}</p>{listed}",
            esc(text),
            esc(message)
        );
        respond::html(status, who.page("Find", Nav::Entries, &body))
    };
    let query = match KeyQuery::parse(text) {
        Ok(query) => query,
        Err(problem) => return Ok(answer(StatusCode::BAD_REQUEST, &problem, "")),
    };
    let verdict = console
        .ledger()
        .find(&who.tenant, &query, SEARCH_LIMIT)
        .await
        .map_err(|e| failure(&e))?;
    Ok(match verdict {
        Verdict::One(view) => respond::redirect(&entry_path(view.entry.key.as_str())),
        Verdict::Missing(why) => answer(
            StatusCode::NOT_FOUND,
            &missing_message(query.text(), why),
            "",
        ),
        Verdict::Cut { read, found } => answer(
            StatusCode::OK,
            &format!(
                "The search stopped after the oldest {read} entries{}: another may match further \
                 on. Give the whole key.",
                found.map_or(String::new(), |k| format!(" with one match, {k}"))
            ),
            "",
        ),
        Verdict::Ambiguous {
            keys,
            count,
            searched,
        } => {
            let mut listed = String::from("<ul class=\"mono\">");
            for key in &keys {
                let _ = write!(
                    listed,
                    "<li><a href=\"{}\">{}</a></li>",
                    entry_href(key),
                    esc(key)
                );
            }
            listed.push_str("</ul>");
            let more = if searched.is_some() { "at least " } else { "" };
            answer(
                StatusCode::OK,
                &format!(
                    "{more}{count} entries match `{}`: give more characters.",
                    query.text()
                ),
                &listed,
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_bounds_are_rfc_3339_or_a_duration_ago() {
        let now = Micros(10_000_000_000);
        assert_eq!(time_bound("since", "", now), Ok(None));
        assert_eq!(
            time_bound("since", "1970-01-01T00:00:01Z", now),
            Ok(Some(Micros(1_000_000)))
        );
        assert_eq!(
            time_bound("since", "15m", now),
            Ok(Some(Micros(10_000_000_000 - 900_000_000)))
        );
        let e = time_bound("until", "yesterday", now).expect_err("refused");
        assert!(e.starts_with("until: `yesterday`"), "{e}");
    }

    #[test]
    fn statuses_are_named_in_any_case() {
        assert_eq!(status_of(""), Ok(None));
        assert_eq!(status_of("any"), Ok(None));
        assert_eq!(status_of("unknown"), Ok(Some(Status::Unknown)));
        assert_eq!(status_of("SUCCEEDED"), Ok(Some(Status::Succeeded)));
        assert!(status_of("done").is_err());
    }

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
    #[test]
    fn every_reason_is_answered_with_the_tables_status() {
        let mut answered = 0;
        for reason in crate::reason::Reason::all() {
            let Some(error) = crate::error::sample(reason) else {
                continue;
            };
            answered += 1;
            let page = failure(&error);
            let face = reason.face();
            assert_eq!(page.status().as_u16(), face.http, "{reason}");
            let message = error.to_string();
            assert!(
                page.body().contains(&esc(&message).to_string()),
                "{reason}: {}",
                page.body()
            );
            assert!(
                !page.body().contains("/var/lib") && !page.body().contains("block 7"),
                "{reason}: {}",
                page.body()
            );
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
        }
        // The transport's reasons (a credential, a role, a limit, a deadline, the codec) are
        // the seven the console never meets as a use case's error.
        assert_eq!(answered, crate::reason::Reason::all().count() - 7);
    }
}
