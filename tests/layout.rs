//! The service's dependency rules. Between its crates, cargo holds them: `ledger-core` (the
//! domain and the use cases) has neither tonic, hyper nor sqlx, nor the crates above it, in its
//! manifest, and `ledger-stores` neither tonic nor hyper nor the server, so an import upward
//! does not compile (the tests here check the manifests' dependency trees). Within a crate,
//! as its `lib.rs` states: a module uses only the modules of lower layers. Read from the source
//! (code, not comments), paths in grouped imports (`use crate::{grpc, storage::Store}`)
//! included, so a new `use crate::…` that points upward fails here with the file and line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A crate of the service whose modules are layered: its sources and its layers, lowest first;
/// a module may use any module of a lower layer, none of its own or a higher one.
struct Floor {
    src: &'static str,
    layers: &'static [&'static [&'static str]],
}

/// The core and the server (the stores' modules are one layer).
const FLOORS: &[Floor] = &[
    Floor {
        src: "crates/core/src",
        layers: &[
            &["reason"],
            &["domain", "defaults"],
            &["storage"],
            &["error"],
            &["ledger"],
        ],
    },
    Floor {
        src: "src",
        layers: &[
            &["proto", "connections"],
            &["observe", "credentials"],
            &["grpc"],
            &["console"],
            &["server"],
            &["mcp"],
            &["cli"],
        ],
    },
];

fn layer_of(floor: &Floor, module: &str) -> Option<usize> {
    floor
        .layers
        .iter()
        .position(|layer| layer.contains(&module))
}

/// The `.rs` files of the top-level module `name`: `src/name.rs` or everything in `src/name/`.
fn files_of(src: &Path, name: &str) -> Vec<PathBuf> {
    let file = src.join(format!("{name}.rs"));
    if file.is_file() {
        return vec![file];
    }
    let mut files = Vec::new();
    let mut dirs = vec![src.join(name)];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files
}

/// Every `crate::name` the code in `text` mentions (comments left out), with its line: the
/// first segment of each path, also of each path in a group, `use crate::{grpc, storage::{a,
/// b}};` naming `grpc` and `storage`, a group spread over lines as rustfmt writes it included.
fn crate_paths(text: &str) -> Vec<(usize, String)> {
    // Comments become blanks, so that offsets still give lines.
    let code: String = text
        .lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(offset) = code[from..].find("crate::") {
        let at = from + offset;
        let after = at + "crate::".len();
        from = after;
        // `$crate::` in a macro is the crate too; `foo_crate::` is not.
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        if code[after..].starts_with('{') {
            for (item_at, name) in group_items(&code, after) {
                found.push((line_of(item_at), name));
            }
        } else {
            found.push((line_of(at), identifier(&code[after..])));
        }
    }
    found
}

/// The identifier at the start of `text`.
fn identifier(text: &str) -> String {
    text.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// The first segment of each item of the `{…}` group opening at `code[open]`, with its offset
/// (`self` left out: it names the crate root, not a module).
fn group_items(code: &str, open: usize) -> Vec<(usize, String)> {
    let mut items = Vec::new();
    let mut depth = 0;
    let mut item_start = true;
    for (i, c) in code[open..].char_indices() {
        let at = open + i;
        match c {
            '{' => {
                depth += 1;
                if depth == 1 {
                    item_start = true;
                }
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => item_start = true,
            c if item_start && depth == 1 && !c.is_whitespace() => {
                item_start = false;
                let name = identifier(&code[at..]);
                if !name.is_empty() && name != "self" {
                    items.push((at, name));
                }
            }
            _ => {}
        }
    }
    items
}

/// The top-level modules a `lib.rs` declares in files of their own (`pub mod name;`).
fn declared_modules(src: &Path) -> Vec<String> {
    std::fs::read_to_string(src.join("lib.rs"))
        .expect("lib.rs")
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod ")?.strip_suffix(';'))
        .map(str::to_string)
        .collect()
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn every_module_has_a_layer() {
    for floor in FLOORS {
        for module in declared_modules(&root().join(floor.src)) {
            assert!(
                layer_of(floor, &module).is_some(),
                "{module} of {} is in no layer: add it to FLOORS here and to the rule in its \
                 lib.rs",
                floor.src
            );
        }
    }
}

#[test]
fn no_module_uses_its_own_layer_or_a_higher_one() {
    let mut upward: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for floor in FLOORS {
        let src = root().join(floor.src);
        for module in declared_modules(&src) {
            let own = layer_of(floor, &module).expect("every module has a layer");
            for file in files_of(&src, &module) {
                let text = std::fs::read_to_string(&file).expect("read");
                for (line, used) in crate_paths(&text) {
                    if used == module {
                        continue;
                    }
                    let Some(theirs) = layer_of(floor, &used) else {
                        continue; // a lower crate's module, re-exported (crate::domain)
                    };
                    if theirs >= own {
                        upward.entry(module.clone()).or_default().push(format!(
                            "{}:{line} uses crate::{used}",
                            file.strip_prefix(root()).expect("under the root").display()
                        ));
                    }
                }
            }
        }
    }
    assert!(upward.is_empty(), "imports against the rule: {upward:#?}");
}

/// The packages `package` depends on (normal edges, transitively), one name per line.
fn dependencies(package: &str) -> String {
    let out = std::process::Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "--edges",
            "normal",
            "--prefix",
            "none",
            "--format",
            "{p}",
            "--package",
            package,
        ])
        .current_dir(root())
        .output()
        .expect("cargo tree");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether `tree` (of [`dependencies`]) holds the package `name`.
fn has(tree: &str, name: &str) -> bool {
    tree.lines()
        .any(|line| line.split_whitespace().next() == Some(name))
}

#[test]
fn the_core_and_the_stores_cannot_import_the_layers_above_them() {
    // What a crate's manifest does not name, its code cannot import: so these hold the layers.
    let core = dependencies("ledger-core");
    assert!(has(&core, "serde_json"), "a real dependency tree:\n{core}");
    for above in [
        "tonic",
        "hyper",
        "axum",
        "sqlx",
        "prost",
        "ledger-stores",
        "idempotency-ledger",
    ] {
        assert!(
            !has(&core, above),
            "ledger-core depends on {above}:\n{core}"
        );
    }
    let stores = dependencies("ledger-stores");
    assert!(
        has(&stores, "sqlx") && has(&stores, "ledger-core"),
        "{stores}"
    );
    for above in ["tonic", "hyper", "axum", "prost", "idempotency-ledger"] {
        assert!(
            !has(&stores, above),
            "ledger-stores depends on {above}:\n{stores}"
        );
    }
    // The check reads names, not substrings: sqlx-core is not sqlx.
    assert!(!has("sqlx-core v0.9.0\n", "sqlx"));
}

#[test]
fn each_rule_is_the_one_its_lib_rs_states() {
    for floor in FLOORS {
        let rule = floor
            .layers
            .iter()
            .map(|layer| layer.join(", "))
            .collect::<Vec<_>>()
            .join(" ← ");
        let lib = std::fs::read_to_string(root().join(floor.src).join("lib.rs")).expect("lib.rs");
        assert!(
            lib.contains(&format!("`{rule}`")),
            "{}/lib.rs must state the rule `{rule}`",
            floor.src
        );
    }
}

#[test]
fn the_checker_sees_an_upward_import() {
    // The check above passes trivially if it finds nothing; it does find these.
    let text = "use crate::server::Settings; // crate::cli in a comment\n\
                fn f() { $crate::storage::x(); my_crate::grpc::y(); }\n";
    assert_eq!(
        crate_paths(text),
        vec![(1, "server".to_string()), (2, "storage".to_string())]
    );
}

#[test]
fn the_checker_reads_grouped_imports_nested_and_over_several_lines() {
    let text = "use crate::{grpc, storage::Store};\n\
                use crate::{\n    \
                    ledger::{Ledger, Limits},\n    \
                    // crate::{cli} in a comment\n    \
                    observe::{metrics::{Metrics, Kind}, layer},\n    \
                    self,\n    \
                    server\n\
                };\n\
                fn f() { crate::{}; }\n";
    assert_eq!(
        crate_paths(text),
        vec![
            (1, "grpc".to_string()),
            (1, "storage".to_string()),
            (3, "ledger".to_string()),
            (5, "observe".to_string()),
            (7, "server".to_string()),
        ]
    );
}

#[test]
fn the_service_depends_on_no_benchmark_crate() {
    // ledger-bench's histograms belong to the benchmark's own crate (bench/).
    let tree = dependencies("idempotency-ledger");
    assert!(has(&tree, "tonic"), "a real dependency tree:\n{tree}");
    assert!(!has(&tree, "hdrhistogram"), "{tree}");
}

#[test]
fn a_plain_install_of_the_service_builds_no_benchmark_binary() {
    // `cargo install --path . ` installs every binary of the service's package: the load
    // generator and the floor live in the benchmark's crate (bench/), not here.
    let out = std::process::Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--offline",
            "--no-deps",
            "--format-version",
            "1",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata");
    let packages = metadata["packages"].as_array().expect("packages");
    let binaries_of = |name: &str| -> Vec<String> {
        let package = packages
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no package {name} in the workspace"));
        package["targets"]
            .as_array()
            .expect("targets")
            .iter()
            .filter(|t| {
                t["kind"]
                    .as_array()
                    .is_some_and(|k| k.iter().any(|k| k == "bin"))
            })
            .map(|t| t["name"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    assert_eq!(binaries_of("idempotency-ledger"), ["idempotency-ledger"]);
    let bench = binaries_of("ledger-bench");
    for binary in ["ledger-bench", "ledger-floor", "compare", "soak"] {
        assert!(bench.iter().any(|b| b == binary), "{binary} in {bench:?}");
    }
}

/// The repository's shell scripts (a `.sh` name, or a `#!` line naming sh or bash), outside
/// build output, dependencies and git's own directory.
fn shell_scripts(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if !matches!(
                name.as_str(),
                "target" | "node_modules" | ".git" | ".venv" | "venv"
            ) {
                shell_scripts(&path, found);
            }
            continue;
        }
        let first_line = std::fs::read(&path)
            .ok()
            .and_then(|bytes| {
                let line = bytes.split(|b| *b == b'\n').next()?.to_vec();
                String::from_utf8(line).ok()
            })
            .unwrap_or_default();
        let shebang = first_line.starts_with("#!")
            && (first_line.ends_with("sh") || first_line.contains("bash"));
        if name.ends_with(".sh") || shebang {
            found.push(path);
        }
    }
}

#[test]
fn no_shell_script_in_the_repository_is_over_three_hundred_lines() {
    // Logic longer than that belongs in a language with types and tests: the benchmark's
    // driver was 1,057 lines of bash before it became bench/src/compare/.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut scripts = Vec::new();
    shell_scripts(root, &mut scripts);
    assert!(
        scripts.iter().any(|s| s.ends_with("scripts/test")),
        "the walk finds the scripts: {scripts:?}"
    );
    let long: Vec<String> = scripts
        .iter()
        .filter_map(|s| {
            let lines = std::fs::read_to_string(s).ok()?.lines().count();
            (lines > 300).then(|| format!("{} ({lines} lines)", s.display()))
        })
        .collect();
    assert!(long.is_empty(), "scripts over 300 lines: {long:?}");
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a source directory") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

#[test]
fn no_source_file_is_over_six_hundred_lines_before_its_tests() {
    // A reader holds a file whole; the tests at its end are read apart.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in [
        "src",
        "crates/core/src",
        "crates/stores/src",
        "bench/src",
        "testkit/src",
    ] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(
        files.len() > 50,
        "the walk finds the sources: {}",
        files.len()
    );
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let text = std::fs::read_to_string(f).ok()?;
            let lines = text
                .lines()
                .take_while(|l| !l.starts_with("#[cfg(test)]"))
                .count();
            (lines > 600).then(|| format!("{} ({lines} lines)", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "source files over 600 lines: {long:?}");
}

#[test]
fn the_benchmark_readme_is_the_method_and_the_record_in_at_most_three_hundred_lines() {
    // The history of runs and measurements lives in bench/HISTORY.md, which the code's
    // comments cite for figures.
    let bench = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench");
    let lines = std::fs::read_to_string(bench.join("README.md"))
        .expect("bench/README.md")
        .lines()
        .count();
    assert!(lines <= 300, "bench/README.md has {lines} lines");
    let history = std::fs::read_to_string(bench.join("HISTORY.md")).expect("bench/HISTORY.md");
    for heading in [
        "The claim path, profiled",
        "Optimized across crates",
        "Memory: no transparent huge pages",
    ] {
        assert!(
            history
                .lines()
                .any(|l| l.starts_with('#') && l.ends_with(heading)),
            "bench/HISTORY.md has no heading {heading:?}, which the code cites"
        );
    }
}

#[test]
fn every_test_starts_the_binary_through_the_one_helper() {
    // `tests/api/support/app.rs`'s `ledger_command` clears the caller's DATABASE_URL and
    // LEDGER_* variables: a test naming the binary itself would let them through.
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let helper = tests.join("api").join("support").join("app.rs");
    let mut named = Vec::new();
    let mut in_helper = 0;
    let mut dirs = vec![tests.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read");
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                if code.contains(concat!("CARGO_BIN_EXE", "_")) {
                    if path == helper {
                        in_helper += 1;
                    } else {
                        named.push(format!(
                            "{}:{}: {}",
                            path.strip_prefix(&tests).expect("under tests").display(),
                            n + 1,
                            line.trim()
                        ));
                    }
                }
            }
        }
    }
    assert_eq!(in_helper, 1, "the helper names the binary once");
    assert!(
        named.is_empty(),
        "start the binary with crate::support::ledger_command(): {named:#?}"
    );
}

/// The functions of `text` (code before its `#[cfg(test)]`) longer than `most` lines, each as
/// `name (lines)`: from a line opening a `fn` to the first line after it that closes a block
/// at the same indentation (rustfmt's layout). A declaration without a body has none.
fn long_functions(text: &str, most: usize) -> Vec<String> {
    let lines: Vec<&str> = text
        .lines()
        .take_while(|l| !l.starts_with("#[cfg(test)]"))
        .collect();
    let mut long = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let code = line.trim_start();
        let indent = line.len() - code.len();
        let opens = code
            .split('(')
            .next()
            .unwrap_or("")
            .split_whitespace()
            .skip_while(|w| *w != "fn")
            .nth(1)
            .map(|name| name.split('<').next().unwrap_or(name).to_string());
        let Some(name) = opens else { continue };
        // A comment, or a body closed on its own line (`fn f() -> u8 { 1 }`).
        if code.starts_with("//") || !code.contains("fn ") || code.ends_with('}') {
            continue;
        }
        let close = format!("{}}}", " ".repeat(indent));
        let end = lines[i..]
            .iter()
            .position(|l| l.ends_with(';') && l.len() - l.trim_start().len() == indent)
            .into_iter()
            .chain(lines[i..].iter().position(|l| *l == close))
            .min();
        // A declaration (`fn f();`) ends before any body could.
        if let Some(end) = end
            && lines[i + end] == close
            && end + 1 > most
        {
            long.push(format!("{name} ({} lines)", end + 1));
        }
    }
    long
}

#[test]
fn no_function_is_over_a_hundred_lines_before_the_tests() {
    let mut files = Vec::new();
    for dir in [
        "src",
        "crates/core/src",
        "crates/stores/src",
        "bench/src",
        "testkit/src",
    ] {
        rust_files(&root().join(dir), &mut files);
    }
    let long: Vec<String> = files
        .iter()
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).expect("read");
            long_functions(&text, 100)
                .into_iter()
                .map(move |l| format!("{}: {l}", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "functions over 100 lines: {long:#?}");
    // The scanner measures what it should.
    let body = "        let x = 1;\n".repeat(100);
    let text = format!(
        "impl A {{\n    pub async fn big<T>(a: T) {{\n{body}    }}\n\n    fn small() {{}}\n    fn one() -> u8 {{ 1 }}\n    fn declared();\n}}\n"
    );
    assert_eq!(
        long_functions(&text, 100),
        vec!["big (102 lines)".to_string()]
    );
    assert!(long_functions(&text, 102).is_empty());
}
