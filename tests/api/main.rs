//! Every integration test in one binary (one link, one shared PostgreSQL template): the storage
//! conformance suite run on SQLite and PostgreSQL, the gRPC API through a real tonic client,
//! tenants, health and shutdown, the operator's console over HTTP, the inspection commands (the
//! binary as a client), logs and traces (to a collector run by the tests), and concurrency
//! across connections and server processes.

#[macro_use]
mod support;

mod approval_time;
mod approvals;
mod approvals_grpc;
mod audit;
mod claim_within;
mod clocks;
mod commit_failures;
mod concurrency;
mod conformance;
mod connection_steps;
mod connections;
mod console;
mod contention;
mod docs;
mod failover;
mod faults;
mod fencing;
mod full_disk;
mod grpc_api;
mod ha_failover;
mod health;
mod help;
mod history;
mod inspect;
mod intent_window;
mod logs;
mod memory_budget;
mod metrics;
mod migrations;
mod no_panic;
mod operations;
mod pg_tls;
mod plans;
mod pooler;
mod predicates;
mod replays;
mod rotation;
mod security;
mod settings;
mod store_busy;
mod store_causes;
mod tasks;
mod tenants;
mod traces;
mod views;
mod waiting;
mod watch;
