//! OpenPGP verification of simple signatures with the pure-Rust `pgp` crate (rpgp):
//! the signature is a signed OpenPGP message (as `gpg --sign` writes it, usually
//! compressed) whose literal data is the simple-signing payload.

use anyhow::{Context, Result, anyhow, bail};
use pgp::composed::{Deserializable, Message, SignedPublicKey};
use pgp::types::KeyDetails;

/// A set of trusted OpenPGP public keys.
pub struct Keyring {
    keys: Vec<SignedPublicKey>,
}

impl Keyring {
    /// Parses keys from binary or ASCII-armored data (several keys may be concatenated).
    pub fn parse(data: &[u8], what: &str) -> Result<Keyring> {
        let mut keys = Vec::new();
        let trimmed = data.iter().position(|b| !b.is_ascii_whitespace()).map(|i| &data[i..]).unwrap_or_default();
        if trimmed.starts_with(b"-----BEGIN") {
            let (iter, _) = SignedPublicKey::from_armor_many(trimmed).map_err(|e| anyhow!("{what}: {e}"))?;
            for k in iter {
                keys.push(k.map_err(|e| anyhow!("{what}: {e}"))?);
            }
        } else {
            for k in SignedPublicKey::from_bytes_many(trimmed).map_err(|e| anyhow!("{what}: {e}"))? {
                keys.push(k.map_err(|e| anyhow!("{what}: {e}"))?);
            }
        }
        let mut valid = Vec::new();
        for k in keys {
            match k.verify_bindings() {
                Ok(()) => valid.push(k),
                Err(e) => tracing::warn!("{what}: ignoring key {:X}: invalid self-signature: {e}", k.fingerprint()),
            }
        }
        if valid.is_empty() {
            bail!("{what}: no public keys imported");
        }
        Ok(Keyring { keys: valid })
    }

    /// Adds the keys of another keyring.
    pub fn extend(&mut self, other: Keyring) {
        self.keys.extend(other.keys);
    }

    /// Verifies a signed message; returns its literal data and the primary key fingerprint
    /// (upper-case hex) of the key that made it (the primary key or one of its subkeys).
    pub fn verify(&self, signature: &[u8]) -> Result<(Vec<u8>, String)> {
        let msg = Message::from_bytes(signature).map_err(|e| anyhow!("not an OpenPGP message: {e}"))?;
        let mut msg = msg.decompress().map_err(|e| anyhow!("decompressing the OpenPGP message: {e}"))?;
        if msg.is_compressed() {
            msg = msg.decompress().map_err(|e| anyhow!("decompressing the OpenPGP message: {e}"))?;
        }
        if !msg.is_signed() {
            bail!("the OpenPGP message is not signed");
        }
        let data = msg.as_data_vec().context("reading the signed payload")?;
        for key in &self.keys {
            if msg.verify(&key.primary_key).is_ok() {
                return Ok((data, format!("{:X}", key.fingerprint())));
            }
            for sub in &key.public_subkeys {
                if sub.verify_bindings(&key.primary_key).is_ok() && msg.verify(&sub.key).is_ok() {
                    return Ok((data, format!("{:X}", key.fingerprint())));
                }
            }
        }
        let by = match &msg {
            Message::Signed { reader, .. } => reader
                .signature(0)
                .map(|s| {
                    let fps: Vec<String> = s.issuer_fingerprint().iter().map(|f| format!("{f:X}")).collect();
                    let ids: Vec<String> = s.issuer_key_id().iter().map(|k| hex::encode_upper(k.as_ref())).collect();
                    if fps.is_empty() { ids.join(",") } else { fps.join(",") }
                })
                .unwrap_or_default(),
            _ => String::new(),
        };
        bail!("signature by key {by} is not accepted (not made by a trusted key, or invalid)")
    }
}
