//! What the machine building the tests can run, as cfgs for `#[cfg_attr(.., ignore = ..)]`:
//! a test that cannot run here is ignored (counted as skipped) with the reason, never a
//! silent pass.
//! - `no_kubectl`: no `kubectl` on PATH (`kubectl kustomize` renders the manifests);
//! - `not_root`: not root, so no tmpfs can be mounted for a test.

use std::process::Command;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(no_kubectl)");
    println!("cargo::rustc-check-cfg=cfg(not_root)");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=PATH");
    let kubectl = Command::new("kubectl").args(["version", "--client"]).output().is_ok_and(|o| o.status.success());
    if !kubectl {
        println!("cargo::rustc-cfg=no_kubectl");
    }
    let uid = Command::new("id").arg("-u").output().ok().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if uid.as_deref() != Some("0") {
        println!("cargo::rustc-cfg=not_root");
    }
}
