//! The shipped defaults are what tests and servers start from, whatever the environment holds.

use idempotency_ledger::server::Settings;

#[test]
fn the_defaults_ignore_an_exported_database_url_and_ledger_settings() {
    // SAFETY: nextest runs each test in a process of its own, so no other thread reads the
    // environment meanwhile.
    unsafe {
        std::env::set_var("DATABASE_URL", "postgres://somebody@elsewhere/theirs");
        std::env::set_var("LEDGER_MAX_WAIT", "1s");
    }
    let defaults = Settings::defaults();
    assert_eq!(defaults.database_url, "sqlite://ledger.db");
    assert_eq!(defaults.max_wait, std::time::Duration::from_secs(30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_test_server_does_not_inherit_an_exported_setting() {
    // SAFETY: as above.
    unsafe {
        std::env::set_var("LEDGER_MAX_WAIT", "this is not a duration");
    }
    let db = crate::support::TestDb::new(crate::support::Backend::Sqlite);
    // With the variable, the binary would refuse to start.
    let server = crate::support::ServerProcess::start(&db.url, &[]).await;
    assert!(server.startup_log.contains("idempotency-ledger starting"));
}
