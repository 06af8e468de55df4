//! Sigstore (cosign) signatures with public keys: attachments are the layers of the
//! `sha256-<hex>.sig` manifest; each layer is a simple-signing payload and its
//! `dev.cosignproject.cosign/signature` annotation the base64 signature over it.
//! Keys: ECDSA P-256 PEM public keys (cosign's default), verified with RustCrypto's `p256`.

use std::collections::BTreeMap;

use anyhow::{Context, Result, anyhow, bail};
use base64::Engine;
use p256::ecdsa::signature::Verifier;
use p256::pkcs8::DecodePublicKey;
use serde::Deserialize;

/// Media type of a sigstore simple-signing payload layer.
pub(crate) const PAYLOAD_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// Annotation holding the base64 signature.
pub(crate) const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// Largest signature payload read (containers/image's limit is 4 MiB).
pub(crate) const MAX_SIGNATURE_SIZE: u64 = 4 << 20;

/// One layer of a sigstore attachment manifest.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AttachmentLayer {
    /// Layer media type.
    #[serde(default)]
    pub media_type: String,
    /// Digest of the payload.
    pub digest: String,
    /// Size of the payload.
    pub size: u64,
    /// Annotations (the signature lives here).
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// A sigstore attachment manifest (`sha256-<hex>.sig`).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct AttachmentManifest {
    /// The signatures, one per layer.
    #[serde(default)]
    pub layers: Vec<AttachmentLayer>,
}

/// The tag under which sigstore attachments of `digest` are stored.
pub(crate) fn attachment_tag(digest: &str) -> Result<String> {
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .with_context(|| format!("unsupported manifest digest {digest:?}"))?;
    Ok(format!("sha256-{hex}.sig"))
}

/// A sigstore signature as read from the registry (not yet verified).
#[derive(Debug, Clone)]
pub(crate) struct UntrustedSignature {
    /// Layer media type.
    pub media_type: String,
    /// The payload bytes (digest-checked against the layer descriptor).
    pub payload: Vec<u8>,
    /// The layer's annotations.
    pub annotations: BTreeMap<String, String>,
}

/// Trusted sigstore public keys.
pub(crate) struct PublicKeys {
    keys: Vec<(p256::ecdsa::VerifyingKey, String)>,
}

impl PublicKeys {
    /// Parses PEM `PUBLIC KEY` blocks (ECDSA P-256). Other key types are refused naming `what`.
    pub(crate) fn parse(data: &[u8], what: &str) -> Result<PublicKeys> {
        let text = std::str::from_utf8(data).with_context(|| format!("{what}: not a PEM file"))?;
        let mut keys = Vec::new();
        let mut rest = text;
        while let Some(start) = rest.find("-----BEGIN ") {
            let end_marker = "-----END ";
            let Some(end) = rest[start..].find(end_marker) else { bail!("{what}: unterminated PEM block") };
            let after = start + end;
            let close = rest[after + end_marker.len()..]
                .find("-----")
                .map(|i| after + end_marker.len() + i + 5)
                .with_context(|| format!("{what}: unterminated PEM block"))?;
            let block = &rest[start..close];
            let pk = p256::PublicKey::from_public_key_pem(block).map_err(|e| {
                anyhow!("{what}: not an ECDSA P-256 public key (the only sigstore key type this build verifies): {e}")
            })?;
            let der = p256::pkcs8::EncodePublicKey::to_public_key_der(&pk).map_err(|e| anyhow!("{what}: {e}"))?;
            let fp = crate::hash::sha256_hex(der.as_bytes());
            keys.push((p256::ecdsa::VerifyingKey::from(&pk), format!("sha256:{fp}")));
            rest = &rest[close..];
        }
        if keys.is_empty() {
            bail!("{what}: no PEM public key found");
        }
        Ok(PublicKeys { keys })
    }

    /// Adds the keys of another set.
    pub(crate) fn extend(&mut self, other: PublicKeys) {
        self.keys.extend(other.keys);
    }

    /// Verifies `signature` (base64 of an ASN.1 DER ECDSA signature) over `payload`;
    /// returns the fingerprint (sha256 of the SubjectPublicKeyInfo) of the key that made it.
    pub(crate) fn verify(&self, payload: &[u8], signature_b64: &str) -> Result<String> {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(signature_b64.trim())
            .map_err(|e| anyhow!("base64 decoding of the signature: {e}"))?;
        let sig = p256::ecdsa::Signature::from_der(&raw).map_err(|e| anyhow!("malformed ECDSA signature: {e}"))?;
        for (k, fp) in &self.keys {
            if k.verify(payload, &sig).is_ok() {
                return Ok(fp.clone());
            }
        }
        bail!("cryptographic signature verification failed: not made by a trusted key")
    }
}
