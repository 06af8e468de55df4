//! IBM Secure Execution host key documents: the X.509 certificate of a machine's host key
//! (EC P-521), and its key hash (`phkh`): SHA-256 of the key's affine coordinates x and y,
//! each left-padded to 80 bytes, as s390-tools' `phkh_v1` and Trustee's `se_parse_hdr.py`
//! compute it (see `docs/attestation.md`).

use anyhow::{Context, Result, anyhow};
use p521::elliptic_curve::sec1::ToEncodedPoint;
use p521::pkcs8::DecodePublicKey;
use x509_cert::Certificate;
use x509_cert::der::{Decode, DecodePem, Encode};

/// Largest host key document read (a certificate is a few KiB).
pub(crate) const MAX_DOCUMENT: u64 = 1 << 20;

/// Width each coordinate is padded to before hashing (`union ecdh_pub_key`: 80 + 80).
const COORD: usize = 80;

/// A host key document's key, reduced to what the header refers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostKey {
    /// SHA-256 of x‖y, each left-padded to 80 bytes.
    pub(crate) phkh: [u8; 32],
}

/// Parses a host key document (PEM or DER certificate, `name` in errors) and hashes its key.
pub(crate) fn parse(bytes: &[u8], name: &str) -> Result<HostKey> {
    let cert = if bytes.trim_ascii_start().starts_with(b"-----BEGIN") {
        Certificate::from_pem(bytes).map_err(|e| anyhow!("{name} is not a PEM X.509 certificate: {e}"))?
    } else {
        Certificate::from_der(bytes).map_err(|e| anyhow!("{name} is not an X.509 certificate (PEM or DER): {e}"))?
    };
    let spki = cert
        .tbs_certificate
        .subject_public_key_info
        .to_der()
        .map_err(|e| anyhow!("{name}: its public key does not encode: {e}"))?;
    let key = p521::PublicKey::from_public_key_der(&spki).map_err(|e| {
        anyhow!("{name}: a host key document holds an EC P-521 public key (secp521r1); this one does not ({e})")
    })?;
    let point = key.to_encoded_point(false);
    let (Some(x), Some(y)) = (point.x(), point.y()) else {
        return Err(anyhow!("{name}: its P-521 public key has no affine coordinates"));
    };
    let mut data = [0u8; 2 * COORD];
    data[COORD - x.len()..COORD].copy_from_slice(x);
    data[2 * COORD - y.len()..].copy_from_slice(y);
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &data);
    let phkh: [u8; 32] = digest.as_ref().try_into().context("internal: SHA-256 is not 32 bytes")?;
    Ok(HostKey { phkh })
}
