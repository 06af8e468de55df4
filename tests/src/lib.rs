//! Shared helpers for the integration tests:
//!
//! - [`image`]: build layers (tar + gzip/zstd/none), configs, manifests and indexes;
//! - [`registry`]: a real `docker-registry` on 127.0.0.1 (free port, temp storage,
//!   optional htpasswd and TLS), stopped on drop; images are stored by writing the
//!   registry's filesystem storage directly, so tests can also store broken content;
//! - [`proxy`]: a fault-injecting HTTP proxy (503s, cut connections, stalls) with a request log;
//! - [`tls`]: a test CA and server certificate made with the `openssl` command;
//! - [`cri`]: node roots in kata-deploy's formats (Kata shims, custom runtimes, CRI-O and
//!   containerd handlers) and containerd's own `config dump` as the oracle;
//! - [`disk`]: measured guest disk images (mkfs.erofs/ext4/xfs, veritysetup, sfdisk) and the veritysetup oracle;
//! - [`daemon`]: `kata-addons daemon` as a process, a kubelet-style ConfigMap volume, log waits;
//! - [`admission`]: an HTTPS client and AdmissionReview bodies for `kata-addons webhook`;
//! - [`abuse`]: idle connections, trickling bodies and 3 MiB floods against the webhook;
//! - [`fileserver`]: a static HTTP file server on 127.0.0.1 (lookaside signatures);
//! - [`guests`]: the hostile and alternative policy guests under `tests/guests/`, built once;
//! - [`hostile`]: a raw tar writer for hostile layers and the catalogue `bench/hostile` measures;
//! - [`hostile_gpt`]: `bench/hostile`'s install cases: measured disks with a hostile GPT header;
//! - [`oras`]: a real ORAS client (the ORAS Python SDK) pushing OCI artifacts, indexes, layouts;
//! - [`kata_deploy`]: kata-deploy's runtime-rs SEV-SNP configuration from Kata's real template;
//! - [`ovmf`]: test firmware shaped like Kata's AMDSEV OVMF and `sev-snp-measure` as the oracle;
//! - [`node`]: a throwaway node root with sample Kata configs, snapshots, effective config;
//! - [`measure`]: run the binary and read its peak RSS and CPU time;
//! - [`kata_addons_bin`] / [`run_kata`]: run the real binary.

pub mod abuse;
pub mod admission;
pub mod cri;
pub mod daemon;
pub mod disk;
pub mod fileserver;
pub mod guests;
pub mod hostile;
pub mod hostile_gpt;
pub mod image;
pub mod kata_deploy;
pub mod measure;
pub mod node;
pub mod oras;
pub mod ovmf;
pub mod prometheus;
pub mod proxy;
pub mod registry;
pub mod rpmdb;
pub mod tls;

use std::path::PathBuf;
use std::process::{Command, Output};

/// Path of the runner cargo built for this test run (`CARGO_BIN_EXE_kata-addons-under-test`,
/// the runner's own `main.rs` as a binary of this package), or `$KATA_ADDONS_BIN` when set
/// (the benches run a release build). Never whatever happens to sit in `target/debug`.
pub fn kata_addons_bin() -> PathBuf {
    std::env::var_os("KATA_ADDONS_BIN")
        .or_else(|| std::env::var_os("CARGO_BIN_EXE_kata-addons-under-test"))
        .map(PathBuf::from)
        .expect("no runner to test: run the tests through cargo (cargo test, cargo nextest), which builds it, or set KATA_ADDONS_BIN")
}

/// Runs `kata-addons` with `args` and an environment without the user's auth files.
pub fn run_kata(args: &[&str]) -> Output {
    let home = tempfile::tempdir().expect("temp HOME");
    let out = Command::new(kata_addons_bin())
        .args(args)
        .env("HOME", home.path())
        .env_remove("REGISTRY_AUTH_FILE")
        .env_remove("XDG_RUNTIME_DIR")
        .output()
        .expect("run kata-addons");
    drop(home);
    out
}

/// Runs `kata-addons` with `args` in a clean environment: only `PATH`, a temporary `HOME`,
/// and `env`.
pub fn run_kata_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let home = tempfile::tempdir().expect("temp HOME");
    let mut c = Command::new(kata_addons_bin());
    c.env_clear().env("PATH", std::env::var_os("PATH").unwrap_or_default()).env("HOME", home.path());
    for (k, v) in env {
        c.env(k, v);
    }
    c.args(args).output().expect("run kata-addons")
}

/// stdout and stderr of an output, for assertion messages.
pub fn show(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// sha256 hex of bytes.
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(data))
}
