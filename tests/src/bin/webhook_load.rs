//! Load generator for `kata-addons webhook` (run by `bench/webhook`; a bin target, not an
//! example, so that building it does not pull the dev-dependencies' features into the runner): starts the binary
//! (`$KATA_ADDONS_BIN`, which bench/webhook sets to its release build) on 127.0.0.1 with a test CA, then for a valid
//! and an invalid review and each concurrency level keeps that many HTTPS connections busy
//! (one request in flight per connection, as many API server requests at once) and prints
//! requests/s and latency percentiles as a Markdown table.
//!
//!   webhook_load [SECONDS_PER_CELL] [CONNECTIONS...] [--http2]

use std::time::{Duration, Instant};

use kata_addons_tests::admission::{Client, NAME, Proto, Webhook, configmap, create};
use kata_addons_tests::tls::TestCa;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

/// Runs `conns` connections for `secs` seconds; returns sorted latencies and errors.
async fn cell(
    client: &Client,
    proto: Proto,
    body: &serde_json::Value,
    conns: usize,
    secs: f64,
) -> (Vec<Duration>, usize) {
    let stop = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let (client, body) = (client.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut errors = 0;
            let mut conn = match client.connect(proto).await {
                Ok(c) => c,
                Err(_) => return (lat, 1),
            };
            while Instant::now() < stop {
                let t = Instant::now();
                match conn.post("/validate?timeout=5s", &body).await {
                    Ok(r) if r.status == 200 => lat.push(t.elapsed()),
                    _ => errors += 1,
                }
            }
            (lat, errors)
        }));
    }
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (lat, e) = t.await.expect("task");
        all.extend(lat);
        errors += e;
    }
    all.sort();
    (all, errors)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let proto = if args.iter().any(|a| a == "--http2") { Proto::Http2 } else { Proto::Http1 };
    let nums: Vec<f64> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let secs = nums.first().copied().unwrap_or(5.0);
    let levels: Vec<usize> =
        if nums.len() > 1 { nums[1..].iter().map(|n| *n as usize).collect() } else { vec![1, 8, 64] };
    let ca = TestCa::new();
    let hook = Webhook::start(&[], &ca.server_cert, &ca.server_key, &[], &ca.ca_cert);
    let client = Client::new(hook.addr, &[&ca.ca_cert]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let valid = create(
        "bench-valid",
        &configmap(NAME, &[("addonImage", "quay.io/example/addon:v1"), ("kernelPath", "/boot/vmlinuz")]),
    );
    let invalid = create(
        "bench-invalid",
        &configmap(NAME, &[("addonImage", "Quay.io/X"), ("provider", "sev"), ("kernelpath", "/k")]),
    );
    // Check the answers once, and warm up.
    let v = rt.block_on(client.post(proto, "/validate", &valid)).json();
    assert_eq!(v["response"]["allowed"], true, "{v}");
    let i = rt.block_on(client.post(proto, "/validate", &invalid)).json();
    assert_eq!(i["response"]["allowed"], false, "{i}");
    rt.block_on(cell(&client, proto, &valid, 4, 1.0));
    println!("protocol: {proto:?}, {secs} s per cell, server: {}", kata_addons_tests::kata_addons_bin().display());
    println!();
    println!("| review | connections | requests/s | p50 ms | p99 ms | max ms | requests | errors |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (name, body) in [("valid (allowed + warnings)", &valid), ("invalid (denied, 3 violations)", &invalid)] {
        for &conns in &levels {
            let (lat, errors) = rt.block_on(cell(&client, proto, body, conns, secs));
            println!(
                "| {name} | {conns} | {:.0} | {} | {} | {} | {} | {errors} |",
                lat.len() as f64 / secs,
                ms(percentile(&lat, 0.50)),
                ms(percentile(&lat, 0.99)),
                ms(lat.last().copied().unwrap_or_default()),
                lat.len()
            );
        }
    }
    let status = std::fs::read_to_string(format!("/proc/{}/status", hook.pid())).unwrap_or_default();
    let field = |k: &str| {
        status.lines().find(|l| l.starts_with(k)).map(|l| l.split_whitespace().nth(1).unwrap_or("?").to_string())
    };
    println!();
    println!(
        "server memory: peak RSS (VmHWM) {} kB, RSS now {} kB, threads {}",
        field("VmHWM:").unwrap_or_default(),
        field("VmRSS:").unwrap_or_default(),
        field("Threads:").unwrap_or_default()
    );
    drop(hook);
}
