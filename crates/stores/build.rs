//! Rebuilds the crate when a migration is added or edited: `sqlx::migrate!` embeds the files
//! at compile time and cannot tell Cargo to watch the directory itself.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
