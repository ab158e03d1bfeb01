//! Security checks as tests: secrets in arguments and results never reach the logs, and SQL
//! is only ever built from constant text with bound parameters. (Tenant isolation and
//! authentication before validation are in `tenants.rs`.)

use std::time::Duration;

use idempotency_ledger::grpc::pb;
use idempotency_ledger::grpc::pb::ledger_service_client::LedgerServiceClient;
use tonic::transport::Channel;

use crate::support::{Backend, STARTING, TestDb, claim_req, success, wait_for_logged_addr};

const CANARY: &str = "CANARY-7f1d9c-sk_live_do_not_log";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arguments_and_results_never_appear_in_the_logs() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let db = TestDb::new(backend);
        let log_dir = tempfile::tempdir().expect("dir");
        let log_path = log_dir.path().join("server.log");
        let log = std::fs::File::create(&log_path).expect("log file");
        // The most verbose level our crate and sqlx log at.
        let mut child = crate::support::ledger_command()
            .args(["--listen", "127.0.0.1:0", "--database-url", &db.url])
            .env(
                "RUST_LOG",
                "trace,h2=info,hyper=info,tower=info,tonic=debug",
            )
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn");
        let port = wait_for_logged_addr(&log_path, STARTING, "listen")
            .await
            .port();
        let channel = connect(port).await;
        let mut client = LedgerServiceClient::new(channel);
        let args = format!("{{\"card_number\":\"{CANARY}\",\"amount\":5}}");
        let claimed = client
            .claim(claim_req("run-secret", "charge_card", &args))
            .await
            .expect("claim")
            .into_inner();
        let key = claimed.entry.as_ref().expect("entry").key.clone();
        client
            .complete(success(
                &key,
                &claimed.claim_token,
                format!("{{\"receipt\":\"{CANARY}\"}}").as_bytes(),
            ))
            .await
            .expect("complete");
        client
            .claim(claim_req("run-secret", "charge_card", &args))
            .await
            .expect("replay");
        client
            .lookup(pb::LookupRequest {
                key: key.clone(),
                ..Default::default()
            })
            .await
            .expect("lookup");
        // Refused requests carrying the canary are not logged either.
        let _ = client
            .claim(claim_req(
                "run-secret",
                "charge_card",
                &format!("{{\"a\":\"{CANARY}\",\"a\":1}}"),
            ))
            .await;
        let _ = client
            .complete(pb::CompleteRequest {
                key: key.clone(),
                claim_token: CANARY.into(),
                status: pb::Status::Failed.into(),
                error: CANARY.into(),
                ..Default::default()
            })
            .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        child.start_kill().expect("kill");
        let _ = child.wait().await;
        let text = std::fs::read_to_string(&log_path).expect("read log");
        assert!(
            text.contains("claim"),
            "{backend:?}: the log is verbose enough to matter"
        );
        assert!(
            text.lines().count() > 20,
            "{backend:?}: only {} lines",
            text.lines().count()
        );
        assert!(
            !text.contains(CANARY),
            "{backend:?}: the canary leaked into the log"
        );
    }
}

async fn connect(port: u16) -> Channel {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(channel) = Channel::from_shared(format!("http://127.0.0.1:{port}"))
            .expect("uri")
            .connect()
            .await
        {
            let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
            let serving = health
                .check(tonic_health::pb::HealthCheckRequest {
                    service: String::new(),
                })
                .await
                .is_ok_and(|r| r.into_inner().status == 1);
            if serving {
                return channel;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "server did not start"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn sql_is_only_built_from_constant_text_with_bound_parameters() {
    // The server and the crates below it: the stores run the SQL.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.to_path_buf();
    let mut checked = 0;
    let mut violations = Vec::new();
    let mut stack = vec![
        root.join("src"),
        root.join("crates/core/src"),
        root.join("crates/stores/src"),
    ];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read");
            let name = path
                .strip_prefix(&src)
                .unwrap_or(&path)
                .display()
                .to_string();
            let (calls, found) = sql_text_violations(&name, &text);
            checked += calls;
            violations.extend(found);
        }
    }
    assert!(
        checked >= 10,
        "found only {checked} query calls: the check looks in the wrong place"
    );
    assert!(
        violations.is_empty(),
        "SQL not from a constant: {violations:#?}"
    );
}

#[test]
fn the_sql_check_sees_every_way_to_run_text_built_at_run_time() {
    let built = r#"
        let a = sqlx::raw_sql(&format!("SET x = {v}"));
        let b = sqlx::query_with(text, args);
        let c = sqlx::query_as_with::<_, Row, _>(&sql, args);
        let d = sqlx::query_scalar_with(sql.as_str(), args);
        let h = sqlx::query_with_result(&text, args);
        let i = sqlx::query_as_with_result(sql, args);
        conn.execute(statement).await?;
        (&pool).fetch_one(sql).await?;
        conn.fetch_optional(AssertSqlSafe(sql)).await?;
        let e = sqlx::query(Box::leak(sql.into_boxed_str()));
        let f = String::leak(sql);
        let mut g = sqlx::QueryBuilder::new("SELECT ");
        conn.copy_in_raw(&copy).await?;
        let tx = conn.begin_with(&begin).await?;
        use sqlx::raw_sql;
        use sqlx::{query, Row};
    "#;
    let (_, found) = sql_text_violations("example.rs", built);
    for needle in [
        "raw_sql(&format!",
        "query_with(text",
        "query_as_with::<_, Row, _>(&sql",
        "query_scalar_with(sql.as_str()",
        "query_with_result(&text",
        "query_as_with_result(sql",
        ".execute(statement",
        ".fetch_one(sql",
        "AssertSqlSafe",
        "Box::leak",
        "String::leak",
        "QueryBuilder",
        "copy_in_raw",
        ".begin_with(&begin",
        "use sqlx::raw_sql",
        "use sqlx::{query",
    ] {
        assert!(
            found.iter().any(|v| v.contains(needle)),
            "{needle} is not reported: {found:#?}"
        );
    }
    let constant = r#"
        sqlx::query(sql::CLAIM).bind(x).execute(&mut *conn).await?;
        sqlx::raw_sql("BEGIN")
            .execute(&mut *conn)
            .await?;
        sqlx::query_scalar(Self::IN_RECOVERY).fetch_one(&self.pool).await?;
        sqlx::query_as_with(self::LIST, args).fetch_all(pool).await?;
        conn.execute("SELECT 1").await?;
        let tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        bind_entry!(sqlx::query(sql::INSERT), tenant, entry)
            .execute(&mut *tx)
            .await?;
        sqlx::query_with_result(sql::INSERT, sql::arguments::<DB>(params))
            .execute(&mut *tx)
            .await?;
        tenancy.describe();
    "#;
    let (calls, found) = sql_text_violations("example.rs", constant);
    assert!(found.is_empty(), "{found:#?}");
    assert_eq!(calls, 6, "every call to a sqlx function is counted");
}

/// Calls whose argument is SQL text built at run time and which `sql_text_violations` lets
/// through, each with why it is safe: the whole call as written, so any other is refused.
const REVIEWED: &[(&str, &str, &str)] = &[
    (
        "stores/src/postgres.rs",
        "sqlx::query_as_with(w.statement, args)",
        "write_noted's statement (`Written::statement`, a `&'static str`), checked at each call \
         of write_noted as the store's own `execute` is",
    ),
    (
        "stores/src/postgres.rs",
        "sqlx::query_with(also.statement, args)",
        "an `Also`'s statement, a `&'static str` field that only `keep_run` in \
         sql_store/methods.rs sets, to sql::EXTEND_RUN_OF_KEY",
    ),
    (
        "stores/src/sqlite.rs",
        "sqlx::query_with(also.statement, args)",
        "as the line above",
    ),
    (
        "stores/src/postgres.rs",
        "sqlx::raw_sql(sqlx::AssertSqlSafe(self.begin.clone()))",
        "the BEGIN built once in PgStore::connect from an integer (the statement timeout's \
         milliseconds), or the literal \"BEGIN\"",
    ),
    (
        "stores/src/postgres.rs",
        "AssertSqlSafe(self.begin.clone())",
        "as the line above",
    ),
    (
        "stores/src/postgres.rs",
        "sqlx::raw_sql(end)",
        "the literal \"COMMIT\" or \"ROLLBACK\"",
    ),
    (
        "stores/src/sql_store.rs",
        "sqlx::query_with(statement, args)",
        "the statement of `sql_store::statement`, the runner of the stores' own `execute` and \
         `fetch_all` (a `&'static str`), whose every call this test checks as it checks sqlx's \
         (methods of those names)",
    ),
    (
        "stores/src/sqlite.rs",
        "sqlx::query_as_with(statement, args)",
        "write_noted's statement (a `&'static str`), checked at each call of write_noted",
    ),
    (
        "stores/src/sqlite.rs",
        ".execute(conn))",
        "the executor (a connection) of a statement `sql_store::statement` bound, as above",
    ),
    (
        "stores/src/postgres.rs",
        ".execute(conn))",
        "as the line above",
    ),
    (
        "stores/src/sqlite/plans.rs",
        "sqlx::query_as(sqlx::AssertSqlSafe(format!(\"EXPLAIN QUERY PLAN {text}\"",
        "a test's EXPLAIN of the constant statements of `sql::` it lists",
    ),
    (
        "stores/src/sqlite/plans.rs",
        "AssertSqlSafe(format!(\"EXPLAIN QUERY PLAN {text}\"",
        "as the line above",
    ),
];

/// sqlx's functions that take SQL text as their first argument.
const SQL_FUNCTIONS: &[&str] = &[
    "query",
    "query_as",
    "query_scalar",
    "query_with",
    "query_as_with",
    "query_scalar_with",
    "query_with_result",
    "query_as_with_result",
    "query_scalar_with_result",
    "raw_sql",
];

/// `Executor` methods that take SQL text as their argument when called on a connection or a
/// pool (on a query built above, their argument is the executor instead), and
/// `Connection::begin_with`.
const EXECUTOR_METHODS: &[&str] = &[
    "execute",
    "execute_many",
    "fetch",
    "fetch_many",
    "fetch_all",
    "fetch_one",
    "fetch_optional",
    "prepare",
    "prepare_with",
    "describe",
    "begin_with",
];

/// Whether a call's argument is constant SQL text: a literal, or a constant of `sql::`, `Self::`,
/// `self::` or `D::` (a SQL dialect's associated constant, in the store written once over it).
fn constant_sql(arg: &str) -> bool {
    arg.starts_with('"')
        || arg.starts_with("r#\"")
        || arg.starts_with("r\"")
        || ["sql::", "Self::", "self::", "D::", "PgStore::"]
            .iter()
            .any(|p| {
                arg.starts_with(p) && arg[p.len()..].starts_with(|c: char| c.is_ascii_uppercase())
            })
}

/// Whether `before` ends with a call (`….bind(x)`, `query::<T>(…)`, `bind_entry!(…)`), rather
/// than with a value in parentheses (`(&pool)`).
fn called_on_a_call(before: &str) -> bool {
    let before = before.trim_end();
    if !before.ends_with(')') {
        return false;
    }
    let mut depth = 0;
    for (i, c) in before.char_indices().rev() {
        match c {
            ')' => depth += 1,
            '(' => {
                depth -= 1;
                if depth == 0 {
                    return before[..i]
                        .chars()
                        .next_back()
                        .is_some_and(|c| c.is_ascii_alphanumeric() || "_>!".contains(c));
                }
            }
            _ => {}
        }
    }
    false
}

/// The line of `text[..at]`'s end and what follows `at`, for a report.
fn place(name: &str, text: &str, at: usize) -> String {
    let line = text[..at].matches('\n').count() + 1;
    let shown: String = text[at..].chars().take(70).collect();
    format!("{name}:{line}: {}", shown.replace('\n', " "))
}

/// The calls in `text` (a source file called `name`) that run SQL text which is not a constant,
/// and how many calls of sqlx's functions it holds. Text built at run time can only reach sqlx
/// through `AssertSqlSafe`, a leaked string, a `QueryBuilder` or the raw COPY calls; constant text
/// as `&'static str`, which the argument of each call must then be (a literal or a constant),
/// also for the `Executor` methods called on a connection. sqlx's functions are called by their
/// full name, so that none escapes the search by being imported.
fn sql_text_violations(name: &str, text: &str) -> (usize, Vec<String>) {
    let mut calls = 0;
    let mut violations = Vec::new();
    let reviewed = |at: usize| {
        REVIEWED
            .iter()
            .any(|(file, call, _)| name.ends_with(file) && text[at..].starts_with(call))
    };
    for marker in [
        "AssertSqlSafe",
        "Box::leak",
        "String::leak",
        ".leak()",
        "QueryBuilder",
        "copy_in_raw",
        "copy_out_raw",
        "SqlStr",
    ] {
        for (at, _) in text.match_indices(marker) {
            if !reviewed(at) {
                violations.push(place(name, text, at));
            }
        }
    }
    for (at, _) in text.match_indices("use sqlx::") {
        let statement = &text[at..text[at..].find(';').map_or(text.len(), |end| at + end)];
        // A function imported by name (`use sqlx::{query, Row}`), not a module of that name
        // (`use sqlx::query::Query`).
        let imports = SQL_FUNCTIONS.iter().any(|function| {
            statement.match_indices(function).any(|(i, _)| {
                let before = statement[..i].chars().next_back();
                let after = &statement[i + function.len()..];
                !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
                    && !after.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
                    && !after.starts_with("::")
            })
        });
        if imports {
            violations.push(place(name, text, at));
        }
    }
    for function in SQL_FUNCTIONS {
        let call = format!("sqlx::{function}");
        for (at, _) in text.match_indices(&call) {
            let rest = &text[at + call.len()..];
            // `sqlx::query` must not match `sqlx::query_as`; a turbofish may come first.
            let rest = match rest.strip_prefix("::<") {
                Some(generic) => match generic.find(">(") {
                    Some(end) => &generic[end + 1..],
                    None => continue,
                },
                None => rest,
            };
            let Some(arg) = rest.strip_prefix('(') else {
                continue;
            };
            calls += 1;
            // The argument may start on the next line, where rustfmt puts it.
            if !constant_sql(arg.trim_start()) && !reviewed(at) {
                violations.push(place(name, text, at));
            }
        }
    }
    for method in EXECUTOR_METHODS {
        let call = format!(".{method}(");
        for (at, _) in text.match_indices(&call) {
            // Called on a query built above (`sqlx::query(…)\n    .execute(&mut *conn)`): the
            // argument is the executor.
            if called_on_a_call(&text[..at]) {
                continue;
            }
            let arg = text[at + call.len()..].trim_start();
            // Our own methods of the same names (`tenancy.describe()`) take nothing.
            if arg.starts_with(')') || constant_sql(arg) || reviewed(at) {
                continue;
            }
            violations.push(place(name, text, at));
        }
    }
    (calls, violations)
}
