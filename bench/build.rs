//! Compiles the floor's service, `proto/bench/v1/floor.proto` (under the repository's `proto/`,
//! so `buf lint` covers it), with protox as the service's build.rs compiles the ledger's.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let floor = "../proto/bench/v1/floor.proto";
    println!("cargo:rerun-if-changed={floor}");
    tonic_prost_build::configure()
        // The payloads are filler: `Bytes` lets the floor answer without copying them.
        .bytes(".bench.v1")
        .compile_fds(protox::compile([floor], ["../proto"])?)?;
    Ok(())
}
