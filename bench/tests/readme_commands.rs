//! Every command line bench/README.md shows for the benchmark's binaries (`compare …`, `cargo
//! run -p ledger-bench … --bin NAME -- …`, `ledger-bench …`) parses with that binary's own
//! command line, so the page cannot drift from the flags.

use clap::Parser;
use ledger_bench::{compare, load, profile, soak};

/// The lines of the page's shell blocks (fenced as `sh`, `bash` or nothing; a `text` block
/// is a synopsis), with `\` continuations joined.
fn code_lines(text: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut in_block = false;
    let mut shell = false;
    let mut pending = String::new();
    for line in text.lines() {
        if let Some(language) = line.trim_start().strip_prefix("```") {
            in_block = !in_block;
            shell = in_block && matches!(language.trim(), "" | "sh" | "bash");
            continue;
        }
        if !shell {
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

/// Words of a command line, as the shell splits them (`#` after a blank starts a comment).
fn words(line: &str) -> Vec<String> {
    // A line inside a quoted argument that goes on over several lines (a grpcurl `-d '{…`)
    // does not split: its words are blanks apart.
    shlex::split(line).unwrap_or_else(|| line.split_whitespace().map(String::from).collect())
}

/// The page's commands of the benchmark's binaries, as (binary, arguments after its name).
fn commands(text: &str) -> Vec<(String, Vec<String>)> {
    let mut found = Vec::new();
    for line in code_lines(text) {
        let w = words(&line);
        match w.first().map(String::as_str) {
            Some(name @ ("compare" | "ledger-bench" | "soak" | "profile")) => {
                found.push((name.to_string(), w[1..].to_vec()));
            }
            Some("cargo") if w.iter().any(|a| a == "ledger-bench") => {
                let bin = w
                    .iter()
                    .skip_while(|a| *a != "--bin")
                    .nth(1)
                    .cloned()
                    .unwrap_or_else(|| "compare".to_string());
                let args = w
                    .iter()
                    .skip_while(|a| *a != "--")
                    .skip(1)
                    .cloned()
                    .collect();
                found.push((bin, args));
            }
            _ => {}
        }
    }
    found
}

fn parses(bin: &str, args: &[String]) -> Result<(), String> {
    let argv = std::iter::once(bin.to_string()).chain(args.iter().cloned());
    let result = match bin {
        "compare" => compare::Options::try_parse_from(argv).map(drop),
        "soak" => soak::Options::try_parse_from(argv).map(drop),
        "profile" => profile::Options::try_parse_from(argv).map(drop),
        "ledger-bench" => load::Args::try_parse_from(argv).map(drop),
        other => return Err(format!("no such binary: {other}")),
    };
    result.map_err(|e| e.to_string())
}

#[test]
fn every_command_the_benchmark_s_readme_shows_parses() {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("bench/README.md");
    let commands = commands(&page);
    for bin in ["compare", "soak", "profile"] {
        assert!(
            commands.iter().any(|(b, _)| b == bin),
            "the page shows no {bin} command: {commands:?}"
        );
    }
    for (bin, args) in &commands {
        if let Err(e) = parses(bin, args) {
            panic!("`{bin} {}` does not parse:\n{e}", args.join(" "));
        }
    }
}

#[test]
fn a_flag_the_binary_does_not_have_is_caught() {
    let page = "```sh\ncompare --smoke --no-such-flag\n```\n";
    let commands = commands(page);
    assert_eq!(commands.len(), 1);
    assert!(parses(&commands[0].0, &commands[0].1).is_err());
}
