//! IBM Secure Execution: the SE image header in the installed kernel file (an SE image),
//! found exactly where s390-tools' `pvextract-hdr` finds it, and the reference values
//! Trustee's SE verifier checks (`se.version`, `se.tag`, `se.image_phkh`,
//! `se.attestation_phkh`; see `docs/attestation.md`).
//!
//! Layout (s390-tools `genprotimg/src/include/pv_hdr_def.h`, big-endian): `pv_hdr_head`
//! (416 bytes: magic `IBMSecEx`, version `0x100`, `phs` the header size, iv\[12\], res1,
//! `nks` key slots, `sea` size of the encrypted area, nep, pcf, the customer public key
//! \[160\], pld/ald/tld \[64\] each), then `nks` key slots of 80 bytes (`digest_key`\[32\]:
//! the host key hash, `wrapped_key`\[32\], tag\[16\]), the encrypted area (`sea` bytes, at
//! least 128), and the 16-byte header tag: `phs = 416 + 80·nks + sea + 16`, at most two
//! pages.

use std::os::unix::fs::FileExt;

use anyhow::{Context, Result, bail};

use super::hkd::HostKey;

/// The magic at the start of an SE header.
pub(crate) const MAGIC: &[u8; 8] = b"IBMSecEx";
/// Where `pvextract-hdr` starts searching: `-s 0x14` pages.
pub(crate) const SEARCH_START: u64 = 0x14 * 0x1000;
/// How far it searches: `-l 0x4` pages.
pub(crate) const SEARCH_LEN: u64 = 0x4 * 0x1000;
/// It searches `od` rows: the magic is found at the start of a 16-byte row.
pub(crate) const ROW: u64 = 16;
/// The only header version known (`PV_VERSION_1`).
pub(crate) const VERSION_1: u32 = 0x100;
/// `sizeof(struct pv_hdr_head)`.
pub(crate) const HEAD_SIZE: u64 = 416;
/// `sizeof(struct pv_hdr_key_slot)`.
pub(crate) const SLOT_SIZE: u64 = 80;
/// `sizeof(struct pv_hdr_encrypted)` without optional items.
pub(crate) const MIN_ENCRYPTED: u64 = 128;
/// The trailing header tag (AES-256-GCM tag).
pub(crate) const TAG_SIZE: u64 = 16;
/// `PV_V1_PV_HDR_MAX_SIZE`: two pages.
pub(crate) const MAX_HEADER: u64 = 2 * 0x1000;

/// A valid SE header, as found in a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Header {
    /// Offset of the header in the file.
    pub(crate) offset: u64,
    /// The whole header (`phs` bytes): what `pvextract-hdr` writes to `sehdr.bin`.
    pub(crate) bytes: Vec<u8>,
    /// Its version (`0x100`).
    pub(crate) version: u32,
    /// The `digest_key` of each key slot: the hash of a host key the image is sealed for.
    pub(crate) slots: Vec<[u8; 32]>,
    /// The last 16 bytes: the header tag.
    pub(crate) tag: [u8; 16],
}

fn be32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_be_bytes(a)
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

/// Reads up to `len` bytes at `at` (fewer at the end of the file).
fn read_at(f: &std::fs::File, at: u64, len: u64) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len as usize];
    let mut got = 0usize;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], at + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(got);
    Ok(buf)
}

/// Finds and checks the SE header of `file` (named `name` in errors): the magic at the
/// start of a 16-byte row of bytes `0x14000..0x18000` (the rows `pvextract-hdr` greps), one
/// such header, version `0x100`, a size consistent with its key slots and encrypted area,
/// within two pages and within the file. The error says what was found instead.
pub(crate) fn find(file: &std::fs::File, name: &str) -> Result<Header> {
    let size = file.metadata().with_context(|| format!("inspecting {name}"))?.len();
    let window = read_at(file, SEARCH_START, SEARCH_LEN).with_context(|| format!("reading {name}"))?;
    let mut aligned = Vec::new();
    let mut misaligned = Vec::new();
    for (i, w) in window.windows(MAGIC.len()).enumerate() {
        if w == MAGIC {
            let at = SEARCH_START + i as u64;
            if at.is_multiple_of(ROW) { aligned.push(at) } else { misaligned.push(at) }
        }
    }
    let offset = match aligned.as_slice() {
        [one] => *one,
        [] if misaligned.is_empty() => bail!(
            "{name} has no IBM Secure Execution header: the magic IBMSecEx is not at the start of any 16-byte row of \
             bytes {SEARCH_START:#x}..{:#x}, where pvextract-hdr searches (the file is {size} bytes); a plain kernel \
             does not start a protected guest: build the SE image with genprotimg/pvimg",
            SEARCH_START + SEARCH_LEN
        ),
        [] => bail!(
            "{name} has no IBM Secure Execution header where pvextract-hdr finds one: the magic IBMSecEx is at offset \
             {}, not at the start of a 16-byte row of bytes {SEARCH_START:#x}..{:#x}",
            misaligned.iter().map(|o| format!("{o:#x}")).collect::<Vec<_>>().join(", "),
            SEARCH_START + SEARCH_LEN
        ),
        many => bail!(
            "{name} has {} IBM Secure Execution header magics (IBMSecEx at {}): pvextract-hdr cannot tell which is \
             the header",
            many.len(),
            many.iter().map(|o| format!("{o:#x}")).collect::<Vec<_>>().join(", ")
        ),
    };
    let head = read_at(file, offset, HEAD_SIZE).with_context(|| format!("reading {name}"))?;
    if (head.len() as u64) < HEAD_SIZE {
        bail!(
            "{name}: the IBM Secure Execution header at {offset:#x} is truncated: the file ends {} bytes into it, \
             the header's fixed part alone is {HEAD_SIZE} bytes",
            head.len()
        );
    }
    let version = be32(&head, 8);
    if version != VERSION_1 {
        bail!(
            "{name}: the IBM Secure Execution header at {offset:#x} has version {version:#x}; only version \
             {VERSION_1:#x} is known (pvextract-hdr warns, Trustee's verifier refuses it)"
        );
    }
    let phs = u64::from(be32(&head, 12));
    let nks = be64(&head, 32);
    let sea = be64(&head, 40);
    let min = HEAD_SIZE + SLOT_SIZE + MIN_ENCRYPTED + TAG_SIZE;
    if !(min..=MAX_HEADER).contains(&phs) {
        bail!(
            "{name}: the IBM Secure Execution header at {offset:#x} claims a size of {phs} bytes; a version 1 \
             header is {min} to {MAX_HEADER} bytes"
        );
    }
    let expected =
        nks.checked_mul(SLOT_SIZE).and_then(|s| s.checked_add(HEAD_SIZE + TAG_SIZE)).and_then(|s| s.checked_add(sea));
    if nks == 0 || sea < MIN_ENCRYPTED || expected != Some(phs) {
        bail!(
            "{name}: the IBM Secure Execution header at {offset:#x} is inconsistent: its size is {phs} bytes but \
             {nks} key slots and an encrypted area of {sea} bytes make {} (416 + 80 per slot + encrypted area of at \
             least {MIN_ENCRYPTED} + a 16-byte tag)",
            expected.map(|e| e.to_string()).unwrap_or_else(|| "an overflow".to_string())
        );
    }
    if offset + phs > size {
        bail!(
            "{name}: the IBM Secure Execution header at {offset:#x} is truncated: it claims {phs} bytes, the file \
             ends {} bytes into it",
            size - offset
        );
    }
    let bytes = read_at(file, offset, phs).with_context(|| format!("reading {name}"))?;
    if bytes.len() as u64 != phs || !bytes.starts_with(MAGIC) {
        bail!("{name} changed while its IBM Secure Execution header was read");
    }
    let slots = (0..nks as usize)
        .map(|i| {
            let at = HEAD_SIZE as usize + i * SLOT_SIZE as usize;
            let mut d = [0u8; 32];
            d.copy_from_slice(&bytes[at..at + 32]);
            d
        })
        .collect();
    let mut tag = [0u8; 16];
    tag.copy_from_slice(&bytes[bytes.len() - TAG_SIZE as usize..]);
    Ok(Header { offset, bytes, version, slots, tag })
}

/// The reference values of a header, with the host keys given (each `(document, key)`):
/// `se.version`, `se.tag`, and with keys `se.attestation_phkh` (every key's hash) and
/// `se.image_phkh` (the key slots that hold one of them).
pub(crate) fn values(h: &Header, file: &str, keys: &[(String, HostKey)]) -> Vec<super::Value> {
    use super::{Provenance, RefValue, Value};
    let from_header = |what: &str| Provenance {
        what: format!("{what} of the IBM Secure Execution header at {:#x}", h.offset),
        file: Some(file.to_string()),
        key: None,
    };
    let mut out = vec![
        Value::Computed(RefValue {
            name: "se.version".into(),
            values: vec![h.version.to_string()],
            provenance: vec![from_header("version")],
        }),
        Value::Computed(RefValue {
            name: "se.tag".into(),
            values: vec![hex::encode(h.tag)],
            provenance: vec![from_header("last 16 bytes")],
        }),
    ];
    if keys.is_empty() {
        for name in ["se.image_phkh", "se.attestation_phkh"] {
            out.push(Value::Unavailable {
                name: name.into(),
                reason: "no host key document given (--host-key-document, or the ConfigMap key seHostKeyDocuments)"
                    .into(),
            });
        }
        return out;
    }
    let doc = |d: &str, what: String| Provenance { what, file: Some(d.to_string()), key: None };
    let mut image = Vec::new();
    let mut image_prov = Vec::new();
    let mut missing = Vec::new();
    for (d, k) in keys {
        match h.slots.iter().position(|s| s == &k.phkh) {
            Some(i) => {
                let v = hex::encode(h.slots[i]);
                if !image.contains(&v) {
                    image.push(v);
                }
                image_prov.push(from_header(&format!("key slot {}", i + 1)));
                image_prov.push(doc(d, "host key document whose key hash the slot holds".into()));
            }
            None => missing.push(d.clone()),
        }
    }
    if missing.is_empty() {
        out.push(Value::Computed(RefValue { name: "se.image_phkh".into(), values: image, provenance: image_prov }));
    } else {
        out.push(Value::Unavailable {
            name: "se.image_phkh".into(),
            reason: format!(
                "the image is not sealed for the host key document {}: none of the header's {} key slots holds its \
                 key hash",
                missing.join(", "),
                h.slots.len()
            ),
        });
    }
    let mut att = Vec::new();
    for (_, k) in keys {
        let v = hex::encode(k.phkh);
        if !att.contains(&v) {
            att.push(v);
        }
    }
    out.push(Value::Computed(RefValue {
        name: "se.attestation_phkh".into(),
        values: att,
        provenance: keys.iter().map(|(d, _)| doc(d, "host key document (SHA-256 of its P-521 key)".into())).collect(),
    }));
    out
}
