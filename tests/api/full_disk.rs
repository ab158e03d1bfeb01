//! The embedded store on a full disk: a small tmpfs (the test mounts it, so it needs root, as
//! CI runs; where it cannot mount, each test says so and skips, unless `FULL_DISK_REQUIRED=1`)
//! filled through the real server until writes fail. Every acknowledged claim and completion is
//! there afterwards, also after a restart; every refusal is RESOURCE_EXHAUSTED
//! `STORE_FULL`; reads keep answering and health says NOT_SERVING; once space is freed, writes
//! resume and health returns to SERVING without a restart. Once one request at a time, once
//! with many at once (the group-commit batch path).
//!
//! PostgreSQL's full disk (SQLSTATE 53100) is tested the same way in `postgres_full_disk`,
//! with the test database's tablespace on the tmpfs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotency_ledger::grpc::pb;
use idempotency_ledger::grpc::pb::ledger_service_client::LedgerServiceClient;
use rand::rngs::Xoshiro256PlusPlus as Rng;
use rand::{Rng as _, SeedableRng as _};
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::support::postgres::PgCluster;
use crate::support::{Backend, TestApp, TestDb, claim_req, reason, spawn_app_on, success};

/// A tmpfs of a few MiB mounted on a fresh directory, unmounted on drop.
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size`, or says why it cannot and returns `None`: mounting needs root
    /// (or CAP_SYS_ADMIN), which CI has and a developer's machine or a container may not. Set
    /// `FULL_DISK_REQUIRED=1` to make that a failure instead (where the full disk must be
    /// tested).
    pub fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().expect("temp dir");
        let out = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0777"),
                "tmpfs",
            ])
            .arg(dir.path())
            .output();
        let why = match out {
            Ok(out) if out.status.success() => return Some(Tmpfs { dir }),
            Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_string(),
            Err(e) => format!("cannot run mount: {e}"),
        };
        let message = format!(
            "cannot mount a {size} tmpfs, which needs root or CAP_SYS_ADMIN (CI runs as root): \
             {why}"
        );
        assert!(
            std::env::var_os("FULL_DISK_REQUIRED").is_none_or(|v| v != "1"),
            "FULL_DISK_REQUIRED=1: {message}"
        );
        eprintln!("SKIPPED: {message}");
        None
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a file of `bytes` that [`Tmpfs::free`] deletes: the space given back later.
    pub fn ballast(&self, bytes: usize) -> PathBuf {
        let path = self.path().join("ballast");
        std::fs::write(&path, vec![0x5a; bytes]).expect("write ballast");
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// What the server acknowledged: claims (key → token) and completions (key → result).
#[derive(Default)]
pub struct Acknowledged {
    pub claims: BTreeMap<String, String>,
    pub completions: BTreeMap<String, Vec<u8>>,
    pub refusals: usize,
}

/// 20 KiB of incompressible bytes.
fn result_bytes(rng: &mut Rng) -> Vec<u8> {
    (0..20 * 1024 / 8)
        .flat_map(|_| rng.next_u64().to_le_bytes())
        .collect()
}

/// A write refused for the full disk: RESOURCE_EXHAUSTED `STORE_FULL`, with a retry hint and a
/// message that says what to do. Anything else is a defect.
#[track_caller]
pub fn assert_store_full(status: &tonic::Status) {
    use tonic_types::StatusExt;
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(reason(status), "STORE_FULL", "{status:?}");
    assert!(
        status.message().contains("disk space"),
        "the message says why: {status:?}"
    );
    assert!(status.get_details_retry_info().is_some(), "{status:?}");
}

/// One worker: claims and completes with 20 KiB results until `stop_after` of its writes were
/// refused, recording what was acknowledged.
pub async fn fill(
    mut client: LedgerServiceClient<Channel>,
    worker: usize,
    stop_after: usize,
    ack: Arc<Mutex<Acknowledged>>,
) {
    let mut rng = Rng::seed_from_u64(worker as u64 + 1);
    let mut refused = 0;
    for i in 0.. {
        if refused >= stop_after {
            break;
        }
        assert!(i < 5000, "worker {worker}: the disk never filled");
        let args = format!(r#"{{"worker":{worker},"i":{i}}}"#);
        let claim = match client.claim(claim_req("run-fill", "upload", &args)).await {
            Ok(r) => r.into_inner(),
            Err(status) => {
                assert_store_full(&status);
                refused += 1;
                continue;
            }
        };
        assert_eq!(claim.outcome(), pb::Outcome::Claimed, "a fresh key");
        let key = claim.entry.expect("entry").key;
        ack.lock()
            .expect("ack")
            .claims
            .insert(key.clone(), claim.claim_token.clone());
        let result = result_bytes(&mut rng);
        match client
            .complete(success(&key, &claim.claim_token, &result))
            .await
        {
            Ok(_) => {
                ack.lock().expect("ack").completions.insert(key, result);
            }
            Err(status) => {
                assert_store_full(&status);
                refused += 1;
            }
        }
    }
    ack.lock().expect("ack").refusals += refused;
}

/// Every acknowledged completion reads SUCCEEDED with its result, and every acknowledged claim
/// not completed reads ATTEMPTING (its refused completion changed nothing).
pub async fn assert_all_there(app: &TestApp, ack: &Acknowledged, when: &str) {
    let mut client = app.client.clone();
    for (key, token) in &ack.claims {
        let entry = client
            .lookup(pb::LookupRequest {
                key: key.clone(),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("{when}: acknowledged claim {key} is gone: {e:?}"))
            .into_inner()
            .entry
            .expect("entry");
        assert_eq!(&entry.key, key);
        match ack.completions.get(key) {
            Some(result) => {
                assert_eq!(
                    entry.status(),
                    pb::Status::Succeeded,
                    "{when}: acknowledged completion of {key} was not stored"
                );
                assert_eq!(entry.result.as_ref(), result.as_slice(), "{when}: {key}");
            }
            None => assert_eq!(
                entry.status(),
                pb::Status::Attempting,
                "{when}: a refused completion of {key} (token {token}) changed it"
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_on_a_full_disk_one_request_at_a_time_loses_no_acknowledged_write() {
    let Some(tmpfs) = Tmpfs::mount("4m") else {
        return;
    };
    let url = format!("sqlite://{}", tmpfs.path().join("ledger.db").display());
    fill_free_and_restart(TestDb::existing(Backend::Sqlite, &url), &tmpfs, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_on_a_full_disk_many_requests_at_once_loses_no_acknowledged_write() {
    let Some(tmpfs) = Tmpfs::mount("4m") else {
        return;
    };
    let url = format!("sqlite://{}", tmpfs.path().join("ledger.db").display());
    fill_free_and_restart(TestDb::existing(Backend::Sqlite, &url), &tmpfs, 24).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_on_a_full_disk_many_requests_at_once_loses_no_acknowledged_write() {
    let Some(tmpfs) = Tmpfs::mount("6m") else {
        return;
    };
    let location = tmpfs.path().join("tablespace");
    std::fs::create_dir(&location).expect("mkdir");
    let url = PgCluster::shared().create_database_on(&location);
    fill_free_and_restart(TestDb::existing(Backend::Postgres, &url), &tmpfs, 24).await;
}

/// Fills the disk through a real server with `workers` clients at once, then checks what was
/// acknowledged while full, frees space, checks that writes resume, restarts, checks again.
async fn fill_free_and_restart(db: TestDb, tmpfs: &Tmpfs, workers: usize) {
    let ballast = tmpfs.ballast(1 << 20);
    let mut app = spawn_app_on(TestDb::existing(db.backend, &db.url), |_| {}).await;
    let ack = Arc::new(Mutex::new(Acknowledged::default()));
    let tasks: Vec<_> = (0..workers)
        .map(|worker| tokio::spawn(fill(app.client.clone(), worker, 3, ack.clone())))
        .collect();
    for task in tasks {
        task.await.expect("worker");
    }
    let ack = std::mem::take(&mut *ack.lock().expect("ack"));
    eprintln!(
        "{:?}, {workers} clients: {} claims and {} completions acknowledged, {} writes refused",
        db.backend,
        ack.claims.len(),
        ack.completions.len(),
        ack.refusals
    );
    assert!(
        ack.completions.len() >= 20,
        "only {} completions fit before the disk filled",
        ack.completions.len()
    );
    assert!(ack.refusals >= 3 * workers);

    // Full: reads keep answering, health says so.
    assert_all_there(&app, &ack, "while the disk is full").await;
    app.wait_for_health("", ServingStatus::NotServing, Duration::from_secs(10))
        .await;

    // Space comes back: health and writes recover on their own.
    std::fs::remove_file(&ballast).expect("free the ballast");
    app.wait_for_health("", ServingStatus::Serving, Duration::from_secs(15))
        .await;
    let mut client = app.client.clone();
    let claim = client
        .claim(claim_req("run-after", "upload", r#"{"after":true}"#))
        .await
        .expect("a claim once space is back")
        .into_inner();
    let key = claim.entry.expect("entry").key;
    client
        .complete(success(&key, &claim.claim_token, b"stored"))
        .await
        .expect("a completion once space is back");
    assert_all_there(&app, &ack, "once space is back").await;

    // And all of it survives a restart of the server.
    app.shutdown().await.expect("shutdown");
    drop(app);
    let app = spawn_app_on(db, |_| {}).await;
    assert_all_there(&app, &ack, "after a restart").await;
}
