//! Retries against a throttling or failing registry
//! (docs/registries-and-trust.md#failing-fast): 429 and 503 with `Retry-After` (seconds and
//! HTTP-date) are waited out, the per-pull budget ends a hopeless pull with a clear error,
//! and other 4xx answers and TLS failures are not retried. Delays are checked from the
//! proxy's side (when it saw the next request), never by timing our own process.

use std::time::{Duration, SystemTime};

use kata_addons_tests::image::{Compress, Image, LayerBuilder};
use kata_addons_tests::proxy::{Event, Proxy, Rules};
use kata_addons_tests::registry::Registry;
use kata_addons_tests::{run_kata, show};

const KERNEL: &[u8] = b"kernel bytes for the retry tests";

fn setup(rules: Rules) -> (Registry, Proxy) {
    let reg = Registry::start();
    let base = LayerBuilder::new().dir("etc").file("etc/os-release", b"ID=test\n").build(Compress::Gzip);
    let top = LayerBuilder::new().dir("boot").file("boot/vmlinuz", KERNEL).build(Compress::Gzip);
    reg.push("k", "1", &Image::new(vec![base, top]));
    let proxy = Proxy::start(reg.addr, rules);
    (reg, proxy)
}

struct Run {
    out: std::process::Output,
    dest: tempfile::TempDir,
}

impl Run {
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).to_string()
    }
}

fn fetch_via(host: &str, extra: &[&str]) -> Run {
    let dest = tempfile::tempdir().expect("dest");
    let d = dest.path().to_str().expect("utf8").to_string();
    let image = format!("{host}/k:1");
    let mut args = vec!["fetch", "--image", &image, "--path", "/boot/vmlinuz", "--dest", &d];
    args.extend_from_slice(extra);
    let out = run_kata(&args);
    Run { out, dest }
}

fn fetch(proxy: &Proxy, extra: &[&str]) -> Run {
    let h = proxy.host();
    let mut args = vec!["--insecure-registry", h.as_str()];
    args.extend_from_slice(extra);
    fetch_via(&h, &args)
}

fn blob_events(p: &Proxy) -> Vec<Event> {
    p.events().into_iter().filter(|e| e.line.contains("/blobs/")).collect()
}

/// Every injected answer is followed by the next request of the same kind no earlier than
/// `min_gap` later (as the proxy saw it).
fn assert_waited(events: &[Event], min_gap: Duration) {
    let mut checked = 0;
    for w in events.windows(2) {
        if w[0].injected.is_some() {
            let gap = w[1].at.duration_since(w[0].at);
            assert!(gap >= min_gap, "retry after {gap:?}, Retry-After asked {min_gap:?}: {events:#?}");
            checked += 1;
        }
    }
    assert!(checked > 0, "no injected answer was retried: {events:#?}");
}

#[test]
fn pull_waits_out_429_with_retry_after_seconds() {
    let (_reg, proxy) = setup(Rules {
        fail_first: 2,
        fail_status: Some(429),
        fail_matching: Some("/blobs/".into()),
        retry_after: Some("1".into()),
        ..Rules::default()
    });
    let r = fetch(&proxy, &[]);
    assert!(r.out.status.success(), "{}", show(&r.out));
    assert_eq!(std::fs::read(r.dest.path().join("vmlinuz")).expect("fetched"), KERNEL);
    let blobs = blob_events(&proxy);
    assert_eq!(blobs.iter().filter(|e| e.injected == Some(429)).count(), 2, "{blobs:#?}");
    assert_waited(&blobs, Duration::from_secs(1));
    // One log line per retry, with the reason and the delay.
    let err = r.stderr();
    assert_eq!(err.matches("HTTP 429").count(), 2, "{err}");
    assert!(err.contains("retry 1 of at most") && err.contains("retry 2 of at most"), "{err}");
    assert!(err.contains("(Retry-After 1 s)"), "{err}");
}

#[test]
fn pull_waits_out_503_with_retry_after_date() {
    // An HTTP-date a few seconds ahead: the retry must not come before it.
    let until = SystemTime::now() + Duration::from_secs(3);
    let (_reg, proxy) = setup(Rules {
        fail_first: 1,
        fail_status: Some(503),
        fail_matching: Some("/manifests/".into()),
        retry_after: Some(httpdate::fmt_http_date(until)),
        ..Rules::default()
    });
    let r = fetch(&proxy, &[]);
    assert!(r.out.status.success(), "{}", show(&r.out));
    let manifests: Vec<Event> = proxy.events().into_iter().filter(|e| e.line.contains("/manifests/")).collect();
    assert_eq!(manifests.len(), 2, "{manifests:#?}");
    // The date has a resolution of one second: the retry comes at or after it.
    let date = httpdate::parse_http_date(&httpdate::fmt_http_date(until)).expect("date");
    assert!(manifests[1].wall >= date, "retried at {:?}, before {:?}", manifests[1].wall, date);
}

#[test]
fn concurrent_pulls_through_a_throttle_all_succeed() {
    let (_reg, proxy) = setup(Rules { max_blobs: Some(1), retry_after: Some("1".into()), ..Rules::default() });
    let runs: Vec<Run> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4).map(|_| s.spawn(|| fetch(&proxy, &[]))).collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    for r in &runs {
        assert!(r.out.status.success(), "{}", show(&r.out));
        assert_eq!(std::fs::read(r.dest.path().join("vmlinuz")).expect("fetched"), KERNEL);
    }
    assert!(proxy.peak_blobs() <= 1);
    // Each pull read the manifest and the top layer once; throttled requests carry no body.
    let served = proxy.served();
    let s = served.values().next().expect("one address");
    let ok_blobs = blob_events(&proxy).iter().filter(|e| e.injected.is_none()).count();
    assert_eq!(ok_blobs, 4, "{:#?}", proxy.events());
    assert_eq!(s.throttled as usize, blob_events(&proxy).len() - 4);
}

#[test]
fn gives_up_at_the_retry_count_budget() {
    let (_reg, proxy) = setup(Rules {
        fail_first: u32::MAX,
        fail_status: Some(503),
        fail_matching: Some("/blobs/".into()),
        retry_after: Some("0".into()),
        ..Rules::default()
    });
    let r = fetch(&proxy, &["--retries", "3"]);
    assert!(!r.out.status.success(), "{}", show(&r.out));
    assert_eq!(r.out.status.code(), Some(1));
    assert!(r.stderr().contains("giving up, retry budget spent: 3 retries (at most 3 per pull)"), "{}", show(&r.out));
    assert!(r.stderr().contains("HTTP 503"), "{}", show(&r.out));
    assert_eq!(blob_events(&proxy).len(), 4, "1 try + 3 retries: {:#?}", proxy.events());
    assert_eq!(std::fs::read_dir(r.dest.path()).expect("dest").count(), 0, "nothing written");
}

#[test]
fn gives_up_at_the_retry_time_budget() {
    let (_reg, proxy) = setup(Rules {
        fail_first: u32::MAX,
        fail_status: Some(429),
        fail_matching: Some("/blobs/".into()),
        retry_after: Some("30".into()),
        ..Rules::default()
    });
    let r = fetch(&proxy, &["--retry-budget", "10"]);
    assert!(!r.out.status.success(), "{}", show(&r.out));
    assert!(r.stderr().contains("would pass the 10 s per pull"), "{}", show(&r.out));
    assert_eq!(blob_events(&proxy).len(), 1, "a 30 s wait does not fit a 10 s budget: {:#?}", proxy.events());
}

#[test]
fn other_4xx_are_not_retried() {
    for (status, on) in
        [(404, "/blobs/"), (401, "/blobs/"), (403, "/blobs/"), (404, "/manifests/"), (400, "/manifests/")]
    {
        let (_reg, proxy) = setup(Rules {
            fail_first: u32::MAX,
            fail_status: Some(status),
            fail_matching: Some(on.into()),
            ..Rules::default()
        });
        let r = fetch(&proxy, &[]);
        assert!(!r.out.status.success(), "{status} on {on}: {}", show(&r.out));
        assert!(r.stderr().contains(&format!("HTTP {status}")), "{status} on {on}: {}", show(&r.out));
        assert!(!r.stderr().contains("retry 1"), "{status} on {on} was retried: {}", show(&r.out));
        let hits = proxy.events().iter().filter(|e| e.line.contains(on)).count();
        assert_eq!(hits, 1, "{status} on {on}: {:#?}", proxy.events());
    }
}

#[test]
fn https_to_a_plain_http_registry_is_not_retried() {
    let (reg, _proxy) = setup(Rules::default());
    let r = fetch_via(&reg.host(), &[]);
    assert!(!r.out.status.success(), "{}", show(&r.out));
    assert!(r.stderr().contains("TLS failed (not retried)"), "{}", show(&r.out));
    assert!(r.stderr().contains("--insecure-registry"), "{}", show(&r.out));
    assert!(!r.stderr().contains("retry 1"), "{}", show(&r.out));
}

#[test]
fn daemon_start_jitter_waits_before_the_first_pull_and_yields_to_sigterm() {
    use std::process::{Command, Stdio};
    let root = tempfile::tempdir().expect("root");
    let log = root.path().join("daemon.log");
    let mut child = Command::new(kata_addons_tests::kata_addons_bin())
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", root.path())
        .env("ADDON_IMAGE", "127.0.0.1:1/never/contacted:1")
        .env("ADDON_PROVIDER", "tdx")
        .env("ADDON_KERNEL_PATH", "/boot/vmlinuz")
        .args(["daemon", "--start-jitter", "3600", "--root"])
        .arg(root.path())
        .arg("--ready-file")
        .arg(root.path().join("ready"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("spawn daemon");
    let mut text = String::new();
    for _ in 0..600 {
        text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("start-up jitter") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(text.contains("start-up jitter: waiting") && text.contains("of at most 3600 s"), "{text}");
    let killed = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill");
    assert!(killed.success());
    let status = child.wait().expect("wait");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.code(), Some(0), "{text}");
    // The signal came during the jitter wait: the wait is abandoned, nothing else ran.
    let after_jitter = &text[text.find("start-up jitter").unwrap_or(0)..];
    assert!(after_jitter.contains("SIGTERM while busy: the work in progress is abandoned"), "{text}");
    assert!(!text.contains("pulling") && !text.contains("resolving"), "{text}");
    assert!(!root.path().join("ready").exists(), "not ready: nothing was installed");

    let out = run_kata(&["daemon", "--start-jitter", "-1"]);
    assert!(!out.status.success(), "{}", show(&out));
}

/// What bench/fleet requires of every node: an install reads the manifest once (the
/// resolution made for the install decision is the one fetched from) and only the layer
/// holding the file; with `--insecure-registry` the HTTPS attempt against the plain-HTTP
/// proxy is refused at once, so no request is repeated.
#[test]
fn install_reads_the_manifest_once_and_only_the_needed_layer() {
    let (_reg, proxy) = setup(Rules::default());
    let node = kata_addons_tests::node::Node::new();
    let home = tempfile::tempdir().expect("temp HOME");
    let h = proxy.host();
    let image = format!("{h}/k:1");
    let root = node.root().to_str().expect("utf8").to_string();
    let cache = tempfile::tempdir().expect("cache");
    let out = std::process::Command::new(kata_addons_tests::kata_addons_bin())
        .args(["--cache-dir", cache.path().to_str().expect("utf8"), "install", "--root", &root])
        .args(["--insecure-registry", &h])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home.path())
        .env("ADDON_IMAGE", &image)
        .env("ADDON_KERNEL_PATH", "/boot/vmlinuz")
        .env("ADDON_PROVIDER", "tdx")
        .output()
        .expect("run kata-addons");
    assert!(out.status.success(), "{}", show(&out));
    let manifests = proxy.requests_matching("/manifests/");
    assert_eq!(manifests.len(), 1, "manifest requests: {manifests:#?}");
    let blobs = proxy.requests_matching("/blobs/");
    assert_eq!(blobs.len(), 1, "blob requests (only the top layer is needed): {blobs:#?}");
}

// ---------------------------------------------------------------------------------------
// Failing fast: dead endpoints are left at once, stalls and trickles are cut,
// a failed endpoint is not contacted again in one install, and the pull deadline covers
// every wait. No timing: the errors, the contact counts and the flags are checked.

fn conf_file(text: &str) -> tempfile::NamedTempFile {
    let conf = tempfile::NamedTempFile::new().expect("conf");
    std::fs::write(conf.path(), text).expect("write conf");
    conf
}

#[test]
fn every_endpoint_refusing_fails_at_once_naming_each_endpoint() {
    use kata_addons_tests::registry::free_port;
    let (src, m1, m2) = (free_port(), free_port(), free_port());
    let conf = conf_file(&format!(
        "[[registry]]\nprefix = \"example.invalid/lib\"\nlocation = \"127.0.0.1:{src}/lib\"\ninsecure = true\n\
         [[registry.mirror]]\nlocation = \"127.0.0.1:{m1}/m\"\ninsecure = true\n\
         [[registry.mirror]]\nlocation = \"127.0.0.1:{m2}/m2\"\n"
    ));
    let c = conf.path().to_str().expect("utf8");
    let f = fetch_via("example.invalid/lib", &["--registries-conf", c]);
    let err = f.stderr();
    assert_eq!(f.out.status.code(), Some(1), "{}", show(&f.out));
    for (port, repo) in [(src, "lib/k"), (m1, "m/k"), (m2, "m2/k")] {
        assert!(err.contains(&format!("127.0.0.1:{port}/{repo}")), "the error names 127.0.0.1:{port}: {err}");
    }
    assert!(err.contains("cannot connect (not retried)"), "{err}");
    assert!(!err.contains("retry 1 of"), "a refused connection is not retried: {err}");
}

#[test]
fn a_stalled_mirror_is_cut_and_not_contacted_again_in_one_install() {
    let (reg, stalled) = setup(Rules { stall: true, ..Rules::default() });
    let conf = conf_file(&format!(
        "[[registry]]\nprefix = \"example.invalid/lib\"\nlocation = \"{}\"\ninsecure = true\n\
         [[registry.mirror]]\nlocation = \"{}\"\ninsecure = true\n",
        reg.host(),
        stalled.host()
    ));
    let node = kata_addons_tests::node::Node::new();
    let cache = tempfile::tempdir().expect("cache");
    let out = std::process::Command::new(kata_addons_tests::kata_addons_bin())
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", cache.path())
        .env("ADDON_IMAGE", "example.invalid/lib/k:1")
        .env("ADDON_KERNEL_PATH", "/boot/vmlinuz")
        .arg("--cache-dir")
        .arg(cache.path())
        .args(["install", "--root"])
        .arg(node.root())
        .args(["--registries-conf", conf.path().to_str().expect("utf8"), "--timeout", "3"])
        .output()
        .expect("run install");
    assert!(out.status.success(), "{}", show(&out));
    // One install resolves, checks trust and fetches: the stalled mirror is tried once
    // (HTTPS, then plain HTTP as it is insecure) and then remembered.
    assert!(stalled.connections() <= 3, "the stalled mirror was contacted {} times", stalled.connections());
    assert!(stalled.connections() >= 1, "the mirror was not tried");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not retried"), "{err}");
}

#[test]
fn a_trickling_blob_is_cut_below_the_minimum_rate() {
    let (_reg, proxy) = setup(Rules { trickle_blobs: Some(Duration::from_millis(500)), ..Rules::default() });
    let f = fetch(&proxy, &["--timeout", "2"]);
    assert_eq!(f.out.status.code(), Some(1), "{}", show(&f.out));
    let err = f.stderr();
    assert!(err.contains("too slow") && err.contains("the minimum is 1024 bytes/s"), "{err}");
    assert!(err.contains("stalled or was too slow 2 times"), "cut, resumed once, cut again: {err}");
    assert!(blob_events(&proxy).len() <= 3, "{:?}", proxy.requests());
    assert!(std::fs::read_dir(f.dest.path()).expect("dest").next().is_none(), "nothing written");
}

#[test]
fn the_pull_deadline_covers_retry_after_waits() {
    let (_reg, proxy) = setup(Rules { fail_first: 1000, retry_after: Some("2".into()), ..Rules::default() });
    let f = fetch(&proxy, &["--pull-deadline", "3"]);
    assert_eq!(f.out.status.code(), Some(1), "{}", show(&f.out));
    let err = f.stderr();
    assert!(err.contains("pull deadline of 3 s (--pull-deadline)"), "{err}");
    // Retry-After was honoured until the deadline: at least one wait happened.
    assert_waited(&proxy.events(), Duration::from_secs(2));
}
