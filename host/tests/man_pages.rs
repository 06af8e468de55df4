//! The man pages in docs/man are the ones clap_mangen renders from the command line (one
//! page per command, `kata-addons-install.1`, ...): a changed flag or help text without the
//! pages regenerated fails here, with the command that regenerates them. The pages render
//! without warnings in groff, and `kata-addons completions SHELL` prints scripts the shells
//! accept.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::CommandFactory;
use kata_addons::cli::Cli;

/// The command that writes the pages, printed by every failure here.
const BLESS: &str = "KATA_ADDONS_BLESS=1 cargo test -p kata-addons --test man_pages";

fn man_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/man")
}

/// Every page as clap_mangen renders it: the top command and each visible subcommand,
/// recursively (what `clap_mangen::generate_to` writes), by file name.
fn rendered() -> BTreeMap<String, Vec<u8>> {
    fn walk(cmd: &clap::Command, out: &mut BTreeMap<String, Vec<u8>>) {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            walk(sub, out);
        }
        // Every page names the program and its version (a subcommand has no version of its own).
        let man = clap_mangen::Man::new(cmd.clone()).source(concat!("kata-addons ", env!("CARGO_PKG_VERSION")));
        let mut page = Vec::new();
        man.render(&mut page).expect("rendering into memory");
        out.insert(man.get_filename(), page);
    }
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut out = BTreeMap::new();
    walk(&cmd, &mut out);
    out
}

/// The `*.1` files in docs/man.
fn committed() -> BTreeMap<String, Vec<u8>> {
    let Ok(entries) = std::fs::read_dir(man_dir()) else { return BTreeMap::new() };
    entries
        .map(|e| e.expect("docs/man entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "1"))
        .map(|p| {
            let name = p.file_name().expect("file name").to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        })
        .collect()
}

#[test]
fn committed_man_pages_are_the_generated_ones() {
    let want = rendered();
    assert!(want.contains_key("kata-addons.1") && want.contains_key("kata-addons-install.1"), "{:?}", want.keys());
    if std::env::var_os("KATA_ADDONS_BLESS").is_some_and(|v| v == "1") {
        let dir = man_dir();
        std::fs::create_dir_all(&dir).expect("create docs/man");
        for name in committed().keys().filter(|n| !want.contains_key(*n)) {
            std::fs::remove_file(dir.join(name)).expect("remove a stale page");
        }
        for (name, page) in &want {
            std::fs::write(dir.join(name), page).expect("write a page");
        }
        return;
    }
    let have = committed();
    let mut problems = Vec::new();
    for (name, page) in &want {
        match have.get(name) {
            None => problems.push(format!("docs/man/{name} is missing")),
            Some(p) if p != page => problems.push(format!("docs/man/{name} differs from the command line")),
            Some(_) => {}
        }
    }
    for name in have.keys().filter(|n| !want.contains_key(*n)) {
        problems.push(format!("docs/man/{name} is no command's page"));
    }
    assert!(problems.is_empty(), "{}\nregenerate the pages with: {BLESS}", problems.join("\n"));
}

#[test]
fn man_pages_render_without_warnings() {
    let pages = committed();
    assert!(!pages.is_empty(), "no pages in docs/man; generate them with: {BLESS}");
    for name in pages.keys() {
        let path = man_dir().join(name);
        // groff as man-db runs it: -k the UTF-8 input through preconv, -man the macros; and
        // -ww every warning, -z no output.
        let out =
            Command::new("groff").args(["-k", "-man", "-ww", "-z", "-Tutf8"]).arg(&path).output().unwrap_or_else(|e| {
                panic!("groff (Debian: groff-base, what man uses) is needed to check the pages: {e}")
            });
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && stderr.trim().is_empty(), "groff on docs/man/{name}: {stderr}");
    }
}

fn completions(shell: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kata-addons")).args(["completions", shell]).output().expect("run");
    assert!(out.status.success(), "completions {shell}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("a completion script is UTF-8")
}

#[test]
fn bash_completion_registers_every_command() {
    let script = completions("bash");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("kata-addons.bash");
    std::fs::write(&file, &script).expect("write the script");
    // The real bash: the script sources cleanly and registers a completion function, which
    // offers every command after `kata-addons `.
    let probe = r#"source "$1" || exit 9
complete -p kata-addons || exit 8
COMP_WORDS=(kata-addons ""); COMP_CWORD=1; COMP_LINE="kata-addons "; COMP_POINT=${#COMP_LINE}
fn=$(complete -p kata-addons | sed -n 's/.*-F \([^ ]*\).*/\1/p')
"$fn" kata-addons "" kata-addons
printf '%s\n' "${COMPREPLY[@]}""#;
    let out = Command::new("bash").args(["-c", probe, "probe"]).arg(&file).output().expect("run bash");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "bash: {}{}", stdout, String::from_utf8_lossy(&out.stderr));
    let offered: Vec<&str> = stdout.lines().collect();
    for cmd in Cli::command().get_subcommands().map(clap::Command::get_name) {
        assert!(offered.contains(&cmd), "bash completion does not offer {cmd}: {offered:?}");
    }
}

#[test]
fn zsh_and_fish_completions_name_the_commands() {
    for (shell, marker) in [("zsh", "#compdef kata-addons"), ("fish", "complete -c kata-addons")] {
        let script = completions(shell);
        assert!(script.contains(marker), "{shell}: {script}");
        assert!(script.contains("install") && script.contains("verify-interval"), "{shell}: {script}");
    }
}

#[test]
fn an_unknown_shell_is_a_usage_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_kata-addons")).args(["completions", "tcsh"]).output().expect("run");
    assert_eq!(out.status.code(), Some(64), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bash"), "the error lists the shells");
}
