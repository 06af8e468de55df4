//! The README's two commands: the section "The two commands" names exactly
//! `examples/demo.sh` and `tests/run`, both exist and are executable, and CI runs the
//! same test script.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `sh` code blocks of the README section headed `## The two commands`.
fn two_commands_blocks(readme: &str) -> Vec<String> {
    let start = readme.find("## The two commands").expect("README has a section `## The two commands`");
    let section = &readme[start + 2..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let mut blocks = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in section.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```sh") => current = Some(Vec::new()),
            (Some(lines), "```") => {
                blocks.push(lines.join("\n"));
                current = None;
            }
            (Some(lines), l) => lines.push(l),
            (None, _) => {}
        }
    }
    assert!(current.is_none(), "unterminated code block in the README's two commands");
    blocks
}

#[test]
fn readme_names_exactly_the_two_commands() {
    let readme = std::fs::read_to_string(workspace().join("README.md")).expect("read README.md");
    assert_eq!(two_commands_blocks(&readme), ["examples/demo.sh", "tests/run"]);
}

#[test]
fn both_commands_are_executable_scripts() {
    for script in ["examples/demo.sh", "tests/run"] {
        let path = workspace().join(script);
        let meta = std::fs::metadata(&path).unwrap_or_else(|e| panic!("{script}: {e}"));
        assert!(meta.is_file(), "{script} is not a file");
        assert_eq!(meta.permissions().mode() & 0o111, 0o111, "{script} is not executable by all");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{script}: {e}"));
        assert!(text.starts_with("#!/usr/bin/env bash\n"), "{script} has no bash shebang");
    }
}

#[test]
fn scripts_do_their_own_setup_and_ci_runs_the_test_script() {
    let read = |p: &str| std::fs::read_to_string(workspace().join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
    let demo = read("examples/demo.sh");
    assert!(demo.contains("rustup target add wasm32-wasip2"), "demo.sh must add the wasm target");
    let run = read("tests/run");
    for needle in
        ["rustup target add wasm32-wasip2", "apt-get update", "wasmtime-cli@", "cargo nextest run --workspace"]
    {
        assert!(run.contains(needle), "tests/run lacks `{needle}`");
    }
    // The pinned CLI is the version of the wasmtime library the runner embeds.
    let host = read("host/Cargo.toml");
    let lib_major = host
        .lines()
        .find_map(|l| l.strip_prefix("wasmtime = { version = \""))
        .and_then(|v| v.split('"').next())
        .expect("host/Cargo.toml depends on wasmtime");
    let cli =
        run.lines().find_map(|l| l.strip_prefix("WASMTIME_CLI_VERSION=")).expect("tests/run pins WASMTIME_CLI_VERSION");
    assert!(cli.starts_with(&format!("{lib_major}.")), "wasmtime CLI {cli} vs library {lib_major}");
    let ci = read(".ci/run");
    assert!(ci.lines().any(|l| l.trim() == "tests/run"), ".ci/run must run tests/run");
}
