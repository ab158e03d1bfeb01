//! The binary's help texts: `idempotency-ledger --help` and `serve --help` show how to run the
//! server (every setting), while the operator's commands, clients of a running server, show
//! only their own flags. Run as a user runs them: the real binary.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::support::{Backend, ServerProcess, TestDb};

/// The commands that are clients of a running server, and a flag each has of its own.
const OPERATOR_COMMANDS: [(&str, &str); 4] = [
    ("entries", "--run"),
    ("entry", "--search-limit"),
    ("resolve", "--succeeded"),
    ("renew", "--claim-token"),
];

/// What `idempotency-ledger ARGS` prints on stdout; it must exit 0.
async fn help(args: &[&str]) -> String {
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        crate::support::ledger_command().args(args).output(),
    )
    .await
    .expect("help within 20 s")
    .expect("run idempotency-ledger");
    assert!(out.status.success(), "{args:?}: {out:?}");
    String::from_utf8(out.stdout).expect("UTF-8 help")
}

/// The long flags a help text lists: the options' own lines (indented 2 or 6 columns, where a
/// description is indented 10), without `--help` and `--version`.
fn flags(help: &str) -> BTreeSet<String> {
    help.lines()
        .filter_map(|line| {
            let option = line.trim_start();
            let indent = line.len() - option.len();
            if !(indent == 2 || indent == 6) || !option.starts_with('-') {
                return None;
            }
            // `-h, --help`: the long name follows the short one.
            let long = option.split_once(", ").map_or(option, |(_, long)| long);
            let name = long.split([' ', '=', '<']).next()?;
            name.starts_with("--").then(|| name.to_string())
        })
        .filter(|name| name != "--help" && name != "--version")
        .collect()
}

#[tokio::test]
async fn the_top_level_help_shows_how_to_run_the_server_with_every_setting() {
    let top = help(&["--help"]).await;
    let serve = help(&["serve", "--help"]).await;
    let settings = flags(&serve);
    // About fifty settings, the first of which every deployment sets.
    assert!(settings.len() > 40, "{settings:?}");
    for flag in [
        "--listen",
        "--database-url",
        "--auth-tokens-file",
        "--tls-cert",
    ] {
        assert!(
            settings.contains(flag),
            "serve --help lacks {flag}:\n{serve}"
        );
    }
    assert_eq!(
        flags(&top),
        settings,
        "idempotency-ledger --help shows the settings of serve, its default:\n{top}"
    );
    assert!(top.contains("Server settings (serve)"), "{top}");
    for (command, _) in OPERATOR_COMMANDS {
        assert!(top.contains(command), "the {command} subcommand:\n{top}");
    }
}

#[tokio::test]
async fn the_operator_commands_help_shows_only_their_own_flags() {
    let settings = flags(&help(&["serve", "--help"]).await);
    for (command, own) in OPERATOR_COMMANDS {
        let text = help(&[command, "--help"]).await;
        let shown = flags(&text);
        assert!(
            shown.contains(own) && shown.contains("--server") && shown.contains("--token"),
            "{command} --help lacks its own flags:\n{text}"
        );
        let foreign: Vec<_> = shown.intersection(&settings).collect();
        assert!(
            foreign.is_empty(),
            "{command} --help shows the server's settings {foreign:?}:\n{text}"
        );
        assert!(shown.len() < 20, "{command}: {shown:?}");
    }
}

#[tokio::test]
async fn an_operator_command_refuses_a_server_setting() {
    let out = crate::support::ledger_command()
        .args(["entries", "--listen", "127.0.0.1:0"])
        .output()
        .await
        .expect("run entries");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("unexpected argument '--listen'"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_runs_with_serve_named_and_without_it() {
    let db = TestDb::new(Backend::Sqlite);
    // Without a subcommand (as every other test starts it), then with `serve` named first.
    for named in [false, true] {
        let server = ServerProcess::start_with(&db.url, 0, &[], |command| {
            if named {
                command.arg("serve");
            }
        })
        .await;
        assert!(
            server.startup_log.contains("idempotency-ledger starting"),
            "{}",
            server.startup_log
        );
        server.terminate();
    }
}
