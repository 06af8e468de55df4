//! Runs the real binary and measures what it cost: peak RSS (the process's `VmHWM` from
//! `/proc/<pid>/status`, polled while it runs, and its `ru_maxrss`) and CPU time (user +
//! system). The binary runs under `/usr/bin/time`, which forks it from a small process:
//! `ru_maxrss` of a child spawned straight from the test would include the test process's
//! own memory (Linux carries the high-water mark of the pre-`exec` image over).

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What one run cost, and what it printed.
#[derive(Debug, Clone)]
pub struct Measured {
    /// Exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// Signal that ended it, if any.
    pub signal: Option<i32>,
    /// Peak resident set size, KiB (max of polled `VmHWM` and `ru_maxrss`).
    pub peak_rss_kib: u64,
    /// User + system CPU time.
    pub cpu: Duration,
    /// Wall time (for information only).
    pub wall: Duration,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Measured {
    /// Peak RSS in MiB.
    pub fn peak_rss_mib(&self) -> f64 {
        self.peak_rss_kib as f64 / 1024.0
    }

    /// One-line summary for messages.
    pub fn summary(&self) -> String {
        format!(
            "exit {:?} signal {:?}, peak RSS {:.1} MiB, CPU {:.2} s, wall {:.2} s\n--- stderr\n{}",
            self.code,
            self.signal,
            self.peak_rss_mib(),
            self.cpu.as_secs_f64(),
            self.wall.as_secs_f64(),
            self.stderr
        )
    }
}

fn vm_hwm_kib(pid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn child_of(pid: i32) -> Option<i32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// Runs `bin args…` (stdin closed, a temporary HOME), killing it after `limit` of wall time.
pub fn run_measured(bin: &Path, args: &[&str], limit: Duration) -> Measured {
    let home = tempfile::tempdir().expect("temp HOME");
    let report = home.path().join("time.out");
    let mut child = Command::new("/usr/bin/time")
        .arg("-f")
        .arg("%M %U %S")
        .arg("-o")
        .arg(&report)
        .arg(bin)
        .args(args)
        .env("HOME", home.path())
        .env_remove("REGISTRY_AUTH_FILE")
        .env_remove("XDG_RUNTIME_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn /usr/bin/time kata-addons");
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let t_out = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        s
    });
    let start = Instant::now();
    let mut hwm = 0u64;
    let mut target: Option<i32> = None;
    let mut killed = false;
    let status = loop {
        if target.is_none() {
            target = child_of(child.id() as i32);
        }
        if let Some(k) = target.and_then(vm_hwm_kib) {
            hwm = hwm.max(k);
        }
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if start.elapsed() > limit && !killed {
            killed = true;
            // SAFETY: a plain kill(2) of the measured process (or of `time` if not seen yet).
            unsafe { libc::kill(target.unwrap_or(child.id() as i32), libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let wall = start.elapsed();
    let stdout = String::from_utf8_lossy(&t_out.join().expect("stdout thread")).into_owned();
    let stderr = String::from_utf8_lossy(&t_err.join().expect("stderr thread")).into_owned();
    let text = std::fs::read_to_string(&report).unwrap_or_default();
    let signal =
        text.lines().find_map(|l| l.strip_prefix("Command terminated by signal ")).and_then(|s| s.trim().parse().ok());
    let last: Vec<&str> = text.lines().last().unwrap_or_default().split_whitespace().collect();
    let (maxrss, user, sys) = match last.as_slice() {
        [m, u, s] => (m.parse().unwrap_or(0u64), u.parse().unwrap_or(0f64), s.parse().unwrap_or(0f64)),
        _ => panic!("unexpected /usr/bin/time output: {text:?}"),
    };
    let code = if signal.is_some() { None } else { status.code() };
    drop(home);
    Measured {
        code,
        signal,
        peak_rss_kib: hwm.max(maxrss),
        cpu: Duration::from_secs_f64(user + sys),
        wall,
        stdout,
        stderr,
    }
}
