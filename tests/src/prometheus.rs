//! A real Prometheus (Debian's `prometheus` package) on loopback scraping the runners the
//! tests start, its HTTP API (`/api/v1/query`), plain HTTP GETs of `/metrics`, and
//! `promtool`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Whether `prometheus` and `promtool` are installed (tests/run installs Debian's package).
pub fn available() -> bool {
    ["prometheus", "promtool"].iter().all(|t| {
        Command::new(t).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
    })
}

/// A free loopback port (bound and released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// `GET path` on `addr` over HTTP/1.1 with `Connection: close` and extra header lines
/// (`"Accept: …"`): the status and the body.
pub fn get(addr: SocketAddr, path: &str, headers: &[&str]) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for h in headers {
        req.push_str(h);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
    Ok((status, if chunked { dechunk(body) } else { body.to_string() }))
}

/// The payload of a chunked HTTP/1.1 body.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
    }
    out
}

/// A query string value, percent-encoded.
fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A running Prometheus, killed when dropped.
pub struct Prometheus {
    child: Child,
    /// Its web listener.
    pub addr: SocketAddr,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Prometheus scraping each `(job, target)` every second, on a free loopback port.
    pub fn start(jobs: &[(&str, SocketAddr)]) -> Prometheus {
        let dir = tempfile::tempdir().expect("prometheus dir");
        let mut config = String::from(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nscrape_configs:\n",
        );
        for (job, target) in jobs {
            config.push_str(&format!("  - job_name: {job}\n    static_configs:\n      - targets: ['{target}']\n"));
        }
        let cfg = dir.path().join("prometheus.yml");
        std::fs::write(&cfg, config).expect("write prometheus.yml");
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
        let log = dir.path().join("prometheus.log");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("start prometheus");
        let p = Prometheus { child, addr, log, _dir: dir };
        let start = Instant::now();
        while !matches!(get(p.addr, "/-/ready", &[]), Ok((200, _))) {
            assert!(start.elapsed() < Duration::from_secs(60), "prometheus not ready in 60 s:\n{}", p.logs());
            std::thread::sleep(Duration::from_millis(100));
        }
        p
    }

    /// Its log.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The result vector of the instant query `q`: each series' labels and value.
    pub fn query(&self, q: &str) -> Vec<(serde_json::Map<String, Value>, f64)> {
        let (status, body) = get(self.addr, &format!("/api/v1/query?query={}", encode(q)), &[]).expect("query");
        assert_eq!(status, 200, "query {q}: {body}");
        let v: Value = serde_json::from_str(&body).expect("query answer is JSON");
        assert_eq!(v["status"], "success", "{body}");
        v["data"]["result"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| {
                let labels = r["metric"].as_object().cloned().unwrap_or_default();
                let value = r["value"][1].as_str().and_then(|s| s.parse().ok()).unwrap_or(f64::NAN);
                (labels, value)
            })
            .collect()
    }

    /// Waits until the query `q` has exactly one series whose value satisfies `ok`; returns
    /// its labels and value (`timeout` is a failure detector).
    pub fn wait_for(
        &self,
        q: &str,
        timeout: Duration,
        ok: impl Fn(f64) -> bool,
        log: impl Fn() -> String,
    ) -> (serde_json::Map<String, Value>, f64) {
        let start = Instant::now();
        loop {
            let r = self.query(q);
            if let [(labels, v)] = &r[..]
                && ok(*v)
            {
                return (labels.clone(), *v);
            }
            assert!(start.elapsed() < timeout, "{q}: {r:?} after {timeout:?}\n{}", log());
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `promtool args`, with `stdin` as its input when given: exit status and output.
pub fn promtool(args: &[&str], stdin: Option<&str>, dir: &Path) -> (bool, String) {
    let mut c = Command::new("promtool");
    c.args(args).current_dir(dir).stdout(Stdio::piped()).stderr(Stdio::piped());
    c.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    let mut child = c.spawn().expect("promtool");
    if let Some(input) = stdin {
        let mut w = child.stdin.take().expect("stdin");
        w.write_all(input.as_bytes()).expect("write promtool stdin");
    }
    let out = child.wait_with_output().expect("promtool output");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}
