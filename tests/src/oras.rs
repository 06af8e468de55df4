//! A real ORAS client for tests: the ORAS Python SDK (PyPI `oras`, in the venv `tests/run`
//! creates) driven by `tests/oras/oras_client.py`, pushing OCI artifacts to the test
//! registry over plain HTTP, building image indexes of them and copying them into OCI
//! layouts.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The venv's Python: `$KATA_ADDONS_ORAS_PYTHON`, else
/// `${XDG_CACHE_HOME:-~/.cache}/kata-addons/oras-venv/bin/python` (where `tests/run` puts it).
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("KATA_ADDONS_ORAS_PYTHON") {
        return PathBuf::from(p);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/root/.cache"));
    cache.join("kata-addons/oras-venv/bin/python")
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("oras/oras_client.py")
}

fn run(cwd: &Path, auth: Option<&(String, String)>, args: &[&str]) -> String {
    let py = python();
    let mut cmd = Command::new(&py);
    cmd.arg(script()).args(args).current_dir(cwd).env_remove("ORAS_USER").env_remove("ORAS_PASSWORD");
    if let Some((user, password)) = auth {
        cmd.env("ORAS_USER", user).env("ORAS_PASSWORD", password);
    }
    let out =
        cmd.output().unwrap_or_else(|e| panic!("run {} (the ORAS SDK venv; tests/run creates it): {e}", py.display()));
    assert!(
        out.status.success(),
        "oras_client.py {args:?} failed ({:?}):\n{}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A directory of files to push, as `oras push` run in it would see them.
pub struct Workdir {
    /// The directory (removed on drop).
    pub dir: tempfile::TempDir,
    /// HTTP basic credentials for the registry, if it requires them.
    pub auth: Option<(String, String)>,
}

impl Workdir {
    /// An empty working directory.
    pub fn new() -> Self {
        Workdir { dir: tempfile::tempdir().expect("oras workdir"), auth: None }
    }

    /// An empty working directory whose pushes log in as `user`.
    pub fn with_auth(user: &str, password: &str) -> Self {
        Workdir { auth: Some((user.to_string(), password.to_string())), ..Self::new() }
    }

    /// Writes `data` at the relative path `name` (parents created).
    pub fn file(&self, name: &str, data: &[u8]) -> &Self {
        let p = self.dir.path().join(name);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).expect("parent dir");
        }
        std::fs::write(p, data).expect("write file");
        self
    }

    /// A symbolic link at the relative path `name` pointing to `target`.
    pub fn symlink(&self, name: &str, target: &str) -> &Self {
        std::os::unix::fs::symlink(target, self.dir.path().join(name)).expect("symlink");
        self
    }

    /// `oras push REF [--artifact-type T] [--annotation-file F] PATH[:MEDIATYPE]...` run in this
    /// directory against the plain-HTTP registry `host`; returns the manifest digest.
    pub fn push(&self, host: &str, repo_tag: &str, artifact_type: Option<&str>, paths: &[&str]) -> String {
        self.push_annotated(host, repo_tag, artifact_type, None, paths)
    }

    /// [`Workdir::push`] with an annotation file (JSON: path → annotations, as `oras push
    /// --annotation-file`), written here first.
    pub fn push_annotated(
        &self,
        host: &str,
        repo_tag: &str,
        artifact_type: Option<&str>,
        annotations: Option<&serde_json::Value>,
        paths: &[&str],
    ) -> String {
        let reference = format!("{host}/{repo_tag}");
        let mut args = vec!["push"];
        if let Some(t) = artifact_type {
            args.extend(["--artifact-type", t]);
        }
        if let Some(a) = annotations {
            std::fs::write(self.dir.path().join(".annotations.json"), a.to_string()).expect("annotation file");
            args.extend(["--annotation-file", ".annotations.json"]);
        }
        args.push(&reference);
        args.extend_from_slice(paths);
        run(self.dir.path(), self.auth.as_ref(), &args)
    }
}

impl Default for Workdir {
    fn default() -> Self {
        Self::new()
    }
}

/// Pushes an image index `repo_tag` over manifests already in the repository, one per
/// `(platform, digest)` (as `oras manifest index create`); returns the index digest.
pub fn push_index(host: &str, repo_tag: &str, entries: &[(&str, &str)]) -> String {
    let reference = format!("{host}/{repo_tag}");
    let pairs: Vec<String> = entries.iter().map(|(p, d)| format!("{p}={d}")).collect();
    let mut args = vec!["index", reference.as_str()];
    args.extend(pairs.iter().map(String::as_str));
    run(Path::new("/"), None, &args)
}

/// Copies `host/repo_tag` into a new OCI layout at `dir`, tagged `tag` (the SDK's
/// `NewLayoutFromRegistry`, as `oras copy --to-oci-layout`).
pub fn to_layout(host: &str, repo_tag: &str, dir: &Path, tag: &str) {
    let reference = format!("{host}/{repo_tag}");
    run(Path::new("/"), None, &["layout", &reference, dir.to_str().expect("utf-8 path"), tag]);
}
