//! What the settings build: the ledger's limits, the metrics', the console's and the pool's
//! options, the console's address, how waiters are woken, and the check that the settings
//! agree with each other ([`Settings::validate`]).

use std::net::SocketAddr;

use super::{Settings, StoreArguments, Wakeup};
use crate::console::{self, Listen};
use crate::defaults;
use crate::domain::canonical::JsonLimits;
use crate::domain::redact::{self, ArgumentsPolicy, Redaction};
use crate::ledger::Limits;
use crate::observe::MetricsOptions;
use crate::storage::{PoolOptions, Pooler};

impl Settings {
    /// The request limits these settings define.
    pub fn limits(&self) -> Limits {
        Limits {
            default_lease: self.default_lease,
            max_lease: self.max_lease,
            default_retention: self.default_retention,
            max_retention: self.max_retention,
            max_wait: self.max_wait,
            json: JsonLimits {
                max_bytes: self.max_arguments_bytes,
                max_depth: self.max_json_depth,
            },
            max_result_bytes: self.max_result_bytes,
            arguments: match self.store_arguments {
                StoreArguments::None => ArgumentsPolicy::None,
                StoreArguments::Full => ArgumentsPolicy::Full,
                StoreArguments::Redacted => ArgumentsPolicy::Redacted(Redaction::new(
                    redact::DEFAULT_FIELDS
                        .iter()
                        .copied()
                        .chain(self.redact_fields.iter().map(String::as_str)),
                )),
            },
            approval_timeout: self.approval_timeout,
            approval_use_within: self.approval_use_within,
            list_default_page_size: defaults::LIST_DEFAULT_PAGE_SIZE,
            list_max_page_size: defaults::LIST_MAX_PAGE_SIZE,
            external_ref_prefix: self.external_ref_prefix.clone(),
            reconcile_lease: self.reconcile_lease,
            reconcile_grace: self.reconcile_grace,
            reconcile_default_limit: self.reconcile_default_limit,
            reconcile_max_limit: self.reconcile_max_limit,
            replay_memory_bytes: self.replay_memory_bytes,
            wait_poll_interval: match self.wakeup() {
                Wakeup::Listen => defaults::LISTEN_SAFETY_POLL.max(self.wait_poll_interval),
                Wakeup::Poll => self.wait_poll_interval,
            },
        }
    }

    /// The metrics' label and alarm settings.
    pub fn metrics_options(&self) -> MetricsOptions {
        MetricsOptions {
            max_tools: self.metrics_max_tools,
            alarm_window: self.replay_alarm_window,
            alarm_min_claims: self.replay_alarm_min_claims,
        }
    }

    /// Where the console listens: the address asked for, [`console::DEFAULT_LISTEN`] when
    /// none was, or nowhere (`None`) with `off`. The flag says whether the address was asked
    /// for (then it must bind) or is the default (then a port taken only leaves the console
    /// out).
    pub fn console_address(&self) -> Option<(SocketAddr, bool)> {
        match self.console_listen {
            Some(Listen::Off) => None,
            Some(Listen::At(addr)) => Some((addr, true)),
            None => match Listen::parse(console::DEFAULT_LISTEN) {
                Ok(Listen::At(addr)) => Some((addr, false)),
                _ => None,
            },
        }
    }

    /// The console's options.
    pub fn console_options(&self) -> console::Options {
        console::Options {
            hosts: self.console_hosts.clone(),
            session_idle: self.console_session_idle,
            max_result_bytes: self.max_result_bytes,
        }
    }

    /// How waiters learn of other servers' completions: as set, or what the pooler allows.
    pub fn wakeup(&self) -> Wakeup {
        match (self.wait_wakeup, self.postgres_pooler) {
            (Some(wakeup), _) => wakeup,
            (None, Pooler::Transaction) => Wakeup::Poll,
            (None, Pooler::None) => Wakeup::Listen,
        }
    }

    /// Whether this server should LISTEN for other servers' announcements.
    pub fn listens(&self) -> bool {
        self.wakeup() == Wakeup::Listen
    }

    /// The store's pool settings.
    pub fn pool(&self) -> PoolOptions {
        PoolOptions {
            max_connections: self.db_max_connections,
            acquire_timeout: self.db_acquire_timeout,
            write_batches: usize::from(self.db_write_batches),
            pooler: self.postgres_pooler,
            migrations_url: self.migrations_database_url.clone(),
            statement_timeout: self.db_statement_timeout,
            connect_timeout: self.db_connect_timeout,
        }
    }

    /// Checks the settings that clap cannot: defaults within their maxima.
    ///
    /// # Errors
    /// A message naming the inconsistent settings.
    pub fn validate(&self) -> Result<(), String> {
        if self.default_lease.is_zero() || self.default_lease > self.max_lease {
            return Err("--default-lease must be positive and at most --max-lease".into());
        }
        if self.default_retention.is_zero() || self.default_retention > self.max_retention {
            return Err("--default-retention must be positive and at most --max-retention".into());
        }
        if self.reconcile_default_limit == 0
            || self.reconcile_default_limit > self.reconcile_max_limit
        {
            return Err(
                "--reconcile-default-limit must be positive and at most --reconcile-max-limit"
                    .into(),
            );
        }
        if self.request_timeout <= self.max_wait {
            return Err("--request-timeout must be longer than --max-wait".into());
        }
        if self.tenant_rate_limit < 0.0 || self.tenant_rate_burst < 0.0 {
            return Err("--tenant-rate-limit and --tenant-rate-burst cannot be negative".into());
        }
        if self.prune_batch_size == 0 || self.wait_poll_interval.is_zero() {
            return Err("--prune-batch-size and --wait-poll-interval must be positive".into());
        }
        if self.metrics_refresh_interval.is_zero() || self.replay_alarm_window.is_zero() {
            return Err(
                "--metrics-refresh-interval and --replay-alarm-window must be positive".into(),
            );
        }
        if self.max_inflight_bytes == 0 {
            return Err("--max-inflight-bytes must be positive".into());
        }
        if self.max_json_depth == 0 || self.max_arguments_bytes == 0 {
            return Err("--max-json-depth and --max-arguments-bytes must be positive".into());
        }
        if self.postgres_pooler == Pooler::Transaction && self.wait_wakeup == Some(Wakeup::Listen) {
            return Err(
                "--wait-wakeup listen cannot work with --postgres-pooler transaction: a \
                 transaction pooler keeps no LISTEN between transactions; use --wait-wakeup poll"
                    .into(),
            );
        }
        if self.console_session_idle.is_zero() {
            return Err("--console-session-idle must be positive".into());
        }
        if self.db_connect_timeout.is_zero() {
            return Err("--db-connect-timeout must be positive".into());
        }
        if self.http2_keepalive_interval.is_zero() || self.http2_keepalive_timeout.is_zero() {
            return Err(
                "--http2-keepalive-interval and --http2-keepalive-timeout must be positive".into(),
            );
        }
        if self.connection_idle_timeout
            <= self.http2_keepalive_interval + self.http2_keepalive_timeout
        {
            return Err(
                "--connection-idle-timeout must be longer than --http2-keepalive-interval plus \
                 --http2-keepalive-timeout, or live clients waiting for a ping would be closed"
                    .into(),
            );
        }
        Ok(())
    }
}
