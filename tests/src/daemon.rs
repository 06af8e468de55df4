//! Running `kata-addons daemon` in tests: a ConfigMap volume written the way the kubelet
//! writes it, the daemon process with its log file, waits on files and log lines (never
//! sleeps as synchronisation), and the JSON log lines.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::kata_addons_bin;

/// Writes a ConfigMap volume the way the kubelet does: data in a timestamped directory,
/// `..data` pointing at it, one symlink per key; updates swap `..data` atomically.
pub struct ConfigMapDir {
    dir: tempfile::TempDir,
    generation: u32,
}

impl ConfigMapDir {
    /// A volume holding `data`.
    pub fn new(data: &[(&str, &str)]) -> Self {
        let mut c = ConfigMapDir { dir: tempfile::tempdir().expect("cm dir"), generation: 0 };
        c.update(data);
        c
    }

    /// The volume's directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Replaces the data, as a ConfigMap edit does.
    pub fn update(&mut self, data: &[(&str, &str)]) {
        self.generation += 1;
        let gen_dir = format!("..2026_11_29_00_00_{:02}.{}", self.generation, self.generation);
        let full = self.path().join(&gen_dir);
        std::fs::create_dir(&full).expect("mkdir gen");
        for (k, v) in data {
            std::fs::write(full.join(k), v).expect("write key");
        }
        let tmp = self.path().join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&gen_dir, &tmp).expect("symlink");
        std::fs::rename(&tmp, self.path().join("..data")).expect("swap ..data");
        for (k, _) in data {
            let link = self.path().join(k);
            if std::fs::symlink_metadata(&link).is_err() {
                std::os::unix::fs::symlink(format!("..data/{k}"), &link).expect("key symlink");
            }
        }
        // Keys that disappeared: the kubelet removes their symlinks.
        for e in std::fs::read_dir(self.path()).expect("ls").flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with('.') && !data.iter().any(|(k, _)| *k == name) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// A running daemon, killed when dropped.
pub struct Daemon {
    /// The process.
    pub child: Child,
    /// Its stderr.
    pub log: PathBuf,
}

impl Daemon {
    /// `kata-addons daemon --poll-interval 0.2 --start-jitter 0 --root NODE --configmap-dir
    /// CM --ready-file READY`, stderr to `log`.
    pub fn start(node: &Path, cm: &Path, ready: &Path, log: PathBuf) -> Daemon {
        Daemon::spawn(&[], &[], node, Some(cm), ready, log)
    }

    /// A daemon with global flags `pre` (before `daemon`), daemon flags `args`, and the
    /// environment `env` (plus `PATH` and a temporary-enough `HOME`: the log's directory).
    pub fn spawn(pre: &[&str], args: &[&str], node: &Path, cm: Option<&Path>, ready: &Path, log: PathBuf) -> Daemon {
        Daemon::spawn_env(pre, args, &[], node, cm, ready, log)
    }

    /// [`Daemon::spawn`] with environment variables.
    pub fn spawn_env(
        pre: &[&str],
        args: &[&str],
        env: &[(&str, &str)],
        node: &Path,
        cm: Option<&Path>,
        ready: &Path,
        log: PathBuf,
    ) -> Daemon {
        let logf = std::fs::File::create(&log).expect("log file");
        let mut c = Command::new(kata_addons_bin());
        c.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", log.parent().unwrap_or(Path::new("/nonexistent")));
        for (k, v) in env {
            c.env(k, v);
        }
        c.args(pre).args(["daemon", "--poll-interval", "0.2", "--start-jitter", "0"]).args(args);
        c.arg("--root").arg(node);
        if let Some(cm) = cm {
            c.arg("--configmap-dir").arg(cm);
        }
        let child = c.arg("--ready-file").arg(ready).stdout(Stdio::null()).stderr(logf).spawn().expect("spawn daemon");
        Daemon { child, log }
    }

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `signal` (`TERM`, `INT`, `KILL`) with kill(1).
    pub fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .args([format!("-{signal}"), self.child.id().to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill -{signal} failed");
    }

    /// Waits for the exit (a failure detector: `timeout` is generous) and returns the code.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let start = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                return s.code();
            }
            assert!(start.elapsed() < timeout, "the daemon did not exit within {timeout:?}:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `f` until it holds; panics with `log()` after `timeout` (a failure detector).
pub fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool, log: impl Fn() -> String) {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out waiting for {what}; daemon log:\n{}", log());
}

/// JSON log lines of a `--log-format json` log whose `message` contains `needle`, at
/// every level.
pub fn json_lines_with(log: &str, needle: &str) -> Vec<serde_json::Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["message"].as_str().is_some_and(|m| m.contains(needle)))
        .collect()
}

/// [`json_lines_with`] at INFO and above.
pub fn log_lines_with(log: &str, needle: &str) -> Vec<serde_json::Value> {
    json_lines_with(log, needle).into_iter().filter(|v| v["level"] != "DEBUG" && v["level"] != "TRACE").collect()
}
