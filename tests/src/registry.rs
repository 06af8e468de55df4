//! A real `docker-registry` (distribution 2.x) for tests: 127.0.0.1, free port, temp
//! storage, optional htpasswd auth and TLS. Killed when dropped, even if the test fails.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::image::Image;
use crate::sha256_hex;
use crate::tls::TestCa;

/// Path of the registry binary (`$DOCKER_REGISTRY_BIN` or `/usr/bin/docker-registry`).
pub fn registry_bin() -> PathBuf {
    std::env::var_os("DOCKER_REGISTRY_BIN").map(PathBuf::from).unwrap_or_else(|| "/usr/bin/docker-registry".into())
}

/// A free TCP port on 127.0.0.1 (bound then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port")
}

/// Options for [`Registry::start_with`].
#[derive(Default)]
pub struct RegistryConfig {
    /// Require HTTP basic auth with this user and password (htpasswd, bcrypt).
    pub htpasswd: Option<(String, String)>,
    /// Serve TLS with a certificate from this CA.
    pub tls: Option<TestCa>,
    /// With `tls`: require a client certificate signed by the same CA (mutual TLS).
    pub client_auth: bool,
    /// Run as a pull-through cache of this registry URL (distribution's `proxy.remoteurl`).
    pub proxy_remote: Option<String>,
}

/// A running registry. Dropping it kills the process and removes its storage.
pub struct Registry {
    child: Child,
    /// Address it listens on.
    pub addr: SocketAddr,
    /// Temp directory with config, storage and log.
    pub dir: tempfile::TempDir,
    /// Whether it serves TLS.
    pub tls: bool,
}

impl Registry {
    /// An anonymous plain-HTTP registry.
    pub fn start() -> Self {
        Self::start_with(RegistryConfig::default())
    }

    /// A registry with the given options.
    pub fn start_with(cfg: RegistryConfig) -> Self {
        let mut last_err = String::new();
        for _ in 0..5 {
            let dir = tempfile::tempdir().expect("registry temp dir");
            let storage = dir.path().join("storage");
            std::fs::create_dir_all(&storage).expect("storage dir");
            let port = free_port();
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
            let mut yaml = format!(
                "version: 0.1\nlog:\n  level: info\n  formatter: text\n  accesslog:\n    disabled: false\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n  secret: test-secret\n",
                storage.display()
            );
            if let Some(ca) = &cfg.tls {
                yaml.push_str(&format!(
                    "  tls:\n    certificate: {}\n    key: {}\n",
                    ca.server_cert.display(),
                    ca.server_key.display()
                ));
                if cfg.client_auth {
                    yaml.push_str(&format!("    clientcas:\n      - {}\n", ca.ca_cert.display()));
                }
            }
            if let Some(remote) = &cfg.proxy_remote {
                yaml.push_str(&format!("proxy:\n  remoteurl: {remote}\n"));
            }
            if let Some((user, pass)) = &cfg.htpasswd {
                let hash = bcrypt::hash(pass, 4).expect("bcrypt");
                let htpasswd = dir.path().join("htpasswd");
                std::fs::write(&htpasswd, format!("{user}:{hash}\n")).expect("htpasswd");
                yaml.push_str(&format!("auth:\n  htpasswd:\n    realm: test\n    path: {}\n", htpasswd.display()));
            }
            let config = dir.path().join("config.yml");
            std::fs::write(&config, yaml).expect("registry config");
            let log = std::fs::File::create(dir.path().join("registry.log")).expect("log file");
            let child = Command::new(registry_bin())
                .arg("serve")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .spawn()
                .expect("spawn docker-registry (apt install docker-registry)");
            let mut reg = Registry { child, addr, dir, tls: cfg.tls.is_some() };
            if reg.wait_ready(Duration::from_secs(10)) {
                return reg;
            }
            // Probably a port race: dropping `reg` kills it; try another port.
            last_err = reg.log();
        }
        panic!("docker-registry did not start: {last_err}");
    }

    fn wait_ready(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// The registry's log (including its access log).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// Request lines of the access log containing `needle` (e.g. `/blobs/sha256:…`).
    pub fn requests_matching(&self, needle: &str) -> Vec<String> {
        self.log().lines().filter(|l| l.contains("\"GET ") && l.contains(needle)).map(str::to_string).collect()
    }

    fn v2(&self) -> PathBuf {
        self.dir.path().join("storage/docker/registry/v2")
    }

    /// Stores `data` as the blob `digest` in `repo` — the digest is not checked, so a test
    /// can store tampered content.
    pub fn put_blob_raw(&self, repo: &str, digest: &str, data: &[u8]) {
        let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
        let blob = self.v2().join("blobs/sha256").join(&hex[..2]).join(hex);
        std::fs::create_dir_all(&blob).expect("blob dir");
        std::fs::write(blob.join("data"), data).expect("blob data");
        write_link(&self.v2().join("repositories").join(repo).join("_layers/sha256").join(hex), digest);
    }

    /// Stores a manifest (or index) in `repo`, tagged `tag` if given; returns its digest.
    pub fn put_manifest(&self, repo: &str, tag: Option<&str>, manifest: &[u8]) -> String {
        let hex = sha256_hex(manifest);
        let digest = format!("sha256:{hex}");
        let blob = self.v2().join("blobs/sha256").join(&hex[..2]).join(&hex);
        std::fs::create_dir_all(&blob).expect("blob dir");
        std::fs::write(blob.join("data"), manifest).expect("manifest data");
        let m = self.v2().join("repositories").join(repo).join("_manifests");
        write_link(&m.join("revisions/sha256").join(&hex), &digest);
        if let Some(tag) = tag {
            write_link(&m.join("tags").join(tag).join("current"), &digest);
            write_link(&m.join("tags").join(tag).join("index/sha256").join(&hex), &digest);
        }
        digest
    }

    /// Stores an image (blobs and manifest) as `repo:tag`; returns the manifest digest.
    pub fn push(&self, repo: &str, tag: &str, img: &Image) -> String {
        self.push_untagged(repo, img);
        self.put_manifest(repo, Some(tag), &img.manifest())
    }

    /// Stores an image's blobs and manifest without a tag.
    pub fn push_untagged(&self, repo: &str, img: &Image) -> String {
        for l in &img.layers {
            self.put_blob_raw(repo, &l.digest, &l.data);
        }
        self.put_blob_raw(repo, &img.config.digest, &img.config.data);
        self.put_manifest(repo, None, &img.manifest())
    }
}

fn write_link(dir: &Path, digest: &str) {
    std::fs::create_dir_all(dir).expect("link dir");
    std::fs::write(dir.join("link"), digest).expect("link");
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Registry {
    /// Stores `data` as the manifest `digest` in `repo` (digest not checked) and tags it.
    pub fn put_manifest_raw(&self, repo: &str, tag: Option<&str>, digest: &str, data: &[u8]) {
        let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
        let blob = self.v2().join("blobs/sha256").join(&hex[..2]).join(hex);
        std::fs::create_dir_all(&blob).expect("blob dir");
        std::fs::write(blob.join("data"), data).expect("manifest data");
        let m = self.v2().join("repositories").join(repo).join("_manifests");
        write_link(&m.join("revisions/sha256").join(hex), digest);
        if let Some(tag) = tag {
            write_link(&m.join("tags").join(tag).join("current"), digest);
            write_link(&m.join("tags").join(tag).join("index/sha256").join(hex), digest);
        }
    }
}
