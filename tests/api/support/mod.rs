//! Test support: throwaway databases and servers, a clock moved by hand, gRPC helpers.

#![allow(dead_code)]

/// Instantiates each listed test, an `async fn(Backend)`, once per backend, as
/// `sqlite::name` and `postgres::name`: a behaviour tested on one store only is not a
/// behaviour of the product.
macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() { super::$name(crate::support::Backend::Sqlite).await })*
        }
        mod postgres {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() { super::$name(crate::support::Backend::Postgres).await })*
        }
    };
}

/// As [`on_every_backend!`], and once more through PgBouncer in transaction mode, as
/// `pgbouncer::name`: what the storage conformance suite holds must also hold behind a pooler.
macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {
        on_every_backend!($($name),*);
        mod pgbouncer {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() { super::$name(crate::support::Backend::PgBouncer).await })*
        }
    };
}

pub mod app;
pub mod clusters;
pub mod pgbouncer;
pub mod postgres;
pub mod proxy;
pub mod typed;

pub use app::*;
