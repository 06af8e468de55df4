//! OpenPGP verification of simple signatures with the pure-Rust `pgp` crate (rpgp):
//! the signature is a signed OpenPGP message (as `gpg --sign` writes it, usually
//! compressed) whose literal data is the simple-signing payload.
//!
//! Key validity is judged as GnuPG judges it for containers/image's gpgme mechanism
//! (`signature/mechanism_gpgme.go` `Verify`: any error status, `ValidityNever`, a validity
//! reason or `WrongKeyUsage` refuses): a signature is refused when the key that made it, or
//! its primary key, carries a valid revocation (any reason), has expired, or (a subkey) is
//! not bound with the signing flag and a valid back-signature; and when the signature has
//! expired, predates its key, or is dated in the future; a message with more than one
//! signature is refused (`Unexpected GPG signature count`). Only self-signatures made by the
//! primary key count; others are ignored, as GnuPG ignores them. A valid signing subkey of
//! a listed primary key signs for it (containers/image's subkey matching, 2025).

use std::io::Read;

use anyhow::{Context, Result, anyhow, bail};
use pgp::composed::{Deserializable, Message, SignedPublicKey, SignedPublicSubKey};
use pgp::packet::{PublicKey, Signature, SignatureType};
use pgp::types::{KeyDetails, Tag, Timestamp};

/// The largest simple-signing payload read from one signature (they are a few hundred bytes;
/// the cap keeps a compressed bomb from expanding without bound).
const MAX_PAYLOAD: u64 = 1 << 20;

/// A set of trusted OpenPGP public keys.
pub(crate) struct Keyring {
    keys: Vec<SignedPublicKey>,
}

/// What the self-signatures of one key (primary or subkey) say, evaluated now.
struct Validity {
    /// Why the key cannot make valid signatures, if it cannot.
    refused: Option<String>,
    /// The primary key's self-signature gives it usage flags without signing (its subkeys
    /// may still sign).
    primary_cannot_sign: bool,
}

impl Validity {
    fn refused(why: impl Into<String>) -> Validity {
        Validity { refused: Some(why.into()), primary_cannot_sign: false }
    }
}

/// The latest of the signatures that pass `valid`, by creation time.
fn latest<'a>(sigs: impl Iterator<Item = &'a Signature>, valid: impl Fn(&Signature) -> bool) -> Option<&'a Signature> {
    sigs.filter(|s| valid(s)).max_by_key(|s| s.created().map(Timestamp::as_secs).unwrap_or(0))
}

/// The expiry (seconds since the epoch) a self-signature gives a key created at `created`.
fn expiry(created: Timestamp, sig: &Signature) -> Option<u64> {
    let d = u64::from(sig.key_expiration_time()?.as_secs());
    (d != 0).then(|| u64::from(created.as_secs()) + d)
}

fn when(secs: u64) -> String {
    httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
}

/// The primary key: revoked, expired, or without any valid self-signature.
fn primary_validity(key: &SignedPublicKey, now: u64) -> Validity {
    let pk = &key.primary_key;
    let revoked = key
        .details
        .revocation_signatures
        .iter()
        .any(|s| s.typ() == Some(SignatureType::KeyRevocation) && s.verify_key(pk).is_ok());
    if revoked {
        return Validity::refused("the primary key is revoked");
    }
    let certifications = key.details.users.iter().flat_map(|u| {
        u.signatures
            .iter()
            .filter(|s| s.is_certification() && s.typ() != Some(SignatureType::CertRevocation))
            .map(move |s| (s, u))
    });
    let mut selfsigs: Vec<&Signature> = certifications
        .filter(|(s, u)| s.verify_certification(pk, Tag::UserId, &u.id).is_ok())
        .map(|(s, _)| s)
        .collect();
    selfsigs.extend(
        key.details
            .direct_signatures
            .iter()
            .filter(|s| s.typ() == Some(SignatureType::Key) && s.verify_key(pk).is_ok()),
    );
    let Some(sig) = latest(selfsigs.into_iter(), |_| true) else {
        return Validity::refused("the primary key has no valid self-signature");
    };
    if let Some(exp) = expiry(pk.created_at(), sig)
        && exp <= now
    {
        return Validity::refused(format!("the primary key expired on {}", when(exp)));
    }
    let flags = sig.key_flags();
    // No key flags at all: the usage is the algorithm's (GnuPG's reading).
    let flagged = flags.certify() || flags.sign() || flags.encrypt_comms() || flags.encrypt_storage();
    Validity { refused: None, primary_cannot_sign: flagged && !flags.sign() }
}

/// A subkey: revoked, expired, unbound, or bound without the signing flag.
fn subkey_validity(pk: &PublicKey, sub: &SignedPublicSubKey, now: u64) -> Validity {
    let revoked = sub
        .signatures
        .iter()
        .any(|s| s.typ() == Some(SignatureType::SubkeyRevocation) && s.verify_subkey_binding(pk, &sub.key).is_ok());
    if revoked {
        return Validity::refused("the subkey is revoked");
    }
    let binding = latest(sub.signatures.iter(), |s| {
        s.typ() == Some(SignatureType::SubkeyBinding) && s.verify_subkey_binding(pk, &sub.key).is_ok()
    });
    let Some(binding) = binding else {
        return Validity::refused("the subkey has no valid binding signature");
    };
    if !binding.key_flags().sign() {
        return Validity::refused("the subkey is not bound for signing (no signing flag)");
    }
    let backsig_ok = binding.embedded_signature().is_some_and(|b| b.verify_primary_key_binding(&sub.key, pk).is_ok());
    if !backsig_ok {
        return Validity::refused("the signing subkey has no valid back-signature");
    }
    if let Some(exp) = expiry(sub.key.created_at(), binding)
        && exp <= now
    {
        return Validity::refused(format!("the subkey expired on {}", when(exp)));
    }
    Validity { refused: None, primary_cannot_sign: false }
}

/// The signature's own dates: expired, older than its key, or in the future.
fn signature_dates(sig: &Signature, key_created: Timestamp, now: u64) -> Result<()> {
    let created = u64::from(sig.created().context("the signature has no creation time")?.as_secs());
    if created > now {
        bail!("the signature is dated in the future ({})", when(created));
    }
    if created < u64::from(key_created.as_secs()) {
        bail!("the signature ({}) is older than the key that made it", when(created));
    }
    if let Some(d) = sig.signature_expiration_time().map(|d| u64::from(d.as_secs())).filter(|d| *d != 0)
        && created + d <= now
    {
        bail!("the signature expired on {}", when(created + d));
    }
    Ok(())
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

impl Keyring {
    /// Parses keys from binary or ASCII-armored data (several keys may be concatenated).
    /// Validity is judged when a signature is verified, not here (a key may expire later).
    pub(crate) fn parse(data: &[u8], what: &str) -> Result<Keyring> {
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
        if keys.is_empty() {
            bail!("{what}: no public keys imported");
        }
        let mut ring = Keyring { keys: Vec::new() };
        for k in keys {
            ring.add(k);
        }
        Ok(ring)
    }

    /// Adds the keys of another keyring.
    pub(crate) fn extend(&mut self, other: Keyring) {
        for k in other.keys {
            self.add(k);
        }
    }

    /// Adds one key; a copy of a key already present is merged into it, as a GnuPG keyring
    /// merges an import (so a revocation in either copy counts).
    fn add(&mut self, k: SignedPublicKey) {
        let Some(have) = self.keys.iter_mut().find(|h| h.fingerprint() == k.fingerprint()) else {
            self.keys.push(k);
            return;
        };
        have.details.revocation_signatures.extend(k.details.revocation_signatures);
        have.details.direct_signatures.extend(k.details.direct_signatures);
        have.details.users.extend(k.details.users);
        for sub in k.public_subkeys {
            match have.public_subkeys.iter_mut().find(|h| h.key.fingerprint() == sub.key.fingerprint()) {
                Some(h) => h.signatures.extend(sub.signatures),
                None => have.public_subkeys.push(sub),
            }
        }
    }

    /// Verifies a signed message; returns its literal data and the primary key fingerprint
    /// (upper-case hex) of the key that made it (the primary key or one of its subkeys),
    /// once that key is valid now as GnuPG judges it.
    pub(crate) fn verify(&self, signature: &[u8]) -> Result<(Vec<u8>, String)> {
        let msg = Message::from_bytes(signature).map_err(|e| anyhow!("not an OpenPGP message: {e}"))?;
        let mut msg = msg.decompress().map_err(|e| anyhow!("decompressing the OpenPGP message: {e}"))?;
        if msg.is_compressed() {
            msg = msg.decompress().map_err(|e| anyhow!("decompressing the OpenPGP message: {e}"))?;
        }
        if !msg.is_signed() {
            bail!("the OpenPGP message is not signed");
        }
        let mut data = Vec::new();
        (&mut msg).take(MAX_PAYLOAD + 1).read_to_end(&mut data).context("reading the signed payload")?;
        if data.len() as u64 > MAX_PAYLOAD {
            bail!("the signed payload is larger than {MAX_PAYLOAD} bytes");
        }
        if let Message::Signed { reader, .. } = &msg
            && reader.num_signatures() != 1
        {
            bail!(
                "the OpenPGP message carries {} signatures, exactly one is accepted (as containers/image's gpgme mechanism)",
                reader.num_signatures()
            );
        }
        let now = now();
        for key in &self.keys {
            let fpr = format!("{:X}", key.fingerprint());
            if let Ok(sig) = msg.verify(&key.primary_key) {
                let v = primary_validity(key, now);
                if let Some(why) = v.refused {
                    bail!("signature by key {fpr} is not accepted: {why}");
                }
                if v.primary_cannot_sign {
                    bail!("signature by key {fpr} is not accepted: the primary key is not flagged for signing");
                }
                signature_dates(sig, key.primary_key.created_at(), now)
                    .map_err(|e| anyhow!("signature by key {fpr} is not accepted: {e}"))?;
                return Ok((data, fpr));
            }
            for sub in &key.public_subkeys {
                let Ok(sig) = msg.verify(&sub.key) else { continue };
                let sfpr = format!("{:X}", sub.key.fingerprint());
                let refused =
                    primary_validity(key, now).refused.or(subkey_validity(&key.primary_key, sub, now).refused);
                if let Some(why) = refused {
                    bail!("signature by subkey {sfpr} of key {fpr} is not accepted: {why}");
                }
                signature_dates(sig, sub.key.created_at(), now)
                    .map_err(|e| anyhow!("signature by subkey {sfpr} of key {fpr} is not accepted: {e}"))?;
                return Ok((data, fpr));
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
