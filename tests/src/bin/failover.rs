//! Latency of registry failures (run by `bench/failover`): for each scenario of
//! docs/registries-and-trust.md#failing-fast a real registry behind the fault-injecting
//! proxy and a registries.conf naming them, then `kata-addons fetch` with default flags and
//! `skopeo copy` with the same registries.conf, each timed (skopeo is stopped after a cap).
//! Prints a Markdown table.
//!
//!   failover [CAP_SECONDS]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kata_addons_tests::image::{Compress, Image, LayerBuilder};
use kata_addons_tests::proxy::{Proxy, Rules};
use kata_addons_tests::registry::{Registry, free_port};

/// Runs `cmd` for at most `cap`: wall time and exit code (`None`: stopped at the cap).
fn timed(mut cmd: Command, cap: Duration) -> (Duration, Option<i32>) {
    let start = Instant::now();
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("spawn");
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            return (start.elapsed(), st.code());
        }
        if start.elapsed() > cap {
            let _ = child.kill();
            let _ = child.wait();
            return (start.elapsed(), None);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn show((d, code): (Duration, Option<i32>)) -> String {
    match code {
        Some(0) => format!("{:.1} s, success", d.as_secs_f64()),
        Some(c) => format!("{:.1} s, exit {c}", d.as_secs_f64()),
        None => format!("still running at {:.0} s (stopped)", d.as_secs_f64()),
    }
}

fn main() {
    let cap = Duration::from_secs(std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(120));
    let reg = Registry::start();
    let top = LayerBuilder::new().dir("boot").big_file("boot/vmlinuz", 256 << 10, 7).build(Compress::Gzip);
    reg.push("lib/k", "1", &Image::new(vec![top]));
    let dir = tempfile::tempdir().expect("tmp");
    println!(
        "kata-addons: {}, defaults; skopeo: Debian's, the same registries.conf; cap {} s",
        kata_addons_tests::kata_addons_bin().display(),
        cap.as_secs()
    );
    println!();
    println!("| scenario | kata-addons | skopeo | stalled mirror contacts |");
    println!("| --- | --- | --- | ---: |");
    let healthy = reg.host();
    type Case = (&'static str, Option<Rules>, Option<Rules>, bool);
    let cases: Vec<Case> = vec![
        ("every endpoint refuses", None, None, true),
        ("source accepts, never answers (insecure)", None, Some(Rules { stall: true, ..Rules::default() }), false),
        (
            "a blob trickles at 1 B/s",
            None,
            Some(Rules { trickle_blobs: Some(Duration::from_secs(1)), ..Rules::default() }),
            false,
        ),
        ("mirror stalled, source healthy", Some(Rules { stall: true, ..Rules::default() }), None, false),
        ("mirror refuses, source healthy", None, None, false),
    ];
    for (name, mirror_rules, source_rules, source_dead) in cases {
        let mirror = mirror_rules.map(|r| Proxy::start(reg.addr, r));
        let source = source_rules.map(|r| Proxy::start(reg.addr, r));
        let mirror_host = mirror.as_ref().map_or_else(|| format!("127.0.0.1:{}", free_port()), Proxy::host);
        let source_host = if source_dead {
            format!("127.0.0.1:{}", free_port())
        } else {
            source.as_ref().map_or_else(|| healthy.clone(), Proxy::host)
        };
        let conf = dir.path().join("registries.conf");
        std::fs::write(
            &conf,
            format!(
                "[[registry]]\nprefix = \"example.invalid/lib\"\nlocation = \"{source_host}/lib\"\ninsecure = true\n\
                 [[registry.mirror]]\nlocation = \"{mirror_host}/lib\"\ninsecure = true\n"
            ),
        )
        .expect("conf");
        let dest = tempfile::tempdir().expect("dest");
        let mut ka = Command::new(kata_addons_tests::kata_addons_bin());
        ka.env("HOME", dir.path())
            .args(["fetch", "--image", "example.invalid/lib/k:1", "--path", "/boot/vmlinuz", "--dest"])
            .arg(dest.path())
            .arg("--registries-conf")
            .arg(&conf);
        let ours = timed(ka, cap);
        let contacts = mirror.as_ref().map(Proxy::connections);
        let sdest = tempfile::tempdir().expect("dest");
        let mut sk = Command::new("skopeo");
        sk.env("HOME", dir.path())
            .arg("--registries-conf")
            .arg(&conf)
            .args(["copy", "--src-tls-verify=false", "docker://example.invalid/lib/k:1"])
            .arg(format!("dir:{}", sdest.path().display()));
        let theirs = timed(sk, cap);
        println!(
            "| {name} | {} | {} | {} |",
            show(ours),
            show(theirs),
            contacts.map_or_else(|| "-".to_string(), |c| c.to_string())
        );
    }
}
