//! `--metrics-address` (docs/metrics.md) seen by a real Prometheus (Debian's package): a
//! daemon and a webhook started here on loopback are scraped every second, and the values
//! Prometheus' HTTP API returns after an install, a refused change and admission reviews
//! are checked; `promtool check metrics` lints the exposition. The endpoint under abuse
//! (a thousand idle or slow connections) stops neither reconciles nor admissions.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use kata_addons_tests::admission::{Client, NAME, Proto, Webhook, configmap, create};
use kata_addons_tests::daemon::{ConfigMapDir, Daemon, wait_for};
use kata_addons_tests::node::{Node, layout_with, noise};
use kata_addons_tests::prometheus::{self, Prometheus, free_port, get, promtool};
use kata_addons_tests::sha256_hex;
use kata_addons_tests::tls::TestCa;

const VALID: &[(&str, &str)] = &[("addonImage", "quay.io/example/addon:v1"), ("kernelPath", "/boot/vmlinuz")];

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

fn loopback() -> SocketAddr {
    format!("127.0.0.1:{}", free_port()).parse().expect("addr")
}

fn kernel_sha(node: &Node) -> Option<String> {
    let k = node.qemu_key("se", "kernel")?;
    std::fs::read(node.path(&k)).ok().map(|d| sha256_hex(&d))
}

/// `GET /metrics` (Prometheus text 0.0.4) from `addr`, checked by `promtool check metrics`.
fn scrape_and_lint(addr: SocketAddr) -> String {
    let (status, text) = get(addr, "/metrics", &[]).expect("scrape");
    assert_eq!(status, 200, "{text}");
    let dir = tempfile::tempdir().expect("tmp");
    let (ok, out) = promtool(&["check", "metrics"], Some(&text), dir.path());
    assert!(ok, "promtool check metrics:\n{out}\n{text}");
    // Every family has its HELP.
    for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
        let name = line.split_whitespace().nth(2).expect("name");
        assert!(text.contains(&format!("# HELP {name} ")), "{name} has no HELP:\n{text}");
    }
    text
}

#[test]
fn prometheus_sees_installs_refusals_and_admission_reviews() {
    assert!(prometheus::available(), "prometheus and promtool are missing: tests/run installs Debian's prometheus");
    let dir = tempfile::tempdir().expect("tmp");
    let k1 = noise(150_000, 41);
    layout_with(&dir.path().join("l1"), "m1", &[("vmlinuz", &k1)]);
    let img1 = format!("oci:{}:m1", dir.path().join("l1").display());
    let node = Node::new();
    let mut cm = ConfigMapDir::new(&[("addonImage", &img1), ("kernelPath", "/vmlinuz"), ("version", "v1.0")]);
    let ready = dir.path().join("ready");
    let daemon_metrics = loopback();
    let d = Daemon::spawn(
        &[],
        &["--metrics-address", &daemon_metrics.to_string()],
        node.root(),
        Some(cm.path()),
        &ready,
        dir.path().join("daemon.log"),
    );
    wait_for("readiness", Duration::from_secs(60), || ready.exists(), || d.log());
    assert_eq!(kernel_sha(&node), Some(sha256_hex(&k1)));

    let ca = TestCa::new();
    let hook_metrics = loopback();
    let hook = Webhook::start(
        &[],
        &ca.server_cert,
        &ca.server_key,
        &["--metrics-address", &hook_metrics.to_string()],
        &ca.ca_cert,
    );
    let client = Client::new(hook.addr, &[&ca.ca_cert]);
    let rt = rt();
    let allowed = rt.block_on(client.post(Proto::Http1, "/validate", &create("uid-ok", &configmap(NAME, VALID))));
    assert_eq!(allowed.status, 200);
    assert_eq!(allowed.json()["response"]["allowed"], true);
    let bad = configmap(NAME, &[VALID[0], VALID[1], ("provider", "sev")]);
    let denied = rt.block_on(client.post(Proto::Http2, "/validate", &create("uid-bad", &bad)));
    assert_eq!(denied.json()["response"]["allowed"], false);

    let prom = Prometheus::start(&[("daemon", daemon_metrics), ("webhook", hook_metrics)]);
    let logs = || format!("daemon:\n{}\nwebhook:\n{}\nprometheus:\n{}", d.log(), hook.logs(), prom.logs());
    let t = Duration::from_secs(60);

    // After the install.
    let (labels, v) = prom.wait_for("kata_addons_installed_info{job=\"daemon\"}", t, |v| v == 1.0, logs);
    assert_eq!(v, 1.0);
    let state = std::fs::read_to_string(node.path("/etc/kata-containers/addons/state.json")).unwrap_or_default();
    assert_eq!(labels["version"], "v1.0", "{labels:?}");
    assert_eq!(labels["image"], img1.as_str(), "{labels:?}");
    assert_eq!(labels["provider"], "se", "{labels:?}");
    let digest = labels["digest"].as_str().expect("digest label");
    assert!(digest.starts_with("sha256:") && (state.is_empty() || state.contains(digest)), "{labels:?}");
    assert!(!labels.contains_key("runtime_class"), "no RuntimeClass: an empty label: {labels:?}");
    prom.wait_for("kata_addons_ready{job=\"daemon\"}", t, |v| v == 1.0, logs);
    prom.wait_for("kata_addons_reconcile_total{result=\"installed\"}", t, |v| v == 1.0, logs);
    prom.wait_for("kata_addons_reconcile_total{result=\"refused\"}", t, |v| v == 0.0, logs);
    prom.wait_for("kata_addons_backoff_seconds", t, |v| v == 0.0, logs);
    prom.wait_for("kata_addons_pull_bytes_total", t, |v| v >= k1.len() as f64, logs);
    prom.wait_for("kata_addons_pull_duration_seconds_count", t, |v| v == 1.0, logs);
    let (_, success) = prom.wait_for("kata_addons_last_success_timestamp_seconds", t, |v| v > 1.0e9, logs);
    prom.wait_for("kata_addons_last_failure_timestamp_seconds", t, |v| v == 0.0, logs);
    assert!(prom.query("kata_addons_node_kata_release_info").is_empty(), "no RPM database: no release");

    // A refused change: counted, the node keeps the last good addon and stays ready (the
    // readiness file's decision: docs/daemon.md#readiness).
    cm.update(&[("addonImage", &img1), ("kernelPath", "/vmlinuz"), ("provider", "sev")]);
    wait_for("the refusal", t, || d.log().contains("keeps the last good addon"), || d.log());
    prom.wait_for("kata_addons_reconcile_total{result=\"refused\"}", t, |v| v == 1.0, logs);
    prom.wait_for("kata_addons_last_failure_timestamp_seconds", t, |v| v >= success, logs);
    prom.wait_for("kata_addons_ready", t, |v| v == 1.0, logs);
    prom.wait_for("kata_addons_installed_info{version=\"v1.0\"}", t, |v| v == 1.0, logs);
    assert_eq!(kernel_sha(&node), Some(sha256_hex(&k1)));

    // The webhook's reviews.
    prom.wait_for("kata_addons_webhook_requests_total{decision=\"allowed\"}", t, |v| v == 1.0, logs);
    prom.wait_for("kata_addons_webhook_requests_total{decision=\"denied\"}", t, |v| v == 1.0, logs);
    prom.wait_for("kata_addons_webhook_requests_total{decision=\"error\"}", t, |v| v == 0.0, logs);
    let warnings = allowed.json()["response"]["warnings"].as_array().map_or(0, Vec::len) as f64;
    assert!(warnings > 0.0);
    prom.wait_for("kata_addons_webhook_warnings_total", t, |v| v == warnings, logs);
    prom.wait_for("kata_addons_webhook_request_duration_seconds_count", t, |v| v == 2.0, logs);
    prom.wait_for("sum(kata_addons_webhook_rejected_connections_total)", t, |v| v == 0.0, logs);

    // The expositions pass promtool's lint, in both formats.
    let daemon_text = scrape_and_lint(daemon_metrics);
    assert!(daemon_text.contains("kata_addons_reconcile_total{result=\"refused\"} 1"), "{daemon_text}");
    scrape_and_lint(hook_metrics);
    let (status, om) =
        get(hook_metrics, "/metrics", &["Accept: application/openmetrics-text;version=1.0.0"]).expect("scrape");
    assert_eq!(status, 200);
    assert!(om.ends_with("# EOF\n"), "OpenMetrics when asked:\n{om}");
    assert_eq!(get(hook_metrics, "/nope", &[]).expect("get").0, 404);
}

/// Opens `n` connections to `addr` from loopback sources other than 127.0.0.1; every
/// other one sends the start of a request head and stops (a slow request).
async fn flood(addr: SocketAddr, n: usize) -> Vec<tokio::net::TcpStream> {
    use tokio::io::AsyncWriteExt;
    let mut conns = Vec::new();
    for i in 0..n {
        let from: IpAddr = kata_addons_tests::abuse::source(i % 200);
        let s = tokio::net::TcpSocket::new_v4().expect("socket");
        if s.bind(SocketAddr::new(from, 0)).is_err() {
            continue;
        }
        if let Ok(Ok(mut c)) = tokio::time::timeout(Duration::from_secs(2), s.connect(addr)).await {
            if i % 2 == 1 {
                let _ = c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ").await;
            }
            conns.push(c);
        }
    }
    conns
}

#[test]
fn the_metrics_endpoint_under_abuse_stops_neither_reconciles_nor_admissions() {
    assert!(prometheus::available(), "prometheus and promtool are missing: tests/run installs Debian's prometheus");
    let dir = tempfile::tempdir().expect("tmp");
    let (k1, k2) = (noise(120_000, 51), noise(120_000, 52));
    layout_with(&dir.path().join("l1"), "a1", &[("vmlinuz", &k1)]);
    layout_with(&dir.path().join("l2"), "a2", &[("vmlinuz", &k2)]);
    let img1 = format!("oci:{}:a1", dir.path().join("l1").display());
    let img2 = format!("oci:{}:a2", dir.path().join("l2").display());
    let node = Node::new();
    let mut cm = ConfigMapDir::new(&[("addonImage", &img1), ("kernelPath", "/vmlinuz")]);
    let ready = dir.path().join("ready");
    let daemon_metrics = loopback();
    let d = Daemon::spawn(
        &[],
        &["--metrics-address", &daemon_metrics.to_string()],
        node.root(),
        Some(cm.path()),
        &ready,
        dir.path().join("daemon.log"),
    );
    wait_for("readiness", Duration::from_secs(60), || ready.exists(), || d.log());
    let ca = TestCa::new();
    let hook_metrics = loopback();
    let hook = Webhook::start(
        &[],
        &ca.server_cert,
        &ca.server_key,
        &["--metrics-address", &hook_metrics.to_string()],
        &ca.ca_cert,
    );
    let client = Client::new(hook.addr, &[&ca.ca_cert]);
    let rt = rt();

    let held = rt.block_on(async {
        let mut a = flood(daemon_metrics, 1000).await;
        a.extend(flood(hook_metrics, 1000).await);
        a
    });
    assert!(held.len() >= 1000, "the flood opened {} connections", held.len());

    // The daemon still follows a change, and the webhook still reviews.
    cm.update(&[("addonImage", &img2), ("kernelPath", "/vmlinuz")]);
    wait_for("the upgrade", Duration::from_secs(60), || kernel_sha(&node) == Some(sha256_hex(&k2)), || d.log());
    for i in 0..5 {
        let r = rt.block_on(client.post(Proto::Http1, "/validate", &create(&format!("u{i}"), &configmap(NAME, VALID))));
        assert_eq!(r.status, 200, "{}", hook.logs());
    }
    // And a scraper from 127.0.0.1 still gets its answer (idle connections make room).
    for addr in [daemon_metrics, hook_metrics] {
        let (status, text) = get(addr, "/metrics", &[]).expect("scrape under abuse");
        assert_eq!(status, 200);
        assert!(text.contains("kata_addons_"), "{text}");
    }
    wait_for(
        "the second install counted",
        Duration::from_secs(30),
        || {
            get(daemon_metrics, "/metrics", &[])
                .is_ok_and(|(_, t)| t.contains("kata_addons_reconcile_total{result=\"installed\"} 2"))
        },
        || d.log(),
    );
    drop(held);
}

/// The PrometheusRule of host/deploy/base/monitoring.yaml.
fn prometheus_rule() -> serde_json::Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../host/deploy/base/monitoring.yaml");
    let text = std::fs::read_to_string(&path).expect("monitoring.yaml");
    let docs: Vec<serde_json::Value> = serde_norway::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).expect("YAML"))
        .collect();
    let rules: Vec<_> = docs.into_iter().filter(|d| d["kind"] == "PrometheusRule").collect();
    assert_eq!(rules.len(), 1, "one PrometheusRule");
    rules[0].clone()
}

#[test]
fn every_alert_passes_promtool_and_has_a_unit_test_and_a_runbook() {
    assert!(prometheus::available(), "prometheus and promtool are missing: tests/run installs Debian's prometheus");
    let rule = prometheus_rule();
    let dir = tempfile::tempdir().expect("tmp");
    let groups = serde_json::json!({ "groups": rule["spec"]["groups"] });
    std::fs::write(dir.path().join("rules.yaml"), serde_norway::to_string(&groups).expect("YAML")).expect("write");
    let tests = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("metrics/alerts.test.yaml");
    let test_text = std::fs::read_to_string(&tests).expect("alerts.test.yaml");
    std::fs::write(dir.path().join("alerts.test.yaml"), &test_text).expect("copy");
    let (ok, out) = promtool(&["check", "rules", "rules.yaml"], None, dir.path());
    assert!(ok, "promtool check rules:\n{out}");
    let (ok, out) = promtool(&["test", "rules", "alerts.test.yaml"], None, dir.path());
    assert!(ok, "promtool test rules:\n{out}");

    let doc = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/metrics.md"))
        .expect("docs/metrics.md");
    let mut alerts = Vec::new();
    for g in rule["spec"]["groups"].as_array().expect("groups") {
        for r in g["rules"].as_array().expect("rules") {
            let name = r["alert"].as_str().expect("every rule is an alert");
            for a in ["summary", "description"] {
                assert!(r["annotations"][a].as_str().is_some_and(|s| !s.is_empty()), "{name} has a {a}");
            }
            let anchor = name.to_lowercase();
            assert!(
                r["annotations"]["description"]
                    .as_str()
                    .is_some_and(|d| d.contains(&format!("docs/metrics.md#{anchor}"))),
                "{name}'s description names its runbook"
            );
            assert!(doc.contains(&format!("### {name}\n")), "docs/metrics.md has a runbook section `### {name}`");
            let fires = format!("alertname: {name}\n        exp_alerts:\n          - exp_labels:");
            assert!(test_text.contains(&fires), "alerts.test.yaml has a case where {name} fires");
            alerts.push(name.to_string());
        }
    }
    assert!(alerts.len() >= 5, "{alerts:?}");
}
