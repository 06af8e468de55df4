//! `throttle-proxy`: the fault proxy of the tests ([`kata_addons_tests::proxy`]) as a
//! program, for `bench/fleet`. It admits at most K blob downloads at once and answers 429
//! with `Retry-After` past that, listening on one loopback address per node so that the
//! bytes served can be counted per node.
//!
//! ```text
//! throttle-proxy --upstream 127.0.0.1:5000 --nodes 64 --max-blobs 4 --retry-after 1
//! ```
//!
//! Prints `listening PORT FIRST_IP` once ready; node `i` (0-based) uses `127.0.1.(i+1):PORT`.
//! Then reads commands on stdin: `stats` prints one JSON line (bytes and requests per node,
//! peak concurrent blob downloads); end of input stops it.

use std::io::BufRead;
use std::net::{IpAddr, SocketAddr};

use anyhow::{Context, Result, bail};
use kata_addons_tests::proxy::{Proxy, Rules};

fn main() -> Result<()> {
    let mut upstream: Option<SocketAddr> = None;
    let (mut nodes, mut max_blobs, mut retry_after) = (1usize, 4usize, "1".to_string());
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--upstream" => upstream = Some(value()?.parse().context("--upstream ADDR:PORT")?),
            "--nodes" => nodes = value()?.parse().context("--nodes N")?,
            "--max-blobs" => max_blobs = value()?.parse().context("--max-blobs K")?,
            "--retry-after" => retry_after = value()?,
            other => bail!("unknown argument {other:?} (see the source's header)"),
        }
    }
    let upstream = upstream.context("--upstream is required")?;
    if nodes == 0 || nodes > 250 {
        bail!("--nodes must be 1..=250");
    }
    let ips: Vec<IpAddr> = (1..=nodes).map(|i| IpAddr::from([127, 0, 1, i as u8])).collect();
    let rules = Rules { max_blobs: Some(max_blobs), retry_after: Some(retry_after), ..Rules::default() };
    let proxy = Proxy::start_on(upstream, rules, &ips);
    println!("listening {} {}", proxy.addr.port(), ips[0]);
    for line in std::io::stdin().lock().lines() {
        let line = line.context("reading stdin")?;
        if line.trim() == "stats" {
            let per_node: Vec<serde_json::Value> = proxy
                .served()
                .iter()
                .map(|(ip, s)| {
                    serde_json::json!({
                        "ip": ip.to_string(),
                        "requests": s.requests,
                        "throttled": s.throttled,
                        "blob_bytes": s.blob_bytes,
                        "manifest_bytes": s.manifest_bytes,
                        "other_bytes": s.other_bytes,
                    })
                })
                .collect();
            println!("{}", serde_json::json!({ "peak_blobs": proxy.peak_blobs(), "nodes": per_node }));
        }
    }
    Ok(())
}
