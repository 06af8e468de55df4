//! Test policy guests (`tests/guests/<name>/`), built once per test process for
//! `wasm32-wasip2` and located by name.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The workspace root (parent of `tests/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from(".."))
}

/// The cargo target directory: `$CARGO_TARGET_DIR`, else `<root>/target`.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR").filter(|v| !v.is_empty()) {
        Some(t) => {
            let t = PathBuf::from(t);
            if t.is_absolute() { t } else { workspace_root().join(t) }
        }
        None => workspace_root().join("target"),
    }
}

/// Builds every test guest (one cargo invocation for the `tests/guests` workspace) the
/// first time it is called in this process; returns the directory holding the `.wasm` files.
fn built_dir() -> &'static Result<PathBuf, String> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT.get_or_init(|| {
        let root = workspace_root();
        let target = target_dir().join("test-guests");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(root.join("tests/guests"))
            .args(["build", "--release", "--target", "wasm32-wasip2", "--workspace", "--quiet"])
            .arg("--manifest-path")
            .arg(root.join("tests/guests/Cargo.toml"))
            .arg("--target-dir")
            .arg(&target);
        for var in
            ["CARGO_ENCODED_RUSTFLAGS", "RUSTFLAGS", "RUSTC_WORKSPACE_WRAPPER", "RUSTC_WRAPPER", "CARGO_TARGET_DIR"]
        {
            cmd.env_remove(var);
        }
        let status = cmd.status().map_err(|e| format!("running cargo to build the test guests: {e}"))?;
        if !status.success() {
            return Err(format!("building the test guests failed ({status}); is wasm32-wasip2 installed?"));
        }
        Ok(target.join("wasm32-wasip2/release"))
    })
}

/// Path of the built test guest `name` (the directory name under `tests/guests/`),
/// building all test guests first if needed. Panics with the build error otherwise.
pub fn guest(name: &str) -> PathBuf {
    match built_dir() {
        Ok(dir) => {
            let path = dir.join(format!("guest_{}.wasm", name.replace('-', "_")));
            assert!(path.is_file(), "test guest {name} was not built at {}", path.display());
            path
        }
        Err(e) => panic!("{e}"),
    }
}
