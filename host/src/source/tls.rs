//! Extra CA certificates from `--cert-dir` (`*.crt`, PEM).
//!
//! Certificates are parsed here and counted: oci-client silently skips a bad PEM.

use std::path::Path;

use anyhow::{Context, Result, bail};
use base64::Engine;

/// DER certificates parsed from PEM text; errors on a malformed block.
pub fn parse_pem(text: &str, what: &str) -> Result<Vec<Vec<u8>>> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(BEGIN) {
        let after = &rest[start + BEGIN.len()..];
        let Some(end) = after.find(END) else {
            bail!("{what}: certificate {} has no END line", out.len() + 1);
        };
        let b64: String = after[..end].chars().filter(|c| !c.is_whitespace()).collect();
        let der = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .with_context(|| format!("{what}: certificate {} is not valid base64", out.len() + 1))?;
        // A DER certificate is a SEQUENCE.
        if der.len() < 64 || der[0] != 0x30 {
            bail!("{what}: certificate {} is not a DER X.509 certificate", out.len() + 1);
        }
        out.push(der);
        rest = &after[end + END.len()..];
    }
    Ok(out)
}

/// All certificates in `dir/*.crt` (DER); each file must hold at least one.
pub fn load_cert_dir(dir: &Path) -> Result<Vec<Vec<u8>>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("read --cert-dir {}", dir.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "crt"))
        .collect();
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
