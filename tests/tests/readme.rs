//! The README's two commands: the section "The two commands" names exactly
//! `examples/demo.sh` and `tests/run`, both exist and are executable, and CI runs the
//! same test script. The README stays an entry point (at most 250 lines), and every
//! reference into `docs/` (a code comment's `docs/design.md#host-layout`, a Markdown link
//! between pages) names a page and an anchor that exist.

use std::collections::BTreeSet;
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

/// Most lines the README may have: it is the entry point; the manual is `docs/`.
const README_MAX_LINES: usize = 250;

#[test]
fn readme_is_an_entry_point() {
    let readme = std::fs::read_to_string(workspace().join("README.md")).expect("read README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, more than {README_MAX_LINES}: move detail to docs/"
    );
}

/// GitHub's anchor for a heading: lowercase, punctuation dropped, spaces as `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown file: explicit `<a id="…">` and heading slugs.
fn anchors(text: &str) -> std::collections::BTreeSet<String> {
    let mut set = std::collections::BTreeSet::new();
    for line in text.lines() {
        let mut rest = line;
        while let Some(i) = rest.find("<a id=\"") {
            rest = &rest[i + 7..];
            if let Some(j) = rest.find('"') {
                set.insert(rest[..j].to_string());
            }
        }
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            set.insert(slug(&line[hashes..]));
        }
    }
    set
}

/// Checks one reference `target` (a path relative to `base`, optionally `#anchor`), found
/// in `from`; returns the problem, if any.
fn check_reference(base: &Path, target: &str, from: &str) -> Option<String> {
    let (file, anchor) = target.split_once('#').map_or((target, None), |(f, a)| (f, Some(a)));
    let path = if file.is_empty() { PathBuf::from(from) } else { base.join(file) };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => return Some(format!("{from}: {target}: {}: {e}", path.display())),
    };
    match anchor {
        Some(a) if path.extension().is_some_and(|x| x == "md") && !anchors(&text).contains(a) => {
            Some(format!("{from}: {target}: no anchor #{a} in {}", path.display()))
        }
        _ => None,
    }
}

/// Every file of the repository worth scanning for references (text, not generated).
fn scanned_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        let skipped = ["target", "__pycache__", "data", "layout"].contains(&name.as_str());
        if (name.starts_with('.') && name != ".ci") || skipped {
            continue;
        }
        // Symlinks are not followed (the example node root has dangling ones).
        let Ok(kind) = e.file_type() else { continue };
        if kind.is_dir() {
            scanned_files(&p, out);
        } else if kind.is_file() && e.metadata().is_ok_and(|m| m.len() <= 1 << 20) {
            out.push(p);
        }
    }
}

/// `docs/<page>.md[#anchor]` citations in a text: the page name is `[a-z0-9-]+`.
fn docs_citations(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("docs/") {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + 5..];
        // `owner/repo:docs/x.md` (and any path ending in `docs/`) is another repository's.
        if before.is_some_and(|c| c.is_alphanumeric() || matches!(c, '/' | '_' | '-' | '.' | ':')) {
            continue;
        }
        let page: String =
            rest.chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-').collect();
        if page.is_empty() || !rest[page.len()..].starts_with(".md") {
            continue;
        }
        let after = &rest[page.len() + 3..];
        let anchor: String = after
            .strip_prefix('#')
            .map(|a| a.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_').collect())
            .unwrap_or_default();
        found.push(if anchor.is_empty() { format!("docs/{page}.md") } else { format!("docs/{page}.md#{anchor}") });
    }
    found
}

/// A line without its inline code spans (`…`), where `](` is not a link.
fn without_code(line: &str) -> String {
    line.split('`').step_by(2).collect::<Vec<_>>().join(" ")
}

/// Markdown link targets `](target)` of a page that are not URLs.
fn markdown_links(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let prose: String = text.lines().map(without_code).collect::<Vec<_>>().join("\n");
    let mut rest = prose.as_str();
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        let Some(j) = rest.find(')') else { break };
        let target = &rest[..j];
        if !target.contains("://") && !target.starts_with("mailto:") && !target.contains(' ') {
            found.push(target.to_string());
        }
    }
    found
}

#[test]
fn every_reference_into_docs_resolves() {
    let root = workspace();
    let mut files = Vec::new();
    for top in ["host", "guest", "facts", "tests", "bench", "examples", "wit", ".ci", "docs"] {
        scanned_files(&root.join(top), &mut files);
    }
    files.extend(["README.md", "BENCHMARKS.md"].map(|f| root.join(f)));
    let mut problems = Vec::new();
    let mut cited = 0;
    for f in &files {
        let Ok(text) = std::fs::read_to_string(f) else { continue };
        let from = f.display().to_string();
        for c in docs_citations(&text) {
            cited += 1;
            problems.extend(check_reference(&root, &c, &from));
        }
        if f.extension().is_some_and(|x| x == "md") {
            let base = f.parent().unwrap_or(&root);
            for l in markdown_links(&text) {
                problems.extend(check_reference(base, &l, &from));
            }
        }
    }
    assert!(cited >= 30, "only {cited} citations of docs/ found: is the scan broken?");
    assert!(
        problems.is_empty(),
        "references that do not resolve (add the anchor `<a id=\"…\"></a>` to the page, or cite the page \
         without an anchor):\n{}",
        problems.join("\n")
    );
}

#[test]
fn docs_pages_cover_the_house() {
    for page in [
        "design",
        "architecture",
        "configuration",
        "deployment",
        "measured-guests",
        "registries-and-trust",
        "daemon",
        "webhook",
        "troubleshooting",
        "benchmarks-history",
    ] {
        let path = workspace().join("docs").join(format!("{page}.md"));
        assert!(path.is_file(), "docs/{page}.md is missing");
    }
    // Every exit code of the one error model has its row in the troubleshooting page.
    let trouble = std::fs::read_to_string(workspace().join("docs/troubleshooting.md")).expect("troubleshooting");
    for code in ["0", "1", "2", "3", "4", "64"] {
        assert!(trouble.contains(&format!("| `{code}` |")), "docs/troubleshooting.md has no row for exit code {code}");
    }
}

/// The (key, env var) pairs of the README's key table: the rows `| key | env var | meaning |`
/// between `<!-- keys:begin -->` and `<!-- keys:end -->`, backticks dropped, the header and
/// separator rows left out.
fn readme_keys(readme: &str) -> BTreeSet<(String, String)> {
    let start = readme.find("<!-- keys:begin -->").expect("README has `<!-- keys:begin -->`");
    let table = &readme[start..];
    let table = &table[..table.find("<!-- keys:end -->").expect("README has `<!-- keys:end -->` after the begin")];
    let mut rows = BTreeSet::new();
    for line in table.lines().map(str::trim).filter(|l| l.starts_with('|')) {
        let cells: Vec<String> = line.trim_matches('|').split('|').map(|c| c.trim().replace('`', "")).collect();
        let [key, env, ..] = cells.as_slice() else { panic!("README key table row without key and env var: {line}") };
        if key.starts_with('-') || key.starts_with(':') || key.eq_ignore_ascii_case("key") {
            continue;
        }
        assert!(rows.insert((key.clone(), env.clone())), "README key table lists {key} twice");
    }
    rows
}

/// The README's key table names exactly the keys and env vars of the policy's key table
/// (`guest/src/keys.rs`), no more, no fewer.
#[test]
fn readme_key_table_is_the_policys_key_table() {
    let readme = std::fs::read_to_string(workspace().join("README.md")).expect("read README.md");
    let want: BTreeSet<(String, String)> =
        kata_addons_guest::Key::ALL.iter().map(|k| (k.name().to_string(), k.env().to_string())).collect();
    let got = readme_keys(&readme);
    assert_eq!(
        got,
        want,
        "README key table vs guest/src/keys.rs: only in the README {:?}, missing from the README {:?}",
        got.difference(&want).collect::<Vec<_>>(),
        want.difference(&got).collect::<Vec<_>>()
    );
}
