//! The documentation against the code: every `idempotency-ledger` command line the README and
//! the guides show parses with the binary's own command line; docs/settings.md lists exactly
//! the flags `--help` prints, with their variables and defaults; docs/errors.md lists exactly
//! the reasons the server's code sends. (The grpcurl walk-throughs are run against a real server
//! by tests/readme_walkthrough.py.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use clap::{Args as _, CommandFactory as _, Parser as _};
use idempotency_ledger::cli::Cli;
use idempotency_ledger::cli::client::Connection;

const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// The pages whose commands are checked: the README, every page of docs/, the clients' and the
/// benchmark's READMEs.
fn pages() -> Vec<PathBuf> {
    let repo = Path::new(REPO);
    let mut pages = vec![
        repo.join("README.md"),
        repo.join("clients/python/README.md"),
        repo.join("clients/typescript/README.md"),
        repo.join("bench/README.md"),
    ];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The lines of the page's fenced code blocks, with `\` continuations joined.
fn code_lines(text: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut in_block = false;
    let mut pending = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if !in_block {
            continue;
        }
        if let Some(head) = line.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(line);
        lines.push(std::mem::take(&mut pending));
    }
    lines
}

/// Words of a shell command line, as the shell splits them (`#` after a blank starts a
/// comment).
fn shell_words(line: &str) -> Vec<String> {
    // A line inside a quoted argument that goes on over several lines (a grpcurl `-d '{…`)
    // does not split: its words are blanks apart.
    shlex::split(line).unwrap_or_else(|| line.split_whitespace().map(String::from).collect())
}

/// The `idempotency-ledger` command lines of a page, as words after the binary's name:
/// `idempotency-ledger ARGS`, `$ idempotency-ledger ARGS`, with variables set before it
/// (`LEDGER_TOKEN=x idempotency-ledger ...`) or after another command (`unset X; ...`), and
/// `cargo run --release -- ARGS`.
fn commands(text: &str) -> Vec<(String, Vec<String>)> {
    let mut found = Vec::new();
    for line in code_lines(text) {
        let line = line.trim_start().trim_start_matches("$ ");
        let line = line.rsplit("; ").next().unwrap_or(line);
        // A command ends at an unquoted operator (`&`, `|`, `&&`, `||`).
        let words: Vec<String> = shell_words(line)
            .into_iter()
            .take_while(|w| !matches!(w.as_str(), "&" | "|" | "&&" | "||"))
            .collect();
        let mut rest = words
            .iter()
            .skip_while(|w| w.contains('=') && !w.starts_with('-'))
            .peekable();
        let args: Vec<String> = match rest.peek().map(|w| w.as_str()) {
            Some("idempotency-ledger") => rest.skip(1).cloned().collect(),
            Some("cargo") if words.windows(2).any(|w| w == ["run", "--release"]) => words
                .iter()
                .skip_while(|w| *w != "--")
                .skip(1)
                .cloned()
                .collect(),
            _ => continue,
        };
        found.push((line.to_string(), args));
    }
    found
}

#[test]
fn every_documented_command_line_parses_with_the_binarys_command_line() {
    let mut checked = 0;
    let mut broken = Vec::new();
    for page in pages() {
        for (line, args) in commands(&read(&page)) {
            let argv = std::iter::once("idempotency-ledger".to_string()).chain(args);
            if let Err(e) = Cli::try_parse_from(argv) {
                broken.push(format!("{}: {line}\n{e}", page.display()));
            }
            checked += 1;
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n\n"));
    // 23 when written: the README's `cargo run`, the PostgreSQL, pooler and TLS examples, the
    // metrics endpoint's, the operator commands' sixteen, and the Python client's server.
    assert!(
        checked >= 20,
        "only {checked} command lines found: is the scanner still right?"
    );
}

#[test]
fn the_command_scanner_finds_the_forms_the_pages_use() {
    let page = "```sh\nidempotency-ledger --listen 0.0.0.0:1 \\\n  --max-wait 5s  # a comment\n\
                $ LEDGER_TOKEN=x idempotency-ledger entries --run 'a b' | head\n\
                idempotency-ledger &   # in the background\n\
                $ unset X; idempotency-ledger entry k-123456\n\
                cargo run --release -- --help\n```\nidempotency-ledger outside a block\n";
    let found: Vec<Vec<String>> = commands(page).into_iter().map(|(_, a)| a).collect();
    let words = |s: &[&str]| s.iter().map(|w| w.to_string()).collect::<Vec<_>>();
    assert_eq!(
        found,
        vec![
            words(&["--listen", "0.0.0.0:1", "--max-wait", "5s"]),
            words(&["entries", "--run", "a b"]),
            words(&[]),
            words(&["entry", "k-123456"]),
            words(&["--help"]),
        ]
    );
    // And a broken line is caught: a flag that does not exist.
    assert!(Cli::try_parse_from(["idempotency-ledger", "--no-such-flag", "1"]).is_err());
}

/// A documented flag: its variable's cell and its default's cell.
struct Row {
    env: String,
    default: String,
}

/// The table rows of `text` whose first cell is a backticked `--flag`, by section
/// (`## ` heading).
fn rows(text: &str) -> BTreeMap<String, BTreeMap<String, Row>> {
    let mut sections: BTreeMap<String, BTreeMap<String, Row>> = BTreeMap::new();
    let mut section = String::new();
    for line in text.lines() {
        if let Some(title) = line.strip_prefix("## ") {
            section = title.to_string();
            continue;
        }
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
        let Some(flag) = cells
            .first()
            .and_then(|c| c.strip_prefix("`--"))
            .and_then(|c| c.strip_suffix('`'))
        else {
            continue;
        };
        assert!(cells.len() >= 3, "a row without a default: {line}");
        let row = Row {
            env: cells[1].to_string(),
            default: cells[2].to_string(),
        };
        let old = sections
            .entry(section.clone())
            .or_default()
            .insert(format!("--{flag}"), row);
        assert!(old.is_none(), "--{flag} is listed twice under {section}");
    }
    sections
}

/// What the page must say of each argument of `command`: (variable, default), by flag.
fn expected(command: &clap::Command) -> BTreeMap<String, (String, String)> {
    command
        .get_arguments()
        .filter_map(|arg| {
            let long = arg.get_long()?;
            if long == "help" || long == "version" {
                return None;
            }
            let env = arg
                .get_env()
                .map_or("none".to_string(), |e| format!("`{}`", e.to_string_lossy()));
            let default = arg
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(",");
            Some((format!("--{long}"), (env, default)))
        })
        .collect()
}

/// Differences between the documented rows and the command line's arguments.
fn compare(
    what: &str,
    rows: &BTreeMap<String, Row>,
    expected: &BTreeMap<String, (String, String)>,
) -> Vec<String> {
    let mut wrong = Vec::new();
    for flag in expected.keys().filter(|f| !rows.contains_key(*f)) {
        wrong.push(format!("{what}: {flag} is not documented"));
    }
    for flag in rows.keys().filter(|f| !expected.contains_key(*f)) {
        wrong.push(format!("{what}: {flag} is documented but does not exist"));
    }
    for (flag, (env, default)) in expected {
        let Some(row) = rows.get(flag) else { continue };
        if &row.env != env {
            wrong.push(format!(
                "{what}: {flag} reads {env}, the page says {}",
                row.env
            ));
        }
        let documented_default = row
            .default
            .strip_prefix('`')
            .and_then(|d| d.split('`').next());
        match (default.is_empty(), documented_default) {
            (true, None) => {}
            (true, Some(d)) => wrong.push(format!(
                "{what}: {flag} has no default, the page says `{d}`"
            )),
            (false, Some(d)) if d == default => {}
            (false, _) => wrong.push(format!(
                "{what}: {flag} defaults to `{default}`, the page says {}",
                row.default
            )),
        }
    }
    wrong
}

#[test]
fn the_settings_page_lists_every_flag_with_its_variable_and_default() {
    let page = read(&Path::new(REPO).join("docs/settings.md"));
    let sections = rows(&page);
    let connection_section = "The operator commands' connection flags";
    let gateway_section = "The MCP gateway (`idempotency-ledger mcp`)";
    let server_rows: BTreeMap<String, Row> = sections
        .iter()
        .filter(|(title, _)| {
            title.as_str() != connection_section && title.as_str() != gateway_section
        })
        .flat_map(|(_, rows)| rows.iter())
        .map(|(flag, row)| {
            (
                flag.clone(),
                Row {
                    env: row.env.clone(),
                    default: row.default.clone(),
                },
            )
        })
        .collect();
    let mut cli = Cli::command();
    cli.build();
    let serve = cli.find_subcommand("serve").expect("serve");
    let mut wrong = compare("serve", &server_rows, &expected(serve));
    // The same settings without a subcommand, and for migrate.
    let top = expected(&cli);
    if top != expected(serve) || expected(cli.find_subcommand("migrate").expect("migrate")) != top {
        wrong.push("idempotency-ledger, serve and migrate take different settings".into());
    }
    let connection = Connection::augment_args(clap::Command::new("x"));
    let connection = expected(&connection);
    wrong.extend(compare(
        "connection",
        sections
            .get(connection_section)
            .expect("the connection flags' section"),
        &connection,
    ));
    // Each operator command takes them all.
    for name in [
        "entries",
        "entry",
        "resolve",
        "renew",
        "acknowledge",
        "approvals",
        "approve",
        "deny",
    ] {
        let own = expected(cli.find_subcommand(name).expect(name));
        for flag in connection.keys().filter(|f| !own.contains_key(*f)) {
            wrong.push(format!("{name} lacks {flag}"));
        }
    }
    // The gateway's flags, in their own section.
    wrong.extend(compare(
        "mcp",
        sections
            .get(gateway_section)
            .expect("the gateway's section"),
        &expected(cli.find_subcommand("mcp").expect("mcp")),
    ));
    assert!(server_rows.len() > 40, "{} server rows", server_rows.len());
    assert!(wrong.is_empty(), "docs/settings.md:\n{}", wrong.join("\n"));
}

/// SCREAMING_SNAKE string literals (`"STORE_FULL"`) in `text`.
fn screaming_literals(text: &str) -> BTreeSet<String> {
    text.split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| {
            s.len() > 3
                && s.starts_with(|c: char| c.is_ascii_uppercase())
                && s.chars().all(|c| c.is_ascii_uppercase() || c == '_')
        })
        .map(str::to_string)
        .collect()
}

/// The reasons the server sends: one enum, `idempotency_ledger::reason::Reason`, which every
/// `ErrorInfo` the server builds takes its reason from ([`no_reason_is_spelled_outside_the_enum`]
/// holds that).
fn reasons_in_source() -> BTreeSet<String> {
    idempotency_ledger::reason::Reason::all()
        .map(|r| r.as_str().to_string())
        .collect()
}

/// Every `ErrorInfo` the server builds names a `Reason`: no `set_error_info` with a string
/// literal, and no `reason: "…"` field, anywhere in the service's sources (src/, crates/) but the operator commands (src/cli/,
/// whose refusals are their own and never cross the wire) and tests.
#[test]
fn no_reason_is_spelled_outside_the_enum() {
    fn files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("src/") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let src = Path::new(REPO).join("src");
    let mut all = Vec::new();
    for dir in ["src", "crates/core/src", "crates/stores/src"] {
        files(&Path::new(REPO).join(dir), &mut all);
    }
    let mut spelled = Vec::new();
    for path in all {
        if path.starts_with(src.join("cli")) || path.ends_with("reason.rs") {
            continue;
        }
        let text = read(&path);
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let squeezed: String = code.split_whitespace().collect::<Vec<_>>().join(" ");
        for (i, _) in squeezed.match_indices("set_error_info(") {
            if squeezed[i + "set_error_info(".len()..]
                .trim_start()
                .starts_with('"')
            {
                spelled.push(format!("{}: set_error_info(\"…", path.display()));
            }
        }
        for piece in squeezed.split("reason: \"").skip(1) {
            let literal = piece.split('"').next().unwrap_or_default();
            if !screaming_literals(&format!("\"{literal}\"")).is_empty() {
                spelled.push(format!("{}: reason: \"{literal}\"", path.display()));
            }
        }
    }
    assert!(
        spelled.is_empty(),
        "reasons spelled outside Reason: {spelled:?}"
    );
}

/// Both clients' typed errors (clients/parity.json, which each client's suite checks its own
/// classes against) catch only reasons the server sends.
#[test]
fn the_clients_typed_errors_name_only_reasons_the_server_sends() {
    fn reasons(value: &serde_json::Value, out: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) => {
                for (name, v) in map {
                    if name == "reason"
                        && let Some(text) = v.as_str()
                    {
                        out.push(text.to_string());
                    }
                    reasons(v, out);
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| reasons(v, out)),
            _ => {}
        }
    }
    let parity: serde_json::Value =
        serde_json::from_str(&read(&Path::new(REPO).join("clients/parity.json")))
            .expect("clients/parity.json is JSON");
    let mut named = Vec::new();
    reasons(&parity, &mut named);
    assert!(
        named.iter().any(|r| r == "STALE_CLAIM_TOKEN"),
        "the scan of parity.json found {named:?}"
    );
    let sent = reasons_in_source();
    let unknown: Vec<_> = named.iter().filter(|r| !sent.contains(*r)).collect();
    assert!(
        unknown.is_empty(),
        "clients/parity.json names reasons the server never sends: {unknown:?}"
    );
}

#[test]
fn the_errors_page_lists_exactly_the_reasons_the_server_sends() {
    let page = read(&Path::new(REPO).join("docs/errors.md"));
    let documented: BTreeSet<String> = page
        .lines()
        .filter(|l| l.starts_with("| `"))
        .filter_map(|l| l.trim_matches('|').split(" | ").nth(1))
        .flat_map(|cell| cell.split('`').skip(1).step_by(2).map(str::to_string))
        .collect();
    let sent = reasons_in_source();
    // The ones every reader meets.
    for reason in [
        "INVALID_FIELD",
        "DUPLICATE_MEMBER",
        "STALE_CLAIM_TOKEN",
        "MESSAGE_TOO_LARGE",
    ] {
        assert!(sent.contains(reason), "Reason misses {reason}: {sent:?}");
    }
    let undocumented: Vec<_> = sent.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&sent).collect();
    assert!(
        undocumented.is_empty() && stale.is_empty(),
        "docs/errors.md: not documented {undocumented:?}; documented but never sent {stale:?}"
    );
    // Each reason sits in the row of the gRPC code and the console status the server's one
    // error table gives it.
    for line in page.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").collect();
        let code = cells[0].trim().trim_matches('`');
        let http: u16 = cells[2]
            .trim()
            .parse()
            .expect("the console column is a status");
        for reason in cells[1].split('`').skip(1).step_by(2) {
            let face = idempotency_ledger::reason::Reason::from_wire(reason)
                .unwrap_or_else(|| panic!("{reason} is not a reason"))
                .face();
            assert_eq!(
                (code, http),
                (face.grpc.as_str(), face.http),
                "docs/errors.md's row of {reason}"
            );
        }
    }
}

/// behaviour.md's table of what a caller does with each code puts each reason it names under
/// the code the server's error table sends it with.
#[test]
fn the_behaviour_pages_error_table_puts_each_reason_under_its_code() {
    let page = read(&Path::new(REPO).join("docs/behaviour.md"));
    let table = page
        .split("| code | reasons | what to do |")
        .nth(1)
        .expect("behaviour.md has its table of codes");
    let mut checked = 0;
    for line in table.lines().skip(2).take_while(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").collect();
        let code = cells[0].trim().trim_matches('`');
        for word in cells[1].split('`').skip(1).step_by(2) {
            if let Some(reason) = idempotency_ledger::reason::Reason::from_wire(word) {
                assert_eq!(
                    code,
                    reason.face().grpc.as_str(),
                    "behaviour.md lists {word} under {code}"
                );
                checked += 1;
            }
        }
    }
    assert!(
        checked >= 25,
        "only {checked} reasons in behaviour.md's table"
    );
}
