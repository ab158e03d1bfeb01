//! Compiles `proto/idempotency/v1/ledger.proto` with protox (pure Rust, so a fresh machine needs
//! no protoc) and writes the descriptor set that the reflection service serves. (The
//! benchmark's floor service, `proto/bench/v1/floor.proto`, is compiled by `bench/build.rs`.)

use std::path::PathBuf;

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/idempotency/v1/ledger.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out_dir.join("ledger_descriptor.bin"), fds.encode_to_vec())?;
    // The error details are described to reflective clients only; tonic-types has their Rust
    // types.
    let details = "third_party/proto/google/rpc/error_details.proto";
    println!("cargo:rerun-if-changed={details}");
    let details_fds = protox::compile([details], ["third_party/proto"])?;
    std::fs::write(
        out_dir.join("error_details_descriptor.bin"),
        details_fds.encode_to_vec(),
    )?;
    tonic_prost_build::configure()
        // Results are opaque bytes end to end; `Bytes` avoids a copy per replay.
        .bytes(".idempotency.v1")
        // A request that does not decode is bad input (src/proto.rs, `codec`).
        .codec_path("crate::proto::codec::LedgerCodec")
        .compile_fds(fds)?;
    Ok(())
}
