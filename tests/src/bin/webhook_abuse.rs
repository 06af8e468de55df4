//! Abuse bench for `kata-addons webhook` (run by `bench/webhook --abuse`): starts the
//! binary (`$KATA_ADDONS_BIN`, else the debug build) with its default limits for each
//! scenario — silent HTTP/1.1 connections, silent HTTP/2 connections (preface + SETTINGS),
//! trickling bodies, a flood of 3 MiB bodies, and all of them at once — and prints, as a
//! Markdown table, the server's peak RSS (`VmHWM`), the latency of `/healthz` on the probe
//! listener and of a valid review from a well-behaved client during the abuse.
//!
//!   webhook_abuse [SECONDS_PER_SCENARIO]

use std::time::{Duration, Instant};

use bytes::Bytes;
use kata_addons_tests::abuse::{Idle, big_review, open_idle, post_from, source, trickle};
use kata_addons_tests::admission::{Client, NAME, Proto, Webhook, configmap, create, full};
use kata_addons_tests::tls::TestCa;

#[derive(Clone, Copy)]
struct Scenario {
    name: &'static str,
    idle_h1: usize,
    idle_h2: usize,
    slow: usize,
    flood: usize,
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted.get(((sorted.len().max(1) - 1) as f64 * p).round() as usize).copied().unwrap_or_default()
}

/// Opens `n` silent connections, 50 per source address from address `first` on.
async fn idle(client: &Client, n: usize, proto: Proto, first: usize) -> (Vec<Idle>, usize) {
    let (mut held, mut refused) = (Vec::new(), 0);
    for i in 0..n {
        match open_idle(client, Some(source(first + i / 50)), proto).await {
            Ok(c) => held.push(c),
            Err(_) => refused += 1,
        }
    }
    (held, refused)
}

async fn run(s: Scenario, secs: f64, hook: &Webhook, client: Client) -> String {
    let (h1, r1) = idle(&client, s.idle_h1, Proto::Http1, 0).await;
    let (h2, r2) = idle(&client, s.idle_h2, Proto::Http2, 20).await;
    let stop = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for i in 0..s.slow {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let body = trickle(3 << 20, 1024, Duration::from_millis(200));
            tokio::time::timeout_at(stop.into(), post_from(&client, Some(source(40 + i % 16)), Proto::Http1, body))
                .await
                .unwrap_or(Ok(0))
        }));
    }
    let bodies = [big_review(3 << 20, false), big_review(3 << 20, true)];
    for i in 0..s.flood {
        let (client, body): (Client, Bytes) = (client.clone(), bodies[i % 2].clone());
        let proto = if i % 4 < 2 { Proto::Http1 } else { Proto::Http2 };
        tasks.push(tokio::spawn(async move {
            let mut last = Ok(0);
            while Instant::now() < stop {
                last = post_from(&client, Some(source(60 + i % 8)), proto, full(body.clone())).await;
            }
            last
        }));
    }
    let valid = serde_json::to_vec(&create(
        "uid-ok",
        &configmap(NAME, &[("addonImage", "quay.io/a/b:v1"), ("kernelPath", "/k")]),
    ))
    .expect("json");
    let (mut probe, mut review, mut probe_fail, mut review_fail) = (Vec::new(), Vec::new(), 0, 0);
    while Instant::now() < stop {
        let t = Instant::now();
        match hook.probe("/healthz").await {
            Ok(200) => probe.push(t.elapsed()),
            _ => probe_fail += 1,
        }
        let t = Instant::now();
        match post_from(&client, Some(source(100)), Proto::Http2, full(valid.clone())).await {
            Ok(200) => review.push(t.elapsed()),
            _ => review_fail += 1,
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
    for t in tasks {
        let o = match t.await {
            Ok(Ok(0)) => "unfinished".to_string(),
            Ok(Ok(code)) => code.to_string(),
            Ok(Err(_)) => "reset".to_string(),
            Err(_) => "task".to_string(),
        };
        *outcomes.entry(o).or_default() += 1;
    }
    let peak = hook.peak_rss_kib();
    drop((h1, h2));
    probe.sort();
    review.sort();
    let outcomes: Vec<String> = outcomes.iter().map(|(k, v)| format!("{v}×{k}")).collect();
    format!(
        "| {} | {} | {} | {} / {} | {:.1} | {} / {} / {} ({} failed) | {} / {} ({} failed) |",
        s.name,
        s.idle_h1 + s.idle_h2 - r1 - r2,
        r1 + r2,
        s.slow,
        s.flood,
        peak as f64 / 1024.0,
        ms(pct(&probe, 0.5)),
        ms(pct(&probe, 0.99)),
        ms(probe.last().copied().unwrap_or_default()),
        probe_fail,
        ms(pct(&review, 0.5)),
        ms(pct(&review, 0.99)),
        review_fail,
    ) + &format!(" {} |", if outcomes.is_empty() { "-".to_string() } else { outcomes.join(", ") })
}

fn main() {
    let secs: f64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(10.0);
    let ca = TestCa::new();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let scenarios = [
        Scenario { name: "silent HTTP/1.1", idle_h1: 600, idle_h2: 0, slow: 0, flood: 0 },
        Scenario { name: "silent HTTP/2", idle_h1: 0, idle_h2: 600, slow: 0, flood: 0 },
        Scenario { name: "trickling bodies (5 KiB/s)", idle_h1: 0, idle_h2: 0, slow: 64, flood: 0 },
        Scenario { name: "3 MiB bodies, 120 clients", idle_h1: 0, idle_h2: 0, slow: 0, flood: 120 },
        Scenario { name: "all at once", idle_h1: 150, idle_h2: 150, slow: 32, flood: 120 },
    ];
    println!("{secs} s per scenario, default limits, server: {}", kata_addons_tests::kata_addons_bin().display());
    println!();
    println!(
        "| scenario | held open | refused | slow / flood clients | peak RSS MiB | /healthz (probe port) p50 / p99 / max ms | valid review p50 / p99 ms | abusive requests' outcomes |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |");
    for s in scenarios {
        let hook = Webhook::start(&[], &ca.server_cert, &ca.server_key, &[], &ca.ca_cert);
        let client = Client::new(hook.addr, &[&ca.ca_cert]);
        println!("{}", rt.block_on(run(s, secs, &hook, client)));
    }
}
