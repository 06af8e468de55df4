//! TLS material per registry host, per containers-certs.d(5) and containers/image's
//! `tlsclientconfig.SetupCertificates`: in a certs directory, `*.crt` are extra CA roots,
//! `*.cert` + `*.key` pairs are client certificates (mutual TLS).
//!
//! Per-host directories `DIR/<host[:port]>/`: the first DIR (in order) that has an entry for
//! the host is used, the others are not read for that host; nothing under one host's
//! directory affects another host. Files directly in a `--cert-dir DIR` apply to every host
//! (skopeo's `--src-cert-dir`). A `.crt` that does not parse is reported and skipped (as
//! containers/image does); a `.cert` without its `.key` (or the reverse) fails that host.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::nodefs::{Budget, FilePath, Kind, MAX_CONFIG_FILE, NodeFs};

/// What reading one certificates directory may cost: a CA, a client certificate and its
/// key on a real node.
const BUDGET: Budget = Budget { entries: 4096, files: 256, bytes: 16 << 20, depth: 0 };

/// A client certificate and its key, PEM, as one buffer (`reqwest::Identity::from_pem`).
#[derive(Clone)]
pub(crate) struct ClientIdentity {
    /// The `.cert` file (for messages).
    pub cert_file: PathBuf,
    /// Certificate chain then private key, PEM.
    pub pem: Vec<u8>,
}

impl std::fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClientIdentity({})", self.cert_file.display())
    }
}

/// What TLS uses for one host.
#[derive(Debug, Clone, Default)]
pub(crate) struct HostTls {
    /// Extra CA roots (DER), added to the built-in ones.
    pub roots: Vec<Vec<u8>>,
    /// Client certificate to present, if any.
    pub identity: Option<ClientIdentity>,
    /// Directories that were read for this host (for messages).
    pub dirs: Vec<PathBuf>,
}

/// Where certificates come from.
#[derive(Debug, Clone)]
pub(crate) struct CertSources {
    /// The node files reader (node directories are resolved beneath its root).
    pub fs: NodeFs,
    /// Directories with `<host[:port]>/` subdirectories, in priority order.
    pub per_host: Vec<FilePath>,
    /// Directories whose files apply to every host (`--cert-dir`).
    pub global: Vec<FilePath>,
    /// The node's CA bundle, if present (added to the built-in roots for every host).
    pub bundle: Option<FilePath>,
}

/// Certificates of a PEM file; blocks that do not parse are reported (named) and skipped.
pub(crate) fn parse_pem_lenient(data: &[u8], file: &Path) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (i, cert) in CertificateDer::pem_slice_iter(data).enumerate() {
        match cert {
            Ok(der) if der.len() >= 64 && der[0] == 0x30 => out.push(der.to_vec()),
            Ok(_) => tracing::warn!("{}: certificate {} is not an X.509 certificate, ignored", file.display(), i + 1),
            Err(e) => tracing::warn!("{}: certificate {} does not parse ({e}), ignored", file.display(), i + 1),
        }
    }
    out
}

/// containers/image's `SetupCertificates` on one directory.
fn setup_dir(fs: &NodeFs, dir: &FilePath, tls: &mut HostTls) -> Result<()> {
    let walk = std::cell::RefCell::new(fs.walk("a certificates directory", BUDGET));
    let Some(entries) = walk.borrow_mut().list(dir).context("reading a certificates directory")? else {
        return Ok(());
    };
    let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
    tls.dirs.push(PathBuf::from(dir.to_string()));
    let read = |p: &FilePath| -> Result<Vec<u8>> {
        walk.borrow_mut()
            .read_all(p, MAX_CONFIG_FILE)?
            .with_context(|| format!("{p} does not exist (a dangling symlink?)"))
    };
    for e in &entries {
        let (name, path) = (e.name.as_str(), &e.path);
        let shown = PathBuf::from(path.to_string());
        if name.ends_with(".crt") {
            let data = read(path)?;
            let certs = parse_pem_lenient(&data, &shown);
            if certs.is_empty() {
                tracing::warn!("{path}: no certificate found in this .crt file, ignored");
            }
            tls.roots.extend(certs);
        } else if let Some(base) = name.strip_suffix(".cert") {
            let key_name = format!("{base}.key");
            if !names.contains(&key_name.as_str()) {
                bail!(
                    "{dir}: missing key {key_name} for client certificate {name} (CA certificates must use the extension .crt)"
                );
            }
            let key_path = dir.join(&key_name);
            let cert_pem = read(path)?;
            let key_pem = read(&key_path)?;
            let chain: Vec<_> = CertificateDer::pem_slice_iter(&cert_pem)
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| anyhow::anyhow!("{path}: client certificate does not parse: {e}"))?;
            if chain.is_empty() {
                bail!("{path}: no certificate in this client certificate file");
            }
            PrivateKeyDer::from_pem_slice(&key_pem)
                .map_err(|e| anyhow::anyhow!("{key_path}: private key does not parse: {e}"))?;
            if let Some(prev) = &tls.identity {
                tracing::warn!(
                    "{path}: a client certificate is already used ({}); only one is presented",
                    prev.cert_file.display()
                );
                continue;
            }
            let mut pem = cert_pem;
            pem.push(b'\n');
            pem.extend_from_slice(&key_pem);
            tls.identity = Some(ClientIdentity { cert_file: shown, pem });
        } else if let Some(base) = name.strip_suffix(".key") {
            let cert_name = format!("{base}.cert");
            if !names.contains(&cert_name.as_str()) {
                bail!("{dir}: missing client certificate {cert_name} for key {name}");
            }
        }
    }
    Ok(())
}

impl CertSources {
    /// The TLS material for `host` (`host[:port]`, as in the image reference).
    pub(crate) fn for_host(&self, host: &str) -> Result<HostTls> {
        let mut tls = HostTls::default();
        if let Some(b) = &self.bundle
            && let Some(data) = self.fs.read(b, MAX_CONFIG_FILE).context("reading the node CA bundle")?
        {
            tls.roots.extend(parse_pem_lenient(&data, &PathBuf::from(b.to_string())));
        }
        for g in &self.global {
            if self.fs.kind(g)? != Some(Kind::Dir) {
                bail!("--cert-dir {g}: not a directory");
            }
            setup_dir(&self.fs, g, &mut tls).with_context(|| format!("registry {host}: certificates"))?;
        }
        if host.contains('/') || host.starts_with('.') {
            bail!("invalid registry host {host:?}");
        }
        for d in &self.per_host {
            let hd = d.join(host);
            if self.fs.kind(&hd)?.is_some() {
                setup_dir(&self.fs, &hd, &mut tls).with_context(|| format!("registry {host}: certificates"))?;
                break;
            }
        }
        Ok(tls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cert_without_key_fails_only_that_host() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("a.example:5000");
        let b = d.path().join("b.example");
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(a.join("client.cert"), "x").unwrap();
        std::fs::write(b.join("bad.crt"), "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
            .unwrap();
        let s = CertSources {
            fs: NodeFs::open(Path::new("/")).unwrap(),
            per_host: vec![FilePath::Local(d.path().to_path_buf())],
            global: Vec::new(),
            bundle: None,
        };
        let e = format!("{:#}", s.for_host("a.example:5000").unwrap_err());
        assert!(e.contains("missing key client.key"), "{e}");
        let t = s.for_host("b.example").unwrap();
        assert!(t.roots.is_empty() && t.identity.is_none());
        assert!(s.for_host("c.example").unwrap().dirs.is_empty());
    }
}
