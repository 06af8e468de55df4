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
        openssl(
            d,
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=localhost",
            ],
        );
        std::fs::write(
            d.join("ext.cnf"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
        )
        .expect("ext.cnf");
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.pem",
                "-days",
                "2",
                "-extfile",
                "ext.cnf",
            ],
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
        openssl(
            t,
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                "client.key",
                "-out",
                "client.csr",
                "-subj",
                "/CN=kata-addons test client",
            ],
        );
        std::fs::write(t.join("ext.cnf"), "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n").expect("ext.cnf");
        let ca = ca_dir.join("ca.pem");
        let ca_key = ca_dir.join("ca.key");
        openssl(
            t,
            &[
                "x509",
                "-req",
                "-in",
                "client.csr",
                "-CA",
                ca.to_str().expect("utf8"),
                "-CAkey",
                ca_key.to_str().expect("utf8"),
                "-CAcreateserial",
                "-CAserial",
                "client.srl",
                "-out",
                "client.cert",
                "-days",
                "2",
                "-extfile",
                "ext.cnf",
            ],
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
