//! The operator's console over real HTTP, against a real server on either store: what needs a
//! person, resolving through the form (and the next Claim over gRPC), CSRF refusals, tenants,
//! escaping, headers, host names; and the `ReplayRate` RPC's figures after a scripted mix of
//! claims, replays and key-reuse refusals.

use std::net::SocketAddr;
use std::time::Duration;

use idempotency_ledger::console::Listen;
use idempotency_ledger::grpc::pb;
use idempotency_ledger::server::{self, Settings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tonic::{Code, Request};

use crate::grpc_api::{key_req, tokens_file};
use crate::support::{
    Backend, ManualClock, ServerProcess, TestApp, TestDb, claim_req, free_port, reason,
    spawn_app_with, success, test_settings,
};

on_every_backend!(
    the_landing_page_lists_unresolved_entries_oldest_first,
    resolving_through_the_form_records_resolved_by_and_the_next_claim_answers_accordingly,
    another_tenants_entries_are_not_found_in_the_console,
    entries_are_listed_by_filter_and_found_by_prefix_or_external_ref,
    a_resolve_form_rendered_before_the_entry_moved_on_changes_nothing,
    a_possible_double_effect_is_shown_first_with_its_evidence_until_acknowledged,
    an_approver_approves_and_denies_through_the_console_and_the_agent_hears_of_it,
    a_member_without_the_approver_role_sees_requests_but_cannot_decide,
    a_lapsed_request_leaves_the_approvals_page_and_reads_lapsed_before_anything_records_it,
);

// ---- a small HTTP/1.1 client -------------------------------------------------------------

/// What the console answered.
#[derive(Debug)]
struct Page {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Page {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The fields the form posting to `action` for `key` carries (its hidden inputs: what the
    /// page showed, as a browser sends them back).
    fn hidden_fields(&self, action: &str, key: &str) -> Vec<(String, String)> {
        let opening = format!("action=\"{action}\">");
        let form = self
            .body
            .split("<form ")
            .map(|f| f.split("</form>").next().unwrap_or(""))
            .find(|f| f.contains(&opening) && f.contains(&format!("name=\"key\" value=\"{key}\"")))
            .unwrap_or_else(|| panic!("no {action} form for {key} in:\n{}", self.body));
        form.split("<input type=\"hidden\" ")
            .skip(1)
            .map(|input| {
                let attr = |name: &str| {
                    let at = input
                        .find(&format!("{name}=\""))
                        .unwrap_or_else(|| panic!("no {name} in {input}"));
                    let rest = &input[at + name.len() + 2..];
                    rest[..rest.find('"').expect("quote")].to_string()
                };
                (attr("name"), attr("value"))
            })
            .collect()
    }

    /// The first CSRF token of the page's forms.
    fn csrf(&self) -> String {
        let at = self
            .body
            .find("name=\"csrf\" value=\"")
            .unwrap_or_else(|| panic!("no CSRF token in:\n{}", self.body));
        let rest = &self.body[at + "name=\"csrf\" value=\"".len()..];
        rest[..rest.find('"').expect("quote")].to_string()
    }
}

/// A browser of one console: it keeps the session cookie.
struct Browser {
    addr: SocketAddr,
    host: String,
    cookie: Option<String>,
}

impl Browser {
    fn new(addr: SocketAddr) -> Browser {
        Browser {
            addr,
            host: addr.to_string(),
            cookie: None,
        }
    }

    async fn get(&mut self, path: &str) -> Page {
        self.send("GET", path, &[], None).await
    }

    async fn post(&mut self, path: &str, fields: &[(&str, &str)]) -> Page {
        self.send("POST", path, fields, None).await
    }

    async fn send(
        &mut self,
        method: &str,
        path: &str,
        fields: &[(&str, &str)],
        origin: Option<&str>,
    ) -> Page {
        let body = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(fields)
            .finish();
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n",
            self.host
        );
        if let Some(cookie) = &self.cookie {
            request.push_str(&format!("Cookie: {cookie}\r\n"));
        }
        if let Some(origin) = origin {
            request.push_str(&format!("Origin: {origin}\r\n"));
        }
        if method == "POST" {
            request.push_str(&format!(
                "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        request.push_str("\r\n");
        request.push_str(&body);
        let mut socket = TcpStream::connect(self.addr).await.expect("connect");
        socket.write_all(request.as_bytes()).await.expect("write");
        let mut raw = Vec::new();
        tokio::time::timeout(Duration::from_secs(30), socket.read_to_end(&mut raw))
            .await
            .expect("the console answers and closes")
            .expect("read");
        let text = String::from_utf8(raw).expect("UTF-8 answer");
        let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
        let mut lines = head.lines();
        let status = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .expect("a status line");
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
            .collect();
        for (_, cookie) in headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("set-cookie"))
        {
            let pair = cookie.split(';').next().unwrap_or("").trim();
            if cookie.contains("Max-Age=0") {
                self.cookie = None;
            } else {
                self.cookie = Some(pair.to_string());
            }
        }
        Page {
            status,
            headers,
            body: body.to_string(),
        }
    }
}

// ---- servers with a console --------------------------------------------------------------

/// A free loopback address for a console.
fn console_addr() -> SocketAddr {
    format!("127.0.0.1:{}", free_port()).parse().expect("addr")
}

/// A server with a console, after `configure`; its console's address.
async fn console_app(
    backend: Backend,
    configure: impl FnOnce(&mut Settings),
) -> (TestApp, SocketAddr) {
    let addr = console_addr();
    let app = spawn_app_with(backend, |s| {
        s.console_listen = Some(Listen::At(addr));
        configure(s);
    })
    .await;
    (app, addr)
}

/// A server with tenants acme (`token-acme`) and globex (`token-globex`) and a console.
async fn tenants_console(backend: Backend) -> (TestApp, SocketAddr, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = tokens_file(&dir);
    let (app, addr) = console_app(backend, |s| s.auth_tokens_file = Some(path)).await;
    (app, addr, dir)
}

/// `message` with the bearer credential `token`, or none.
fn as_tenant<T>(message: T, token: Option<&str>) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(token) = token {
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("header"),
        );
    }
    request
}

/// Claims (run, tool, args) and reports its outcome unknown; the entry.
async fn unknown(
    app: &TestApp,
    token: Option<&str>,
    run: &str,
    tool: &str,
    args: &str,
) -> pb::Entry {
    let mut client = app.client.clone();
    let claimed = client
        .claim(as_tenant(claim_req(run, tool, args), token))
        .await
        .expect("claim")
        .into_inner();
    assert_eq!(claimed.outcome(), pb::Outcome::Claimed);
    let entry = claimed.entry.expect("entry");
    client
        .complete(as_tenant(
            pb::CompleteRequest {
                key: entry.key.clone(),
                claim_token: claimed.claim_token,
                status: pb::Status::Unknown.into(),
                error: "timed out".into(),
                ..Default::default()
            },
            token,
        ))
        .await
        .expect("complete unknown");
    entry
}

async fn lookup(app: &TestApp, token: Option<&str>, key: &str) -> Result<pb::Entry, tonic::Status> {
    app.client
        .clone()
        .lookup(as_tenant(key_req(key), token))
        .await
        .map(|r| r.into_inner().entry.expect("entry"))
}

/// Signs `browser` in with `token`.
async fn sign_in(browser: &mut Browser, token: &str, operator: &str) {
    let form = browser.get("/signin").await;
    assert_eq!(form.status, 200, "{}", form.body);
    let csrf = form.csrf();
    let signed = browser
        .post(
            "/signin",
            &[("csrf", &csrf), ("token", token), ("operator", operator)],
        )
        .await;
    assert_eq!(signed.status, 303, "{}", signed.body);
    assert_eq!(signed.header("location"), Some("/"));
}

// ---- what needs a person -----------------------------------------------------------------

async fn the_landing_page_lists_unresolved_entries_oldest_first(backend: Backend) {
    let (app, addr) = console_app(backend, |_| {}).await;
    let mut client = app.client.clone();
    // Oldest: reported unknown by its claimant.
    let reported = unknown(&app, None, "run-1", "issue_credit", r#"{"n":1}"#).await;
    app.clock.advance(Duration::from_secs(5));
    // Then an attempt whose lease (the default, 60 s) will end without a Complete.
    let lapsed = client
        .claim(claim_req("run-2", "open_ticket", r#"{"n":2}"#))
        .await
        .expect("claim")
        .into_inner()
        .entry
        .expect("entry");
    app.clock.advance(Duration::from_secs(5));
    // Neither a success nor an attempt in its lease needs a person.
    let claimed = client
        .claim(claim_req("run-3", "send_reply", r#"{"n":3}"#))
        .await
        .expect("claim")
        .into_inner();
    let done = claimed.entry.expect("entry");
    client
        .complete(success(&done.key, &claimed.claim_token, b"ok"))
        .await
        .expect("complete");
    app.clock.advance(Duration::from_secs(55));
    let in_lease = client
        .claim(claim_req("run-4", "send_reply", r#"{"n":4}"#))
        .await
        .expect("claim")
        .into_inner()
        .entry
        .expect("entry");
    app.clock.advance(Duration::from_secs(10));

    let page = Browser::new(addr).get("/").await;
    assert_eq!(page.status, 200, "{}", page.body);
    let body = &page.body;
    let first = body
        .find(&reported.external_ref)
        .unwrap_or_else(|| panic!("the reported unknown is listed:\n{body}"));
    let second = body
        .find(&lapsed.external_ref)
        .unwrap_or_else(|| panic!("the lapsed lease is listed:\n{body}"));
    assert!(first < second, "oldest first:\n{body}");
    for absent in [&done.external_ref, &in_lease.external_ref] {
        assert!(
            !body.contains(absent.as_str()),
            "{absent} is listed:\n{body}"
        );
    }
    // Each with its tool, run, attempt, age and a form to resolve it.
    for text in [
        "<td>issue_credit</td>",
        "<td>open_ticket</td>",
        "<td>run-1</td>",
        "<td>run-2</td>",
        "<td class=\"num\">1</td>",
        "<td title=\"started",
        ">1m 15s</td>",
        ">1m 10s</td>",
        "reported unknown: timed out",
        "lease ended 10s ago",
    ] {
        assert!(body.contains(text), "no {text:?} in:\n{body}");
    }
    assert_eq!(body.matches("action=\"/resolve\"").count(), 2, "{body}");
}

async fn resolving_through_the_form_records_resolved_by_and_the_next_claim_answers_accordingly(
    backend: Backend,
) {
    let (app, addr) = console_app(backend, |_| {}).await;
    let mut client = app.client.clone();
    let found = unknown(&app, None, "run-1", "issue_credit", r#"{"n":1}"#).await;
    let not_found = unknown(&app, None, "run-1", "issue_credit", r#"{"n":2}"#).await;
    let failed = unknown(&app, None, "run-1", "issue_credit", r#"{"n":3}"#).await;
    let mut browser = Browser::new(addr);
    let landing = browser.get("/").await;
    let csrf = landing.csrf();
    let result = r#"{"credit_id":"cr-7","amount":200}"#;
    for (entry, fields) in [
        (
            &found,
            vec![
                ("outcome", "found"),
                ("result", result),
                ("operator", "ada"),
            ],
        ),
        (&not_found, vec![("outcome", "not_found"), ("operator", "")]),
        (
            &failed,
            vec![
                ("outcome", "failed"),
                ("error", "the bank refused it"),
                ("operator", "bob"),
            ],
        ),
    ] {
        let mut form = vec![
            ("csrf", csrf.as_str()),
            ("key", entry.key.as_str()),
            ("attempt", "1"),
            ("hold", ""),
            ("back", "/"),
        ];
        form.extend(fields);
        let answer = browser.post("/resolve", &form).await;
        assert_eq!(answer.status, 303, "{}", answer.body);
        assert_eq!(answer.header("location"), Some("/"));
    }
    let landing = browser.get("/").await;
    assert!(
        landing.body.contains("Nothing needs a person."),
        "{}",
        landing.body
    );
    assert!(
        landing.body.contains("recorded as resolved by console:bob"),
        "the last resolution's message: {}",
        landing.body
    );

    let entry = lookup(&app, None, &found.key).await.expect("lookup");
    assert_eq!(entry.status(), pb::Status::Succeeded);
    assert_eq!(entry.resolved_by, "console:ada");
    assert_eq!(entry.result.as_ref(), result.as_bytes());
    let again = client
        .claim(claim_req("run-1", "issue_credit", r#"{"n":1}"#))
        .await
        .expect("claim")
        .into_inner();
    assert_eq!(again.outcome(), pb::Outcome::Replayed);
    assert_eq!(
        again.entry.expect("entry").result.as_ref(),
        result.as_bytes()
    );

    // Not found, retryable: without a name, the tenant stands for the operator.
    let entry = lookup(&app, None, &not_found.key).await.expect("lookup");
    assert_eq!(
        (entry.status(), entry.retryable, entry.resolved_by.as_str()),
        (pb::Status::Failed, true, "console:default")
    );
    let retried = client
        .claim(claim_req("run-1", "issue_credit", r#"{"n":2}"#))
        .await
        .expect("claim")
        .into_inner();
    assert_eq!(retried.outcome(), pb::Outcome::Claimed);
    assert_eq!(retried.entry.expect("entry").attempt, 2);

    let entry = lookup(&app, None, &failed.key).await.expect("lookup");
    assert_eq!(
        (
            entry.status(),
            entry.retryable,
            entry.error.as_str(),
            entry.resolved_by.as_str()
        ),
        (
            pb::Status::Failed,
            false,
            "the bank refused it",
            "console:bob"
        )
    );
    let refused = client
        .claim(claim_req("run-1", "issue_credit", r#"{"n":3}"#))
        .await
        .expect("claim")
        .into_inner();
    assert_eq!(refused.outcome(), pb::Outcome::PreviouslyFailed);

    // The entry's page shows who resolved it, the result as JSON, and its timeline. (A replay's
    // count may reach the store up to a second later: the server writes counts in batches.)
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let page = loop {
        let page = browser.get(&format!("/entry?key={}", found.key)).await;
        if page.body.contains("replayed 1 time since") || tokio::time::Instant::now() > deadline {
            break page;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(page.status, 200, "{}", page.body);
    for text in [
        "<dt>resolved_by</dt><dd class=\"mono\">console:ada</dd>",
        "JSON, indented for reading",
        "\n  &quot;credit_id&quot;: &quot;cr-7&quot;,\n  &quot;amount&quot;: 200\n}",
        "SUCCEEDED by console:ada",
        "replayed 1 time since",
    ] {
        assert!(page.body.contains(text), "no {text:?} in:\n{}", page.body);
    }
    // A second resolution changes nothing and says so.
    let answer = browser
        .post(
            "/resolve",
            &[
                ("csrf", &csrf),
                ("key", &found.key),
                ("attempt", "1"),
                ("hold", ""),
                ("outcome", "failed"),
                ("back", "/"),
            ],
        )
        .await;
    assert_eq!(answer.status, 303, "{}", answer.body);
    let landing = browser.get("/").await;
    assert!(
        landing
            .body
            .contains("was already resolved (SUCCEEDED, by console:ada); nothing was changed."),
        "{}",
        landing.body
    );
    assert_eq!(
        lookup(&app, None, &found.key)
            .await
            .expect("lookup")
            .status(),
        pb::Status::Succeeded
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_form_without_its_sessions_csrf_token_is_refused_and_changes_nothing() {
    let (app, addr) = console_app(Backend::Sqlite, |_| {}).await;
    let entry = unknown(&app, None, "run-1", "issue_credit", "{}").await;
    let mut browser = Browser::new(addr);
    let csrf = browser.get("/").await.csrf();
    let mut other = Browser::new(addr);
    let others_csrf = other.get("/").await.csrf();
    assert_ne!(csrf, others_csrf);
    for (what, token) in [
        ("no token", None),
        ("a wrong token", Some("00")),
        ("another session's token", Some(others_csrf.as_str())),
    ] {
        let mut form = vec![
            ("key", entry.key.as_str()),
            ("attempt", "1"),
            ("hold", ""),
            ("outcome", "found"),
            ("result", "{}"),
        ];
        form.extend(token.map(|t| ("csrf", t)));
        let answer = browser.post("/resolve", &form).await;
        assert_eq!(answer.status, 403, "{what}: {}", answer.body);
        assert!(
            answer.body.contains("nothing was changed"),
            "{what}: {}",
            answer.body
        );
    }
    // The right token from another site's page (its Origin) is refused too.
    let foreign = browser
        .send(
            "POST",
            "/resolve",
            &[
                ("csrf", &csrf),
                ("key", &entry.key),
                ("attempt", "1"),
                ("hold", ""),
                ("outcome", "found"),
            ],
            Some("http://evil.example"),
        )
        .await;
    assert_eq!(foreign.status, 403, "{}", foreign.body);
    // Without a session cookie at all.
    let mut stranger = Browser::new(addr);
    let answer = stranger
        .post(
            "/resolve",
            &[
                ("csrf", &csrf),
                ("key", &entry.key),
                ("attempt", "1"),
                ("hold", ""),
                ("outcome", "found"),
            ],
        )
        .await;
    assert_eq!(answer.status, 403, "{}", answer.body);
    let now = lookup(&app, None, &entry.key).await.expect("lookup");
    assert_eq!(now.status(), pb::Status::Unknown);
    assert_eq!(now.resolved_by, "");
    // The same form with its token goes through.
    let answer = browser
        .post(
            "/resolve",
            &[
                ("csrf", &csrf),
                ("key", &entry.key),
                ("attempt", "1"),
                ("hold", ""),
                ("outcome", "found"),
            ],
        )
        .await;
    assert_eq!(answer.status, 303, "{}", answer.body);
    assert_eq!(
        lookup(&app, None, &entry.key)
            .await
            .expect("lookup")
            .status(),
        pb::Status::Succeeded
    );
}

// ---- tenants -----------------------------------------------------------------------------

async fn another_tenants_entries_are_not_found_in_the_console(backend: Backend) {
    let (app, addr, _dir) = tenants_console(backend).await;
    let acmes = unknown(
        &app,
        Some("token-acme"),
        "run-1",
        "issue_credit",
        r#"{"n":1}"#,
    )
    .await;
    let mut globex = Browser::new(addr);
    sign_in(&mut globex, "token-globex", "").await;
    let landing = globex.get("/").await;
    assert_eq!(landing.status, 200, "{}", landing.body);
    assert!(
        landing.body.contains("tenant <b>globex</b>"),
        "{}",
        landing.body
    );
    assert!(
        landing.body.contains("Nothing needs a person."),
        "{}",
        landing.body
    );
    assert!(
        !landing.body.contains(&acmes.external_ref),
        "{}",
        landing.body
    );
    let listing = globex.get("/entries").await;
    assert!(
        listing.body.contains("No entry matches."),
        "{}",
        listing.body
    );

    // Acme's key reads exactly as a key that exists nowhere.
    let missing_key = "f".repeat(64);
    let theirs = globex.get(&format!("/entry?key={}", acmes.key)).await;
    let nobodys = globex.get(&format!("/entry?key={missing_key}")).await;
    assert_eq!((theirs.status, nobodys.status), (404, 404));
    assert_eq!(
        theirs
            .body
            .replace(&acmes.key, "KEY")
            .replace(&acmes.key[..16], "SHORT"),
        nobodys
            .body
            .replace(&missing_key, "KEY")
            .replace(&missing_key[..16], "SHORT")
    );
    for q in [acmes.external_ref.as_str(), &acmes.key[..12]] {
        let found = globex.get(&format!("/find?q={q}")).await;
        assert_eq!(found.status, 404, "{q}: {}", found.body);
    }
    let figures = globex.get("/replay-rate").await;
    assert!(!figures.body.contains("issue_credit"), "{}", figures.body);

    // Nor can globex resolve it.
    let csrf = landing.csrf();
    let answer = globex
        .post(
            "/resolve",
            &[
                ("csrf", &csrf),
                ("key", &acmes.key),
                ("attempt", "1"),
                ("hold", ""),
                ("outcome", "found"),
            ],
        )
        .await;
    assert_eq!(answer.status, 404, "{}", answer.body);
    let still = lookup(&app, Some("token-acme"), &acmes.key)
        .await
        .expect("lookup");
    assert_eq!(still.status(), pb::Status::Unknown);

    // Acme sees it, and its figures.
    let mut acme = Browser::new(addr);
    sign_in(&mut acme, "token-acme", "ada").await;
    let landing = acme.get("/").await;
    assert!(
        landing.body.contains(&acmes.external_ref),
        "{}",
        landing.body
    );
    assert!(acme.get("/replay-rate").await.body.contains("issue_credit"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_console_session_ends_once_sighup_removes_its_token_and_the_others_go_on() {
    use crate::rotation::{replace, signal, wait_for_log};
    let dir = tempfile::tempdir().expect("temp dir");
    let tokens = tokens_file(&dir);
    let db = TestDb::new(Backend::Sqlite);
    let port = free_port();
    let console = format!("127.0.0.1:{port}");
    let server = ServerProcess::start(
        &db.url,
        &[
            "--auth-tokens-file",
            tokens.to_str().expect("utf-8"),
            "--console-listen",
            &console,
        ],
    )
    .await;
    let addr: SocketAddr = console.parse().expect("addr");
    let (mut acme, mut globex) = (Browser::new(addr), Browser::new(addr));
    sign_in(&mut acme, "token-acme", "ada").await;
    sign_in(&mut globex, "token-globex", "grace").await;
    assert_eq!(acme.get("/").await.status, 200);

    replace(&tokens, b"globex token-globex\nacme token-acme-2\n");
    signal(&server, "HUP");
    wait_for_log(&server, "reload: the tokens file is in force", 1).await;
    let ended = acme.get("/").await;
    assert_eq!(ended.status, 303, "{}", ended.body);
    assert_eq!(ended.header("location"), Some("/signin"));
    assert_eq!(globex.get("/").await.status, 200, "globex's token stays");
    let mut again = Browser::new(addr);
    sign_in(&mut again, "token-acme-2", "ada").await;
    assert_eq!(again.get("/").await.status, 200, "the new token signs in");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tokens_the_console_asks_to_sign_in_and_keeps_its_session_in_a_strict_cookie() {
    let (_app, addr, _dir) = tenants_console(Backend::Sqlite).await;
    let mut browser = Browser::new(addr);
    for path in ["/", "/entries", "/entry?key=x", "/replay-rate"] {
        let page = browser.get(path).await;
        assert_eq!(page.status, 303, "{path}");
        assert_eq!(page.header("location"), Some("/signin"), "{path}");
    }
    let form = browser.get("/signin").await;
    assert_eq!(form.status, 200);
    let cookie = form
        .header("set-cookie")
        .expect("a session for the form")
        .to_string();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(cookie.contains(attribute), "{cookie}");
    }
    assert!(
        cookie.starts_with(&format!("ledger_console_{}=", addr.port())),
        "{cookie}"
    );
    let before = browser.cookie.clone();
    let refused = browser
        .post(
            "/signin",
            &[("csrf", &form.csrf()), ("token", "token-nobody")],
        )
        .await;
    assert_eq!(refused.status, 401, "{}", refused.body);
    assert!(
        refused.body.contains("This server knows no such token."),
        "{}",
        refused.body
    );
    assert!(!refused.body.contains("tenant <b>"), "{}", refused.body);
    sign_in(&mut browser, "token-acme", "ada").await;
    assert_ne!(browser.cookie, before, "a new session id once signed in");
    let landing = browser.get("/").await;
    assert_eq!(landing.status, 200, "{}", landing.body);
    assert!(
        landing.body.contains("tenant <b>acme</b>"),
        "{}",
        landing.body
    );
    // The id from before sign-in opens nothing.
    let mut old = Browser::new(addr);
    old.cookie = before;
    assert_eq!(old.get("/").await.status, 303);
    // Signing out ends the session for good.
    let signed_in = browser.cookie.clone();
    let out = browser.post("/signout", &[("csrf", &landing.csrf())]).await;
    assert_eq!(out.status, 303, "{}", out.body);
    assert!(
        out.header("set-cookie")
            .is_some_and(|c| c.contains("Max-Age=0"))
    );
    let mut replay = Browser::new(addr);
    replay.cookie = signed_in;
    assert_eq!(replay.get("/").await.status, 303);
}

// ---- escaping, headers, host names ------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_values_reach_every_page_escaped() {
    let (app, addr) = console_app(Backend::Sqlite, |_| {}).await;
    let mut client = app.client.clone();
    let hostile = r#"{"note":"<script>alert('args')</script>","q":"\"'&"}"#;
    let claimed = client
        .claim(pb::ClaimRequest {
            principal: "<u>principal</u>".into(),
            ..claim_req("<i>run</i>", "<b>tool</b>", hostile)
        })
        .await
        .expect("claim")
        .into_inner();
    let entry = claimed.entry.expect("entry");
    client
        .complete(pb::CompleteRequest {
            key: entry.key.clone(),
            claim_token: claimed.claim_token,
            status: pb::Status::Unknown.into(),
            error: "<img src=x onerror=alert('error')>".into(),
            ..Default::default()
        })
        .await
        .expect("complete");
    let mut browser = Browser::new(addr);
    let landing = browser.get("/").await;
    let csrf = landing.csrf();
    let resolved = browser
        .post(
            "/resolve",
            &[
                ("csrf", &csrf),
                ("key", &entry.key),
                ("attempt", "1"),
                ("hold", ""),
                ("outcome", "found"),
                ("result", "</pre><script>alert('result')</script>"),
                ("operator", "<svg onload=alert('operator')>"),
            ],
        )
        .await;
    assert_eq!(resolved.status, 303, "{}", resolved.body);
    let pages = [
        landing,
        browser.get("/").await,
        browser.get(&format!("/entry?key={}", entry.key)).await,
        browser.get("/entries").await,
        browser.get("/replay-rate").await,
        browser.get("/find?q=<script>alert('find')</script>").await,
    ];
    for page in &pages {
        for raw in [
            "<script>alert",
            "<img src",
            "<b>tool",
            "<i>run",
            "<u>principal",
            "<svg onload",
            "</pre><script>",
        ] {
            assert!(
                !page.body.contains(raw),
                "{raw:?} unescaped in:\n{}",
                page.body
            );
        }
    }
    let entry_page = &pages[2].body;
    // maud escapes `& < > "` and quotes every attribute with `"`: an apostrophe stays as is.
    for escaped in [
        "&lt;script&gt;alert('args')&lt;/script&gt;",
        "&lt;b&gt;tool&lt;/b&gt;",
        "&lt;i&gt;run&lt;/i&gt;",
        "&lt;u&gt;principal&lt;/u&gt;",
        "&lt;/pre&gt;&lt;script&gt;alert('result')&lt;/script&gt;",
        "console:&lt;svg onload=alert('operator')&gt;",
    ] {
        assert!(
            entry_page.contains(escaped),
            "no {escaped:?} in:\n{entry_page}"
        );
    }
    // The claimant's error, shown before the resolution replaced it.
    assert!(
        pages[0]
            .body
            .contains("reported unknown: &lt;img src=x onerror=alert('error')&gt;"),
        "{}",
        pages[0].body
    );
    assert!(
        pages[4].body.contains("&lt;b&gt;tool&lt;/b&gt;"),
        "the tool is named, escaped, on the replay page:\n{}",
        pages[4].body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_carries_the_security_headers() {
    let (app, addr) = console_app(Backend::Sqlite, |_| {}).await;
    let entry = unknown(&app, None, "run-1", "issue_credit", "{}").await;
    let mut browser = Browser::new(addr);
    for path in [
        "/".to_string(),
        "/entries".to_string(),
        format!("/entry?key={}", entry.key),
        "/replay-rate".to_string(),
        "/nowhere".to_string(),
        "/find?q=".to_string(),
    ] {
        let page = browser.get(&path).await;
        let csp = page.header("content-security-policy").unwrap_or_default();
        assert!(
            csp.starts_with("default-src 'none'; style-src 'sha256-"),
            "{path}: {csp}"
        );
        assert!(csp.contains("frame-ancestors 'none'"), "{path}: {csp}");
        assert!(
            !csp.contains("unsafe-inline") && !csp.contains("script-src"),
            "{csp}"
        );
        assert_eq!(page.header("x-frame-options"), Some("DENY"), "{path}");
        assert_eq!(page.header("cache-control"), Some("no-store"), "{path}");
        assert_eq!(
            page.header("x-content-type-options"),
            Some("nosniff"),
            "{path}"
        );
        assert_eq!(
            page.header("referrer-policy"),
            Some("same-origin"),
            "{path}"
        );
        assert!(!page.body.contains("<script"), "{path}: no script at all");
    }
    assert_eq!(browser.get("/nowhere").await.status, 404);
    assert_eq!(browser.send("PUT", "/", &[], None).await.status, 405);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_for_a_host_name_the_console_was_not_given_is_refused() {
    let (_app, addr) = console_app(Backend::Sqlite, |s| {
        s.console_hosts = vec!["ledger.internal".into()];
    })
    .await;
    for (host, status) in [
        (format!("evil.example:{}", addr.port()), 421),
        ("evil.example".to_string(), 421),
        (format!("localhost:{}", addr.port()), 200),
        (addr.to_string(), 200),
        (format!("LEDGER.internal:{}", addr.port()), 200),
        ("[::1]:8080".to_string(), 200),
    ] {
        let mut browser = Browser::new(addr);
        browser.host = host.clone();
        let page = browser.get("/").await;
        assert_eq!(page.status, status, "{host}: {}", page.body);
        if status == 421 {
            assert!(page.header("set-cookie").is_none(), "{host}: no session");
        }
    }
}

// ---- entries -----------------------------------------------------------------------------

async fn entries_are_listed_by_filter_and_found_by_prefix_or_external_ref(backend: Backend) {
    let (app, addr) = console_app(backend, |_| {}).await;
    let mut client = app.client.clone();
    let credit = unknown(&app, None, "run-a", "issue_credit", r#"{"n":1}"#).await;
    app.clock.advance(Duration::from_secs(60));
    let claimed = client
        .claim(pb::ClaimRequest {
            key: "wf-42:step-3".into(),
            ..claim_req("run-b", "open_ticket", r#"{"n":2}"#)
        })
        .await
        .expect("claim")
        .into_inner();
    let ticket = claimed.entry.expect("entry");
    client
        .complete(success(&ticket.key, &claimed.claim_token, b"T-1"))
        .await
        .expect("complete");
    let mut browser = Browser::new(addr);
    let has = |page: &Page, entry: &pb::Entry| page.body.contains(&entry.external_ref);
    let all = browser.get("/entries").await;
    assert!(has(&all, &credit) && has(&all, &ticket), "{}", all.body);
    assert!(
        all.body.find(&credit.external_ref) < all.body.find(&ticket.external_ref),
        "oldest first"
    );
    for (query, credit_in, ticket_in) in [
        ("status=unknown", true, false),
        ("status=SUCCEEDED", false, true),
        ("tool=open_ticket", false, true),
        ("run=run-a", true, false),
        ("since=30s", false, true),
        ("until=30s", true, false),
    ] {
        let page = browser.get(&format!("/entries?{query}")).await;
        assert_eq!(page.status, 200, "{query}: {}", page.body);
        assert_eq!(
            (has(&page, &credit), has(&page, &ticket)),
            (credit_in, ticket_in),
            "{query}"
        );
    }
    let bad = browser.get("/entries?since=yesterday").await;
    assert_eq!(bad.status, 400);
    assert!(
        bad.body.contains("since: `yesterday` is neither"),
        "{}",
        bad.body
    );
    // A malformed run or tool filter is refused as `field: message`, before the ledger is read.
    for (query, refusal) in [
        (
            format!("run={}", "r".repeat(257)),
            "run_id: must be at most 256 bytes, got 257",
        ),
        (
            format!("tool={}", "t".repeat(257)),
            "tool: must be at most 256 bytes, got 257",
        ),
    ] {
        let refused = browser.get(&format!("/entries?{query}")).await;
        assert_eq!(refused.status, 400, "{query}: {}", refused.body);
        assert!(refused.body.contains(refusal), "{}", refused.body);
    }

    // Found by whole key, prefix (with or without the table's …), or external_ref.
    let credit_page = format!("/entry?key={}", credit.key);
    let ticket_page = "/entry?key=wf-42%3Astep-3".to_string();
    for (q, location) in [
        (credit.key.clone(), &credit_page),
        (credit.key[..10].to_string(), &credit_page),
        (format!("{}…", &credit.key[..10]), &credit_page),
        (credit.external_ref.clone(), &credit_page),
        ("wf-42:".to_string(), &ticket_page),
        (ticket.external_ref.clone(), &ticket_page),
    ] {
        let encoded: String = form_urlencoded::byte_serialize(q.as_bytes()).collect();
        let page = browser.get(&format!("/find?q={encoded}")).await;
        assert_eq!(page.status, 303, "{q}: {}", page.body);
        assert_eq!(page.header("location"), Some(location.as_str()), "{q}");
    }
    let page = browser.get(&ticket_page).await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body
            .contains("<dt>key</dt><dd class=\"mono\">wf-42:step-3</dd>")
    );
    assert!(
        page.body
            .contains("<p class=\"muted\">text</p><pre>T-1</pre>"),
        "{}",
        page.body
    );
    let missing = browser.get("/find?q=zzzzzzzz").await;
    assert_eq!(missing.status, 404);
    assert!(
        missing.body.contains("nor one whose key starts with it"),
        "{}",
        missing.body
    );
}

// ---- the replay rate ---------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replay_rate_rpc_counts_a_scripted_mix_per_tool_and_minute() {
    let (app, addr) = console_app(Backend::Sqlite, |s| {
        s.metrics_max_tools = 2;
        s.replay_alarm_window = Duration::from_secs(300);
        s.replay_alarm_min_claims = 3;
    })
    .await;
    let mut client = app.client.clone();
    let mut claim = async |req: pb::ClaimRequest| client.claim(req).await;
    // Minute one: credit is claimed, completed and replayed twice; ticket is claimed three
    // times with new arguments each (its alarm turns on at the third); an explicit key is
    // reused with other arguments for credit (a refusal).
    let first = claim(claim_req("run-1", "credit", "{}"))
        .await
        .expect("claim")
        .into_inner();
    let key = first.entry.expect("entry").key;
    app.client
        .clone()
        .complete(success(&key, &first.claim_token, b"ok"))
        .await
        .expect("complete");
    for _ in 0..2 {
        let again = claim(claim_req("run-1", "credit", "{}"))
            .await
            .expect("claim");
        assert_eq!(again.into_inner().outcome(), pb::Outcome::Replayed);
    }
    for n in 0..3 {
        claim(claim_req("run-1", "ticket", &format!("{{\"n\":{n}}}")))
            .await
            .expect("claim");
    }
    let explicit = |args: &str| pb::ClaimRequest {
        key: "wf-1:step-1".into(),
        ..claim_req("run-1", "credit", args)
    };
    claim(explicit(r#"{"a":1}"#)).await.expect("claim");
    let reused = claim(explicit(r#"{"a":2}"#))
        .await
        .expect_err("a reused key");
    assert_eq!(reason(&reused), "KEY_REUSED_WITH_DIFFERENT_REQUEST");
    // Minute two: two more tools; beyond --metrics-max-tools, they count together.
    app.clock.advance(Duration::from_secs(60));
    claim(claim_req("run-1", "mail", "{}"))
        .await
        .expect("claim");
    claim(claim_req("run-1", "sms", "{}")).await.expect("claim");

    let figures = app
        .client
        .clone()
        .replay_rate(pb::ReplayRateRequest::default())
        .await
        .expect("ReplayRate")
        .into_inner();
    assert_eq!(
        figures.bucket_width,
        Some(prost_types::Duration {
            seconds: 60,
            nanos: 0
        })
    );
    assert_eq!(
        figures.alarm_window,
        Some(prost_types::Duration {
            seconds: 300,
            nanos: 0
        })
    );
    assert_eq!(figures.alarm_min_claims, 3);
    let total = figures.total.expect("total");
    assert_eq!(
        (
            total.tool.as_str(),
            total.claims,
            total.replays,
            total.key_reuse_refusals
        ),
        ("", 9, 2, 1)
    );
    assert!(
        (total.replay_ratio - 2.0 / 9.0).abs() < 1e-9,
        "{}",
        total.replay_ratio
    );
    assert_eq!(total.buckets.len(), 60);
    let [.., before, now] = total.buckets.as_slice() else {
        panic!("60 buckets")
    };
    assert_eq!(
        (before.claims, before.replays, before.key_reuse_refusals),
        (7, 2, 1)
    );
    assert_eq!((now.claims, now.replays, now.key_reuse_refusals), (2, 0, 0));
    let as_of = figures.as_of.expect("as_of");
    let start = now.start.expect("start");
    assert!(start.seconds <= as_of.seconds && as_of.seconds < start.seconds + 60);
    assert_eq!(start.seconds % 60, 0, "buckets are whole minutes");
    assert_eq!(before.start.expect("start").seconds, start.seconds - 60);
    assert!(!total.alarm, "the tenant's window holds replays");

    let names: Vec<(&str, bool)> = figures
        .tools
        .iter()
        .map(|s| (s.tool.as_str(), s.folded))
        .collect();
    assert_eq!(
        names,
        [("credit", false), ("ticket", false), ("other", true)]
    );
    let credit = &figures.tools[0];
    assert_eq!(
        (
            credit.claims,
            credit.replays,
            credit.key_reuse_refusals,
            credit.alarm
        ),
        (4, 2, 1, false)
    );
    assert!((credit.replay_ratio - 0.5).abs() < 1e-9);
    let ticket = &figures.tools[1];
    assert_eq!(
        (ticket.claims, ticket.replays, ticket.window_claims),
        (3, 0, 3)
    );
    assert!(ticket.alarm, "three claims and no replay in its window");
    let [.., marked, _] = ticket.buckets.as_slice() else {
        panic!("60 buckets")
    };
    assert!(marked.alarm, "the alarm is marked in the minute it fired");
    assert!(ticket.buckets.iter().filter(|b| b.alarm).count() == 1);
    let other = &figures.tools[2];
    assert_eq!((other.claims, other.buckets[59].claims), (2, 2));

    // One tool's figures; a malformed name is refused.
    let only = app
        .client
        .clone()
        .replay_rate(pb::ReplayRateRequest {
            tool: "ticket".into(),
        })
        .await
        .expect("ReplayRate")
        .into_inner();
    assert_eq!(only.tools.len(), 1);
    assert_eq!(only.total.expect("total").claims, 9);
    let refused = app
        .client
        .clone()
        .replay_rate(pb::ReplayRateRequest {
            tool: "bad\u{7}tool".into(),
        })
        .await
        .expect_err("a control character");
    assert_eq!(refused.code(), Code::InvalidArgument);

    // The console's page shows the same numbers.
    let page = Browser::new(addr).get("/replay-rate").await;
    assert_eq!(page.status, 200, "{}", page.body);
    for row in [
        "<tr><td>All tools</td><td class=\"num\">9</td><td class=\"num\">2</td>\
         <td class=\"num\">0.22</td><td class=\"num\">1</td>",
        "<tr><td>ticket</td><td class=\"num\">3</td><td class=\"num\">0</td>\
         <td class=\"num\">0.00</td><td class=\"num\">0</td><td class=\"num\">3 claims, 0 \
         replays</td><td><b class=\"warn\">ON</b></td></tr>",
    ] {
        assert!(page.body.contains(row), "no {row:?} in:\n{}", page.body);
    }
    assert_eq!(
        page.body.matches("<svg ").count(),
        4,
        "the total and three series"
    );
    assert!(page.body.contains("class=\"alarm\""), "{}", page.body);
    assert!(page.body.contains("class=\"reuse\""), "{}", page.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tenant_gets_its_own_replay_figures() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = tokens_file(&dir);
    let app = spawn_app_with(Backend::Sqlite, |s| s.auth_tokens_file = Some(path)).await;
    let mut client = app.client.clone();
    client
        .claim(as_tenant(
            claim_req("r", "acme_tool", "{}"),
            Some("token-acme"),
        ))
        .await
        .expect("claim");
    let rate = |token: &'static str| {
        let mut client = app.client.clone();
        async move {
            client
                .replay_rate(as_tenant(pb::ReplayRateRequest::default(), Some(token)))
                .await
                .map(tonic::Response::into_inner)
        }
    };
    let acme = rate("token-acme").await.expect("acme");
    assert_eq!(acme.total.expect("total").claims, 1);
    assert_eq!(acme.tools[0].tool, "acme_tool");
    let globex = rate("token-globex").await.expect("globex");
    assert_eq!(globex.total.expect("total").claims, 0);
    assert!(globex.tools.is_empty());
    let anonymous = client
        .replay_rate(pb::ReplayRateRequest::default())
        .await
        .expect_err("no credential");
    assert_eq!(anonymous.code(), Code::Unauthenticated);
}

// ---- start-up ----------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_start_up_log_names_the_consoles_url_and_its_landing_page_answers() {
    let db = TestDb::new(Backend::Sqlite);
    let server = ServerProcess::start(&db.url, &["--console-listen", "127.0.0.1:0"]).await;
    let log = crate::support::plain(&server.startup_log);
    let line = log
        .lines()
        .find(|l| l.contains("operator console: open http://127.0.0.1:"))
        .unwrap_or_else(|| panic!("no console URL in:\n{log}"));
    let url = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("url="))
        .unwrap_or_else(|| panic!("no url field: {line}"));
    let addr: SocketAddr = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .expect("an address");
    let page = Browser::new(addr).get("/").await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body.contains("<h1>Needs a person</h1>"),
        "{}",
        page.body
    );

    let off = ServerProcess::start(&db.url, &["--console-listen", "off"]).await;
    assert!(
        crate::support::plain(&off.startup_log).contains("operator console off"),
        "{}",
        off.startup_log
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_console_address_asked_for_must_bind_and_the_default_may_be_taken() {
    let taken = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = taken.local_addr().expect("addr");
    let db = TestDb::new(Backend::Sqlite);
    let mut settings = test_settings(&db.url);
    settings.console_listen = Some(Listen::At(addr));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let refused = server::run(
        listener,
        settings,
        ManualClock::new(),
        async {},
        tokio_stream::pending(),
    )
    .await;
    let error = refused
        .expect_err("the console's address is taken")
        .to_string();
    assert!(error.contains("for the console"), "{error}");

    // The default address, taken: the server starts without a console and says why.
    let default = TcpListener::bind(idempotency_ledger::console::DEFAULT_LISTEN).await;
    let server = ServerProcess::start_with(&db.url, 0, &[], |command| {
        command.env_remove("LEDGER_CONSOLE_LISTEN");
    })
    .await;
    let log = crate::support::plain(&server.startup_log);
    // Held here, or by another process: either way taken, unless that one let it go meanwhile.
    assert!(
        log.contains("operator console not started: its default address is taken")
            || log.contains("operator console: open http://127.0.0.1:50053/"),
        "{log}"
    );
    if default.is_ok() {
        assert!(log.contains("operator console not started"), "{log}");
    }
    let mut client = server.client().await;
    client
        .claim(claim_req("r", "t", "{}"))
        .await
        .expect("the service runs either way");
}

// ---- evidence: fenced forms, possible double effects -------------------------------------

/// Posts the page's `action` form for `key` as a browser would: its hidden fields, plus `more`.
async fn submit(
    browser: &mut Browser,
    page: &Page,
    action: &str,
    key: &str,
    more: &[(&str, &str)],
) -> Page {
    let hidden = page.hidden_fields(action, key);
    let mut fields: Vec<(&str, &str)> = hidden
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    fields.extend_from_slice(more);
    browser.post(action, &fields).await
}

async fn history(app: &TestApp, key: &str) -> Vec<pb::HistoryEvent> {
    app.client
        .clone()
        .lookup(pb::LookupRequest {
            key: key.to_string(),
            include_history: true,
            ..Default::default()
        })
        .await
        .expect("lookup")
        .into_inner()
        .history
}

async fn a_resolve_form_rendered_before_the_entry_moved_on_changes_nothing(backend: Backend) {
    let (app, addr) = console_app(backend, |_| {}).await;
    let entry = unknown(&app, None, "run-1", "issue_credit", r#"{"n":1}"#).await;
    let mut browser = Browser::new(addr);
    let shown = browser.get("/").await;
    let fields = shown.hidden_fields("/resolve", &entry.key);
    assert!(
        fields.contains(&("attempt".into(), "1".into())) && fields.iter().any(|(n, _)| n == "hold"),
        "the form carries what the page showed: {fields:?}"
    );
    // Meanwhile a reconciler takes the entry: the page's view of it is out of date.
    let taken = app
        .client
        .clone()
        .reconcile(pb::ReconcileRequest {
            keys: vec![entry.key.clone()],
            ..Default::default()
        })
        .await
        .expect("reconcile")
        .into_inner();
    assert_eq!(taken.pending.len(), 1);
    let answer = submit(
        &mut browser,
        &shown,
        "/resolve",
        &entry.key,
        &[("outcome", "not_found"), ("operator", "ada")],
    )
    .await;
    assert_eq!(answer.status, 303, "{}", answer.body);
    let landing = browser.get("/").await;
    assert!(
        landing.body.contains("moved on since this page showed it"),
        "{}",
        landing.body
    );
    let now = lookup(&app, None, &entry.key).await.expect("lookup");
    assert_eq!(
        (now.status(), now.resolved_by.as_str()),
        (pb::Status::Unknown, "")
    );
    let kept = history(&app, &entry.key).await;
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(
        (kept[0].kind.as_str(), kept[0].principal.as_str()),
        ("finding_stale", "console:ada")
    );
    // A page rendered now carries the new hold, and its form settles.
    let fresh = browser.get("/").await;
    let answer = submit(
        &mut browser,
        &fresh,
        "/resolve",
        &entry.key,
        &[("outcome", "not_found"), ("operator", "ada")],
    )
    .await;
    assert_eq!(answer.status, 303, "{}", answer.body);
    let now = lookup(&app, None, &entry.key).await.expect("lookup");
    assert_eq!(
        (now.status(), now.resolved_by.as_str()),
        (pb::Status::Failed, "console:ada")
    );
}

async fn a_possible_double_effect_is_shown_first_with_its_evidence_until_acknowledged(
    backend: Backend,
) {
    let (app, addr) = console_app(backend, |_| {}).await;
    let entry = unknown(&app, None, "run-1", "issue_credit", r#"{"n":1}"#).await;
    let other = unknown(&app, None, "run-2", "issue_credit", r#"{"n":2}"#).await;
    let mut client = app.client.clone();
    let held = client
        .reconcile(pb::ReconcileRequest {
            keys: vec![entry.key.clone()],
            ..Default::default()
        })
        .await
        .expect("take")
        .into_inner()
        .pending
        .pop()
        .expect("handed out");
    // A first read found nothing (FAILED, retryable: the next claim would act again); a later
    // read of the same attempt finds the effect after all.
    for (status, result) in [
        (pb::Status::Failed, &b""[..]),
        (pb::Status::Succeeded, b"cr-1"),
    ] {
        client
            .reconcile(pb::ReconcileRequest {
                resolutions: vec![pb::Resolution {
                    key: entry.key.clone(),
                    status: status.into(),
                    result: result.to_vec().into(),
                    error: if result.is_empty() {
                        "no credit".into()
                    } else {
                        String::new()
                    },
                    retryable: result.is_empty(),
                    attempt: held.attempt,
                    hold_token: held.hold_token.clone(),
                }],
                principal: "reconciler-7".into(),
                ..Default::default()
            })
            .await
            .expect("resolve");
    }
    assert!(
        lookup(&app, None, &entry.key)
            .await
            .expect("lookup")
            .possible_double_effect
    );
    let mut browser = Browser::new(addr);
    let landing = browser.get("/").await;
    let marked_at = landing
        .body
        .find("Possible double effects (1)")
        .unwrap_or_else(|| panic!("no section of marked entries:\n{}", landing.body));
    let unknown_at = landing
        .body
        .find(&entry_href_of(&other.key))
        .expect("the other unknown entry is listed");
    assert!(marked_at < unknown_at, "the marked entry comes first");
    for text in [
        "the effect of attempt 1 exists",
        "reconciler-7",
        &other.key[..16],
    ] {
        assert!(
            landing.body.contains(text),
            "no {text:?} in:\n{}",
            landing.body
        );
    }
    let page = browser.get(&format!("/entry?key={}", entry.key)).await;
    for text in [
        "Possible double effect.",
        "<h2>History</h2>",
        "finding applied",
        "finding about a resolved attempt (not applied)",
        "marked: possible double effect",
    ] {
        assert!(page.body.contains(text), "no {text:?} in:\n{}", page.body);
    }

    // A note is required, and a refused form changes nothing.
    let refused = submit(
        &mut browser,
        &landing,
        "/acknowledge",
        &entry.key,
        &[("note", " ")],
    )
    .await;
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert!(
        lookup(&app, None, &entry.key)
            .await
            .expect("lookup")
            .possible_double_effect
    );
    let answer = submit(
        &mut browser,
        &landing,
        "/acknowledge",
        &entry.key,
        &[("note", "refunded the second credit"), ("operator", "ada")],
    )
    .await;
    assert_eq!(answer.status, 303, "{}", answer.body);
    let after = browser.get("/").await;
    assert!(
        after
            .body
            .contains("Acknowledged the possible double effect"),
        "{}",
        after.body
    );
    assert!(
        !after.body.contains("Possible double effects ("),
        "{}",
        after.body
    );
    assert!(
        !lookup(&app, None, &entry.key)
            .await
            .expect("lookup")
            .possible_double_effect
    );
    let last = history(&app, &entry.key).await.pop().expect("an event");
    assert_eq!(
        (
            last.kind.as_str(),
            last.principal.as_str(),
            last.detail.as_str()
        ),
        (
            "double_effect_acknowledged",
            "console:ada",
            "refunded the second credit"
        )
    );
    // The same form again: nothing is marked any more, and the page says so.
    let again = submit(
        &mut browser,
        &landing,
        "/acknowledge",
        &entry.key,
        &[("note", "again")],
    )
    .await;
    assert_eq!(again.status, 303, "{}", again.body);
    assert!(
        browser
            .get("/")
            .await
            .body
            .contains("is not marked as a possible double effect"),
        "the second acknowledgement is refused"
    );
}

/// The link to an entry's page, as the console writes it.
fn entry_href_of(key: &str) -> String {
    format!("/entry?key={key}")
}

// ---- approvals: a person decides ---------------------------------------------------------

/// A server whose tenant acme has an approver (`token-boss`, recorded as `dana`) and
/// a member who is not one (`token-acme`); a console.
async fn approvers_console(backend: Backend) -> (TestApp, SocketAddr, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("tokens");
    std::fs::write(
        &path,
        "acme token-acme\nacme token-boss approver=dana\nglobex token-globex approver\n",
    )
    .expect("write tokens");
    let (app, addr) = console_app(backend, |s| s.auth_tokens_file = Some(path)).await;
    (app, addr, dir)
}

/// Claims (run, tool, args) as acme asking for a person's approval; the entry it waits in.
async fn awaiting(app: &TestApp, run: &str, tool: &str, args: &str) -> pb::Entry {
    let mut request = claim_req(run, tool, args);
    request.require_approval = true;
    let asked = app
        .client
        .clone()
        .claim(as_tenant(request, Some("token-acme")))
        .await
        .expect("claim")
        .into_inner();
    assert_eq!(asked.outcome(), pb::Outcome::AwaitingApproval);
    asked.entry.expect("entry")
}

async fn an_approver_approves_and_denies_through_the_console_and_the_agent_hears_of_it(
    backend: Backend,
) {
    let (app, addr, _dir) = approvers_console(backend).await;
    let refund = awaiting(&app, "run-1", "issue_refund", r#"{"amount":125}"#).await;
    app.clock.advance(Duration::from_secs(5));
    let delete = awaiting(&app, "run-2", "delete_account", r#"{"user":"u-9"}"#).await;
    let mut browser = Browser::new(addr);
    sign_in(&mut browser, "token-boss", "").await;
    let page = browser.get("/approvals").await;
    assert_eq!(page.status, 200, "{}", page.body);
    let refund_at = page
        .body
        .find("issue_refund")
        .expect("the refund is listed");
    let delete_at = page
        .body
        .find("delete_account")
        .expect("the deletion is listed");
    assert!(refund_at < delete_at, "oldest first:\n{}", page.body);
    assert!(
        page.body.contains("&quot;amount&quot;: 125") || page.body.contains("125"),
        "the arguments are shown:\n{}",
        page.body
    );
    let fields = page.hidden_fields("/decide", &refund.key);
    assert!(
        fields.contains(&("fingerprint".into(), refund.fingerprint.clone())),
        "the form binds to the arguments it showed: {fields:?}"
    );

    let approved = submit(
        &mut browser,
        &page,
        "/decide",
        &refund.key,
        &[("decision", "approve"), ("reason", "within policy")],
    )
    .await;
    assert_eq!(approved.status, 303, "{}", approved.body);
    let denied = submit(
        &mut browser,
        &page,
        "/decide",
        &delete.key,
        &[("decision", "deny"), ("reason", "ask the customer first")],
    )
    .await;
    assert_eq!(denied.status, 303, "{}", denied.body);
    let after = browser.get("/approvals").await;
    assert!(
        after.body.contains("Denied delete_account")
            && after.body.contains("recorded as decided by dana"),
        "{}",
        after.body
    );
    assert!(
        after.body.contains("No call awaits a decision.")
            && after.body.contains("Approved, not yet used (1)")
            && after.body.contains("approved by dana (within policy)"),
        "{}",
        after.body
    );

    // The agent's next claims: the approved call acts once, the denied one is told why.
    let mut client = app.client.clone();
    let acting = client
        .claim(as_tenant(
            {
                let mut r = claim_req("run-1", "issue_refund", r#"{"amount":125}"#);
                r.require_approval = true;
                r
            },
            Some("token-acme"),
        ))
        .await
        .expect("claim")
        .into_inner();
    assert_eq!(acting.outcome(), pb::Outcome::Claimed);
    let told = client
        .claim(as_tenant(
            claim_req("run-2", "delete_account", r#"{"user":"u-9"}"#),
            Some("token-acme"),
        ))
        .await
        .expect("claim")
        .into_inner();
    assert_eq!(told.outcome(), pb::Outcome::Denied);
    let entry = told.entry.expect("entry");
    let approval = entry.approval.expect("approval");
    assert_eq!(
        (approval.decided_by.as_str(), approval.reason.as_str()),
        ("dana", "ask the customer first")
    );
    // The same form again: already decided that way, nothing changes; the other way is refused.
    let again = submit(
        &mut browser,
        &page,
        "/decide",
        &delete.key,
        &[("decision", "approve"), ("reason", "")],
    )
    .await;
    assert_eq!(again.status, 303, "{}", again.body);
    let refused = browser.get("/approvals").await;
    assert!(
        refused.body.contains("was already decided"),
        "{}",
        refused.body
    );
    let still = client
        .claim(as_tenant(
            claim_req("run-2", "delete_account", r#"{"user":"u-9"}"#),
            Some("token-acme"),
        ))
        .await
        .expect("claim")
        .into_inner();
    assert_eq!(still.outcome(), pb::Outcome::Denied);
}

async fn a_member_without_the_approver_role_sees_requests_but_cannot_decide(backend: Backend) {
    let (app, addr, _dir) = approvers_console(backend).await;
    let refund = awaiting(&app, "run-1", "issue_refund", r#"{"amount":125}"#).await;
    let mut member = Browser::new(addr);
    sign_in(&mut member, "token-acme", "ada").await;
    let page = member.get("/approvals").await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("issue_refund"), "{}", page.body);
    assert!(
        page.body.contains("without the approver role")
            && !page.body.contains("action=\"/decide\""),
        "no decision forms for a member:\n{}",
        page.body
    );
    // A hand-made form is refused, and changes nothing.
    let csrf = page.csrf();
    let forged = member
        .post(
            "/decide",
            &[
                ("csrf", &csrf),
                ("key", &refund.key),
                ("fingerprint", &refund.fingerprint),
                ("decision", "approve"),
            ],
        )
        .await;
    assert_eq!(forged.status, 403, "{}", forged.body);
    let now = lookup(&app, Some("token-acme"), &refund.key)
        .await
        .expect("lookup");
    assert_eq!(now.status(), pb::Status::AwaitingApproval);

    // Another tenant's approver sees none of acme's requests.
    let mut other = Browser::new(addr);
    sign_in(&mut other, "token-globex", "").await;
    let theirs = other.get("/approvals").await;
    assert!(
        theirs.body.contains("No call awaits a decision.") && !theirs.body.contains("issue_refund"),
        "{}",
        theirs.body
    );
    // A form whose fingerprint is not the entry's is refused: the decision binds to it.
    let mut boss = Browser::new(addr);
    sign_in(&mut boss, "token-boss", "").await;
    let shown = boss.get("/approvals").await;
    let csrf = shown.csrf();
    let mismatched = boss
        .post(
            "/decide",
            &[
                ("csrf", &csrf),
                ("key", &refund.key),
                ("fingerprint", &"0".repeat(64)),
                ("decision", "approve"),
            ],
        )
        .await;
    assert_eq!(mismatched.status, 303, "{}", mismatched.body);
    assert!(
        boss.get("/approvals")
            .await
            .body
            .contains("are not the ones this page showed"),
        "the mismatch is said"
    );
    let now = lookup(&app, Some("token-acme"), &refund.key)
        .await
        .expect("lookup");
    assert_eq!(now.status(), pb::Status::AwaitingApproval);
}

async fn a_lapsed_request_leaves_the_approvals_page_and_reads_lapsed_before_anything_records_it(
    backend: Backend,
) {
    let (app, addr, _dir) = approvers_console(backend).await;
    let refund = awaiting(&app, "run-l", "issue_refund", r#"{"amount":125}"#).await;
    let mut browser = Browser::new(addr);
    sign_in(&mut browser, "token-boss", "").await;
    assert!(
        browser
            .get("/approvals")
            .await
            .body
            .contains("issue_refund")
    );
    // Past decide_by (72 h), with no claim and no sweep in between (the test's clock).
    app.clock.advance(Duration::from_secs(73 * 3600));
    // The session lapsed too: sign in again.
    let mut browser = Browser::new(addr);
    sign_in(&mut browser, "token-boss", "").await;
    let listed = browser.get("/approvals").await;
    assert!(
        !listed.body.contains("issue_refund") && listed.body.contains("No call awaits a decision."),
        "a lapsed request is no longer listed as awaiting:\n{}",
        listed.body
    );
    let entry = browser.get(&format!("/entry?key={}", refund.key)).await;
    assert_eq!(entry.status, 200, "{}", entry.body);
    assert!(
        entry
            .body
            .contains("FAILED (retryable) as its approval lapsed")
            && entry
                .body
                .contains("the request lapsed undecided: nothing was done"),
        "the entry reads lapsed:\n{}",
        entry.body
    );
    assert!(!entry.body.contains("AWAITING_APPROVAL"), "{}", entry.body);
}
