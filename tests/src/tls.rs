//! A throw-away CA and a server certificate for 127.0.0.1/localhost, made with `openssl`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

/// Files of a test CA and the server certificate it signed.
#[derive(Clone)]
pub struct TestCa {
    /// Keeps the directory alive.
    _dir: Arc<tempfile::TempDir>,
    /// CA certificate (PEM).
    pub ca_cert: PathBuf,
    /// Server certificate (PEM).
    pub server_cert: PathBuf,
    /// Server key (PEM).
    pub server_key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").args(args).current_dir(dir).output().expect("run openssl (apt install openssl)");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A new P-256 key `key` and a certificate request `csr` for `subject`, in `dir`.
fn key_and_csr(dir: &Path, key: &str, csr: &str, subject: &str) {
    openssl(
        dir,
        &["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out", csr]
            .into_iter()
            .chain(["-subj", subject])
            .collect::<Vec<_>>(),
    );
}

/// Signs `csr` with the CA `ca`/`ca_key` into `out` (2 days), with the extensions in `ext`
/// (written to `dir/ext.cnf`) and the serial file `serial`.
fn sign(dir: &Path, csr: &str, ca: &Path, ca_key: &Path, out: &str, ext: &str, serial: &str) {
    std::fs::write(dir.join("ext.cnf"), ext).expect("ext.cnf");
    let (ca, ca_key) = (ca.to_str().expect("utf8"), ca_key.to_str().expect("utf8"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            ca,
            "-CAkey",
            ca_key,
            "-CAcreateserial",
            "-CAserial",
            serial,
            "-out",
            out,
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
    );
}

impl TestCa {
    /// Makes a new CA and a server certificate for `IP:127.0.0.1, DNS:localhost`.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("ca dir");
        let d = dir.path();
        openssl(
            d,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=kata-addons test CA",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        );
        key_and_csr(d, "server.key", "server.csr", "/CN=localhost");
        sign(
            d,
            "server.csr",
            &d.join("ca.pem"),
            &d.join("ca.key"),
            "server.pem",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
            "ca.srl",
        );
        TestCa {
            ca_cert: d.join("ca.pem"),
            server_cert: d.join("server.pem"),
            server_key: d.join("server.key"),
            _dir: Arc::new(dir),
        }
    }

    /// A client certificate signed by this CA (`clientAuth`), written as `client.cert` and
    /// `client.key` into `dir` (the containers-certs.d(5) names for mutual TLS).
    pub fn client_pair(&self, dir: &Path) {
        let ca_dir = self.ca_cert.parent().expect("ca dir").to_path_buf();
        let tmp = tempfile::tempdir().expect("client tmp");
        let t = tmp.path();
        key_and_csr(t, "client.key", "client.csr", "/CN=kata-addons test client");
        sign(
            t,
            "client.csr",
            &ca_dir.join("ca.pem"),
            &ca_dir.join("ca.key"),
            "client.cert",
            "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
            "client.srl",
        );
        std::fs::create_dir_all(dir).expect("client dir");
        std::fs::copy(t.join("client.cert"), dir.join("client.cert")).expect("copy client.cert");
        std::fs::copy(t.join("client.key"), dir.join("client.key")).expect("copy client.key");
    }

    /// A directory holding only `ca.crt`, for `--cert-dir`.
    pub fn cert_dir(&self) -> tempfile::TempDir {
        let d = tempfile::tempdir().expect("cert dir");
        std::fs::copy(&self.ca_cert, d.path().join("ca.crt")).expect("copy ca");
        d
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}
