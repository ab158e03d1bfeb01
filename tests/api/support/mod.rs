//! Test support: throwaway databases and servers, a clock moved by hand, gRPC helpers.

#![allow(dead_code)]

pub mod app;
pub mod postgres;
pub mod proxy;

pub use app::*;
