//! Runs every `tests/policy/*.case` through the real `wasmtime` CLI against the embedded
//! policy component and compares the printed WAVE result with the expectation.
//!
//! `UPDATE_POLICY_CASES=1` rewrites the expectations instead of comparing.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One parsed case file.
struct Case {
    /// Comment lines (kept when rewriting).
    comments: String,
    /// The WAVE invocation.
    call: String,
    /// The expected stdout, without the trailing newline.
    expect: String,
}

fn parse_case(text: &str) -> Result<Case, String> {
    let mut comments = String::new();
    let mut lines = text.lines();
    let call = loop {
        match lines.next() {
            Some(l) if l.starts_with('#') || l.trim().is_empty() => {
                comments.push_str(l);
                comments.push('\n');
            }
            Some(l) => match l.strip_prefix("call:") {
                Some(c) => break c.trim().to_owned(),
                None => return Err(format!("expected `call: <invocation>`, found {l:?}")),
            },
            None => return Err("no `call:` line".into()),
        }
    };
    match lines.next() {
        Some("expect:") => {}
        other => return Err(format!("expected `expect:` after `call:`, found {other:?}")),
    }
    let expect = lines.collect::<Vec<_>>().join("\n");
    Ok(Case { comments, call, expect })
}

/// The wasmtime CLI: `$WASMTIME`, else `wasmtime` on `PATH`, else `~/.cargo/bin/wasmtime`.
fn wasmtime() -> PathBuf {
    if let Some(w) = std::env::var_os("WASMTIME") {
        return PathBuf::from(w);
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join("wasmtime");
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    if let Some(home) = std::env::var_os("HOME") {
        let candidate = Path::new(&home).join(".cargo/bin/wasmtime");
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "the wasmtime CLI was not found (looked at $WASMTIME, PATH and ~/.cargo/bin/wasmtime); \
         install it (`cargo install wasmtime-cli`) or set WASMTIME=/path/to/wasmtime"
    );
}

fn run(wasmtime: &Path, wasm: &Path, call: &str) -> Result<String, String> {
    let out = Command::new(wasmtime)
        .args(["run", "-S", "cli=n", "--invoke", call])
        .arg(wasm)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", wasmtime.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).trim_end_matches('\n').to_owned();
    if !out.status.success() {
        return Err(format!(
            "wasmtime exited with {}\nstdout: {stdout}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(stdout)
}

/// A readable difference of two (usually one-line) outputs.
fn diff(expected: &str, actual: &str) -> String {
    let mut d = String::new();
    let (e, a): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), actual.lines().collect());
    for i in 0..e.len().max(a.len()) {
        match (e.get(i), a.get(i)) {
            (Some(x), Some(y)) if x == y => {
                let _ = writeln!(d, "  {x}");
            }
            (x, y) => {
                if let Some(x) = x {
                    let _ = writeln!(d, "- {x}");
                }
                if let Some(y) = y {
                    let _ = writeln!(d, "+ {y}");
                }
                if let (Some(x), Some(y)) = (x, y) {
                    let at = x.chars().zip(y.chars()).take_while(|(p, q)| p == q).count();
                    let _ = writeln!(d, "  (first difference at character {at})");
                }
            }
        }
    }
    d
}

#[test]
fn policy_cases() {
    let wasmtime = wasmtime();
    let dir = tempfile::tempdir().expect("temp dir");
    let wasm = dir.path().join("kata-addons-guest.wasm");
    std::fs::write(&wasm, kata_addons::GUEST_WASM).expect("write the component");

    let cases_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&cases_dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", cases_dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "case"))
        .collect();
    files.sort();
    assert!(files.len() >= 45, "expected at least 45 policy cases, found {}", files.len());

    let update = std::env::var_os("UPDATE_POLICY_CASES").is_some_and(|v| v != "0" && !v.is_empty());
    let mut failures = Vec::new();
    for file in &files {
        let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        let case = match parse_case(&text) {
            Ok(c) => c,
            Err(e) => {
                failures.push(format!("{name}: malformed case file: {e}"));
                continue;
            }
        };
        let actual = match run(&wasmtime, &wasm, &case.call) {
            Ok(a) => a,
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        if update {
            if actual != case.expect {
                let new = format!("{}call: {}\nexpect:\n{actual}\n", case.comments, case.call);
                std::fs::write(file, new).unwrap_or_else(|e| panic!("write {}: {e}", file.display()));
                eprintln!("updated {name}");
            }
        } else if actual != case.expect {
            failures.push(format!("{name}:\n{}", diff(&case.expect, &actual)));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} policy cases failed (UPDATE_POLICY_CASES=1 rewrites expectations):\n\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
}
