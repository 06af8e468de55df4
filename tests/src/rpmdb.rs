//! RPM databases built with Debian's rpm 4.18: no-file packages from `rpmbuild`, installed
//! database-only into node roots laid out as RHCOS lays them out (the node's Kata release,
//! docs/design.md#node-kata-release).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Whether Debian's rpm and rpmbuild are here (tests/run installs the `rpm` package).
pub fn have_rpm() -> bool {
    ["rpm", "rpmbuild"].iter().all(|t| Command::new(t).arg("--version").output().is_ok_and(|o| o.status.success()))
}

/// One package to build: name, epoch, version, release.
#[derive(Clone, Copy)]
pub struct Pkg(pub &'static str, pub Option<u32>, pub &'static str, pub &'static str);

/// Builds the packages under `work` (each once), returning their files by `name-evr`.
pub struct Builder {
    work: PathBuf,
    built: BTreeMap<String, PathBuf>,
}

impl Builder {
    /// Builds into `work`.
    pub fn new(work: &Path) -> Builder {
        Builder { work: work.to_path_buf(), built: BTreeMap::new() }
    }

    /// The package file of `p`, built on first use.
    pub fn rpm(&mut self, p: Pkg) -> PathBuf {
        let Pkg(name, epoch, version, release) = p;
        let key = format!("{name}-{epoch:?}-{version}-{release}");
        if let Some(f) = self.built.get(&key) {
            return f.clone();
        }
        let dir = self.work.join(format!("build-{}", self.built.len()));
        std::fs::create_dir_all(&dir).unwrap();
        let epoch_line = epoch.map(|e| format!("Epoch: {e}\n")).unwrap_or_default();
        let spec = format!(
            "Name: {name}\nVersion: {version}\nRelease: {release}\n{epoch_line}Summary: test\nLicense: Apache-2.0\nBuildArch: noarch\n%description\ntest\n%files\n"
        );
        std::fs::write(dir.join("p.spec"), spec).unwrap();
        let out = Command::new("rpmbuild")
            .args(["-bb", "--quiet", "--define"])
            .arg(format!("_topdir {}", dir.join("top").display()))
            .arg("--define")
            .arg(format!("_rpmdir {}", dir.join("rpms").display()))
            .arg(dir.join("p.spec"))
            .output()
            .unwrap();
        assert!(out.status.success(), "rpmbuild {key}: {}", String::from_utf8_lossy(&out.stderr));
        let f = std::fs::read_dir(dir.join("rpms/noarch")).unwrap().next().unwrap().unwrap().path();
        self.built.insert(key, f.clone());
        f
    }
}

/// `rpm --root root --dbpath dbpath ARGS`.
pub fn rpm(root: &Path, dbpath: &str, args: &[&str]) -> std::process::Output {
    Command::new("rpm").arg("--root").arg(root).args(["--dbpath", dbpath]).args(args).output().unwrap()
}

/// An RHCOS-like root: the database in `/usr/share/rpm`, `/var/lib/rpm` a relative link to it.
pub fn rhcos_root(dir: &Path) -> PathBuf {
    let root = dir.join("root");
    std::fs::create_dir_all(root.join("usr/share/rpm")).unwrap();
    std::fs::create_dir_all(root.join("var/lib")).unwrap();
    std::os::unix::fs::symlink("../../usr/share/rpm", root.join("var/lib/rpm")).unwrap();
    root
}

/// Initialises the database at `dbpath` and installs `rpms` into it, database only.
pub fn install(root: &Path, dbpath: &str, rpms: &[PathBuf], upgrade: bool) {
    let out = rpm(root, dbpath, &["--initdb"]);
    assert!(out.status.success(), "initdb: {}", String::from_utf8_lossy(&out.stderr));
    for f in rpms {
        let mode = if upgrade { "-U" } else { "-i" };
        let out = rpm(
            root,
            dbpath,
            &[
                mode,
                "--justdb",
                "--nodeps",
                "--noscripts",
                "--notriggers",
                "--nosignature",
                "--nodigest",
                f.to_str().unwrap(),
            ],
        );
        assert!(out.status.success(), "rpm {mode} {}: {}", f.display(), String::from_utf8_lossy(&out.stderr));
    }
}
