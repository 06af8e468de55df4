//! Builds the policy guest (`../guest`) for `wasm32-wasip2` with the `guest` profile and
//! embeds it, like wasmtime's `test-programs`. The built component is also copied to
//! `<target>/kata-addons-guest.wasm`, a stable path for `wasmtime` CLI use and tests.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest_dir.parent().expect("host/ lives in the workspace root").to_path_buf();
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let target_dir = target_dir(&root, &out_dir);
    let guest_target = target_dir.join("guest-wasm");

    for p in ["guest/src", "guest/Cargo.toml", "facts/src", "facts/Cargo.toml", "wit", "Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }

    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args(["build", "-p", "kata-addons-guest", "--lib", "--target", "wasm32-wasip2", "--profile", "guest"])
        .arg("--target-dir")
        .arg(&guest_target);
    // Do not leak the outer build's flags or wrappers (clippy, coverage) into the guest build.
    for var in [
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_WRAPPER",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_MAKEFLAGS",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd.status().expect("failed to run cargo to build the policy guest");
    assert!(
        status.success(),
        "building the policy guest for wasm32-wasip2 failed (is the target installed? `rustup target add wasm32-wasip2`)"
    );

    let built = guest_target.join("wasm32-wasip2/guest/kata_addons_guest.wasm");
    let embedded = out_dir.join("kata-addons-guest.wasm");
    std::fs::copy(&built, &embedded).unwrap_or_else(|e| panic!("copy {}: {e}", built.display()));
    // Stable path for the wasmtime CLI and the policy tests.
    let _ = std::fs::copy(&built, target_dir.join("kata-addons-guest.wasm"));
    println!("cargo:rustc-env=KATA_ADDONS_GUEST_WASM={}", embedded.display());
}

/// The workspace target directory: `$CARGO_TARGET_DIR`, else found from `OUT_DIR`
/// (`<target>/<profile>/build/<pkg>/out`), else `<root>/target`.
fn target_dir(root: &Path, out_dir: &Path) -> PathBuf {
    if let Some(t) = env::var_os("CARGO_TARGET_DIR") {
        let t = PathBuf::from(t);
        return if t.is_absolute() { t } else { root.join(t) };
    }
    out_dir
        .ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "build"))
        .and_then(|b| b.parent())
        .and_then(|profile| profile.parent())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| root.join("target"))
}
