//! Crash safety of the atomic switch: SIGKILL an upgrade at random instants, many times.
//! After every kill the effective configuration (base + config.d in lexical order) must
//! point at a complete kernel of either the old or the new version, `config.d` must hold
//! only the one drop-in, and a rerun must converge.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kata_addons_tests::node::{Node, layout_with, noise};
use kata_addons_tests::{kata_addons_bin, sha256_hex, show};

const KILLS: usize = 60;

fn install_cmd(node: &Node, image: &str, cache: &std::path::Path) -> Command {
    let mut c = Command::new(kata_addons_bin());
    c.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("ADDON_IMAGE", image)
        .env("ADDON_KERNEL_PATH", "/vmlinuz")
        .arg("--cache-dir")
        .arg(cache)
        .args(["install", "--root"])
        .arg(node.root())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
}

/// xorshift64*, deterministic per run so a failure can be replayed (seed in the message).
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

#[test]
fn sigkill_at_random_instants_never_breaks_the_node() {
    let dir = tempfile::tempdir().expect("tmp");
    let cache = dir.path().join("cache");
    let kernels = [noise(6 << 20, 11), noise(6 << 20, 12)];
    let shas: Vec<String> = kernels.iter().map(|k| sha256_hex(k)).collect();
    let images: Vec<String> = (0..2)
        .map(|i| {
            let p = dir.path().join(format!("l{i}"));
            layout_with(&p, &format!("v{i}"), &[("vmlinuz", &kernels[i])]);
            format!("oci:{}:v{i}", p.display())
        })
        .collect();
    let node = Node::new();

    // Converge on v0 and time one uninterrupted upgrade (and back) to pick kill instants.
    let o = install_cmd(&node, &images[0], &cache).stdout(Stdio::piped()).stderr(Stdio::piped()).output().expect("run");
    assert!(o.status.success(), "{}", show(&o));
    let t0 = Instant::now();
    assert!(install_cmd(&node, &images[1], &cache).status().expect("run").success());
    let up = t0.elapsed();
    let t1 = Instant::now();
    assert!(install_cmd(&node, &images[0], &cache).status().expect("run").success());
    // The shorter of the two: a run seldom ends sooner, so most kills land mid-run even when
    // the machine's load falls during the test.
    let span = up.min(t1.elapsed());
    let mut current = 0usize;

    let seed =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
            | 1;
    let mut rng = seed;
    let mut killed_mid_run = 0;
    for i in 0..KILLS {
        let target = 1 - current;
        let mut child = install_cmd(&node, &images[target], &cache).spawn().expect("spawn");
        let wait = Duration::from_micros(next(&mut rng) % (span.as_micros() as u64 * 9 / 10 + 1));
        std::thread::sleep(wait);
        let _ = child.kill(); // SIGKILL
        let status = child.wait().expect("wait");
        if !status.success() {
            killed_mid_run += 1;
        }

        let ctx = format!("kill {i} after {wait:?} (seed {seed}, span {span:?})");
        assert_eq!(
            node.config_d_entries("se"),
            vec!["50-kata-addons.toml"],
            "{ctx}: config.d must hold only the drop-in"
        );
        let kernel = node.qemu_key("se", "kernel").unwrap_or_else(|| panic!("{ctx}: no effective kernel"));
        let data =
            std::fs::read(node.path(&kernel)).unwrap_or_else(|e| panic!("{ctx}: effective kernel {kernel}: {e}"));
        let sha = sha256_hex(&data);
        assert!(shas.contains(&sha), "{ctx}: effective kernel {kernel} is neither complete version (sha {sha})");

        // A rerun converges on the target.
        let o = install_cmd(&node, &images[target], &cache)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .expect("rerun");
        assert!(o.status.success(), "{ctx}: rerun failed: {}", show(&o));
        let kernel = node.qemu_key("se", "kernel").expect("kernel after rerun");
        assert_eq!(
            sha256_hex(&std::fs::read(node.path(&kernel)).expect("read")),
            shas[target],
            "{ctx}: rerun did not converge"
        );
        let st = Command::new(kata_addons_bin()).args(["status", "--root"]).arg(node.root()).output().expect("status");
        assert_eq!(st.status.code(), Some(0), "{ctx}: {}", show(&st));
        let addons: Vec<_> = std::fs::read_dir(node.path("/etc/kata-containers/addons"))
            .expect("addons")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(addons.len(), 2, "{ctx}: leftovers after convergence: {addons:?}");
        current = target;
    }
    // Most kills must land mid-run, or the test proves little.
    assert!(killed_mid_run * 2 >= KILLS, "only {killed_mid_run} of {KILLS} kills interrupted a run (span {span:?})");
}
