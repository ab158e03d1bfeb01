//! Connecting to PostgreSQL: the pool and its options, the checks that a session is the
//! server's own (or a transaction pooler's), the migrations under a lock, and what the log
//! says of the connection.

use super::*;

impl PgStore {
    /// Prepares a pool for `url` without connecting yet.
    ///
    /// # Errors
    /// `Internal` when the URL cannot be parsed.
    pub fn connect(url: &str, options: &PoolOptions) -> StoreResult<PgStore> {
        let connect = connect_options(url)?;
        let pooled = options.pooler == crate::storage::Pooler::Transaction;
        // Zero leaves the database's (or the role's) own setting alone.
        let timeout_ms = options.statement_timeout.as_millis();
        let session_timeout = (timeout_ms > 0).then(|| format!("{timeout_ms}ms"));
        // Built once, from an integer: a transaction pooler keeps no session setting, so each
        // transaction sets its own timeout in the same round trip as its BEGIN.
        let begin: std::sync::Arc<str> = if timeout_ms > 0 {
            format!("BEGIN; SET LOCAL statement_timeout = {timeout_ms}").into()
        } else {
            "BEGIN".into()
        };
        let marks = std::sync::Arc::new(StoreMarks::default());
        let stale = marks.clone();
        let mut pool_options = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            .test_before_acquire(false)
            .before_acquire(move |conn, meta| {
                // Opened before one of them reached a standby: closed, not lent (after a
                // failover the address leads elsewhere, but these still lead to the old host).
                let stale = stale.is_stale(meta.age);
                Box::pin(async move {
                    if stale {
                        return Ok(false);
                    }
                    if meta.idle_for >= PING_IF_IDLE_FOR {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            });
        if !pooled {
            pool_options = pool_options.after_connect(move |conn, _| {
                let timeout = session_timeout.clone();
                Box::pin(async move {
                    match timeout {
                        Some(timeout) => {
                            sqlx::query(self::SESSION_SETTINGS)
                                .bind(timeout)
                                .execute(conn)
                                .await?
                        }
                        None => sqlx::query(self::PLAN_SETTING).execute(conn).await?,
                    };
                    Ok(())
                })
            });
        }
        let pool = pool_options.connect_lazy_with(connect.clone());
        let listen_pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(options.acquire_timeout)
            .connect_lazy_with(connect.clone());
        Ok(PgStore {
            pool: kept_connections::Connections::new(pool),
            listen_pool,
            marks,
            connect,
            pooled,
            begin,
            migrations_url: options.migrations_url.clone(),
            connect_timeout: options.connect_timeout,
        })
    }

    /// Whether statements may be named prepared statements that outlive their transaction:
    /// not behind a transaction pooler, where the next transaction may run on another server
    /// connection (or one where the same name is another statement).
    pub(super) fn persistent(&self) -> bool {
        !self.pooled
    }

    /// Opens one connection of its own (not from the pool), within the connect timeout.
    pub(super) async fn connect_once(
        &self,
        options: &PgConnectOptions,
    ) -> Result<sqlx::PgConnection, sqlx::Error> {
        use sqlx::ConnectOptions as _;
        match tokio::time::timeout(self.connect_timeout, options.connect()).await {
            Ok(connected) => connected,
            Err(_) => Err(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "no connection within --db-connect-timeout ({:?})",
                    self.connect_timeout
                ),
            ))),
        }
    }

    /// Runs the migrations on `conn`, waiting at most [`MIGRATION_LOCK_TIMEOUT`] for their
    /// lock.
    pub(super) async fn migrate_on(conn: &mut sqlx::PgConnection) -> StoreResult<()> {
        sqlx::query(self::MIGRATION_SETTINGS)
            .bind(MIGRATION_LOCK_TIMEOUT)
            .execute(&mut *conn)
            .await
            .map_err(StoreError::from_postgres)?;
        upgrade_edited_migrations(conn)
            .await
            .map_err(StoreError::from_postgres)?;
        MIGRATOR
            .run_direct(None, conn, false)
            .await
            .map_err(|e| match e {
                sqlx::migrate::MigrateError::Execute(inner) => {
                    match StoreError::from_postgres(inner) {
                        StoreError::Unavailable(detail) if detail.contains("lock timeout") => {
                            StoreError::Unavailable(format!(
                                "cannot take the migrations' lock within \
                                 {MIGRATION_LOCK_TIMEOUT}: another server is migrating, or a \
                                 session (one a pooler kept) holds it ({detail})"
                            ))
                        }
                        other => other,
                    }
                }
                other => StoreError::Internal(other.to_string()),
            })
    }

    /// Checks, behind a transaction pooler without a migrations URL, that this build's
    /// migrations were all applied.
    pub(super) async fn check_migrations(&self) -> StoreResult<()> {
        let rows: StoreResult<Vec<(i64,)>> = self
            .fetch_all(self::APPLIED_MIGRATIONS, &[], On::Pool)
            .await;
        let applied: Vec<i64> = match rows {
            Ok(rows) => rows.into_iter().map(|(version,)| version).collect(),
            // No _sqlx_migrations table: nothing was ever migrated.
            Err(StoreError::Internal(detail)) if detail.contains("_sqlx_migrations") => Vec::new(),
            Err(other) => return Err(other),
        };
        let missing: Vec<String> = MIGRATOR
            .iter()
            .filter(|m| !applied.contains(&m.version))
            .map(|m| format!("{} {}", m.version, m.description))
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(StoreError::Unavailable(format!(
                "the database lacks migrations {}; migrations take a session advisory lock, \
                 which a transaction pooler cannot hold: run `idempotency-ledger migrate \
                 --database-url <a direct URL>` once, or give the server \
                 --migrations-database-url",
                missing.join(", ")
            )))
        }
    }

    /// With `--postgres-pooler none`, refuses a store whose connections share server
    /// sessions: a value set on one connection must never show on another.
    pub(super) async fn check_sessions_are_ours(&self) -> StoreResult<()> {
        // Two connections of their own (not the pool's, which may hold only one), opened as
        // the pool opens its.
        let at = format!("checking the sessions of {}", self.describe());
        let connect = || async {
            self.connect_once(&self.connect)
                .await
                .map_err(|e| StoreError::from_opening(e, StoreError::from_postgres).context(&at))
        };
        let mut first = connect().await?;
        let mut second = connect().await?;
        let seen: Result<String, sqlx::Error> = async {
            sqlx::raw_sql(self::SESSION_PROBE_SET)
                .execute(&mut first)
                .await?;
            let row = sqlx::raw_sql(self::SESSION_PROBE_GET)
                .fetch_one(&mut second)
                .await?;
            sqlx::raw_sql(self::SESSION_PROBE_RESET)
                .execute(&mut first)
                .await?;
            sqlx::Row::try_get::<String, _>(&row, 0)
        }
        .await;
        let _ = sqlx::Connection::close(first).await;
        let _ = sqlx::Connection::close(second).await;
        if seen.map_err(StoreError::from_postgres)? == "set-by-another-session" {
            return Err(StoreError::Misconfigured(format!(
                "the database URL ({}) reaches PostgreSQL through a pooler in transaction mode (a \
                 setting made on one connection showed on another): start the server with \
                 --postgres-pooler transaction",
                self.describe()
            )));
        }
        Ok(())
    }

    /// Logs, once migrated, whether the link to the database is encrypted (behind a pooler:
    /// the pooler's link to the database).
    pub(super) async fn log_encryption(&self) {
        let row: StoreResult<(bool, String)> = self
            .fetch_all(self::SESSION_SSL, &[], On::Pool)
            .await
            .and_then(|rows| {
                at_most_one(rows, "SESSION_SSL")?
                    .ok_or_else(|| StoreError::Internal("no pg_stat_ssl row".into()))
            });
        match row {
            Ok((encrypted, version)) => tracing::info!(
                encrypted,
                tls = version.as_str(),
                sslmode = ssl_mode_name(self.connect.get_ssl_mode()),
                link = if self.pooled {
                    "pooler to database"
                } else {
                    "server to database"
                },
                "store connection"
            ),
            Err(e) => tracing::debug!(error = %e, "cannot read the store connection's encryption"),
        }
    }

    /// Where the store connects, for logs: host, port, database and user, never a password.
    pub fn describe(&self) -> String {
        format!(
            "host={} port={} database={} user={}",
            self.connect.get_host(),
            self.connect.get_port(),
            self.connect.get_database().unwrap_or(""),
            self.connect.get_username()
        )
    }
}

/// An `sslmode` as libpq spells it.
pub(super) fn ssl_mode_name(mode: sqlx::postgres::PgSslMode) -> &'static str {
    use sqlx::postgres::PgSslMode as M;
    match mode {
        M::Disable => "disable",
        M::Allow => "allow",
        M::Prefer => "prefer",
        M::Require => "require",
        M::VerifyCa => "verify-ca",
        M::VerifyFull => "verify-full",
    }
}

/// The connection options a URL names, with the ledger's defaults: `application_name`
/// `idempotency-ledger` unless the URL names one, and no `extra_float_digits` startup
/// parameter (the ledger reads no floating-point values, and PgBouncer refuses startup
/// parameters it does not know).
pub(super) fn connect_options(url: &str) -> StoreResult<PgConnectOptions> {
    let options = PgConnectOptions::from_str(url)
        .map_err(|e| StoreError::Internal(format!("invalid PostgreSQL URL: {e}")))?
        .extra_float_digits(None);
    Ok(if options.get_application_name().is_some() {
        options
    } else {
        options.application_name("idempotency-ledger")
    })
}
