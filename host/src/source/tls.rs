//! Extra CA certificates from `--cert-dir` (`*.crt`, PEM).
//!
//! Certificates are parsed here and counted: oci-client silently skips a bad PEM.

use std::path::Path;

use anyhow::{Context, Result, bail};

/// DER certificates parsed from PEM text (rustls' PEM parser); errors on a malformed
/// certificate block. Blocks of other types (keys) are ignored.
pub fn parse_pem(text: &str, what: &str) -> Result<Vec<Vec<u8>>> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let mut out = Vec::new();
    for (i, cert) in CertificateDer::pem_slice_iter(text.as_bytes()).enumerate() {
        let der = cert.map_err(|e| anyhow::anyhow!("{what}: certificate {} is malformed PEM: {e}", i + 1))?;
        // A DER certificate is a SEQUENCE.
        if der.len() < 64 || der[0] != 0x30 {
            bail!("{what}: certificate {} is not a DER X.509 certificate", i + 1);
        }
        out.push(der.to_vec());
    }
    Ok(out)
}

/// `*.crt` files directly in `dir`.
fn crt_files(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    Ok(std::fs::read_dir(dir)
        .with_context(|| format!("read --cert-dir {}", dir.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "crt") && p.is_file())
        .collect())
}

/// All certificates in `dir/*.crt` and, for the containers `certs.d` layout, in
/// `dir/<registry>/*.crt` (DER); each file must hold at least one. CAs found under a
/// registry's subdirectory are trusted for every registry.
pub fn load_cert_dir(dir: &Path) -> Result<Vec<Vec<u8>>> {
    let mut files = crt_files(dir)?;
    for e in std::fs::read_dir(dir).with_context(|| format!("read --cert-dir {}", dir.display()))?.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            files.extend(crt_files(&e.path())?);
        }
    }
    files.sort();
    let mut all = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).with_context(|| format!("read {}", f.display()))?;
        let certs = parse_pem(&text, &f.display().to_string())?;
        if certs.is_empty() {
            bail!("{}: no PEM certificate found", f.display());
        }
        tracing::debug!("{}: {} CA certificate(s)", f.display(), certs.len());
        all.extend(certs);
    }
    Ok(all)
}
