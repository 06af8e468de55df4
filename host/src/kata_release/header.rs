//! The few tags kata-addons needs from an RPM header blob, as the RPM database stores one
//! package (a row of `Packages`): `il` and `dl` (big-endian u32), `il` index entries of 16
//! bytes (tag, type, offset, count) and `dl` bytes of data. The checks are those of rpm's
//! own `headerImport` (lib/header.c: entry and data counts capped, the blob exactly as long
//! as they say, every entry's data inside the data store) before any entry is read, so a
//! hostile count or offset is an error, never a panic or an allocation it names.
//! Format: docs/design.md#node-kata-release.

use std::fmt;

/// Most index entries rpm accepts in one header (`hdrchkTags`).
const MAX_TAGS: u32 = 0x10000;
/// Most bytes of header data kata-addons reads for one package (rpm accepts up to 256 MiB;
/// a package's header is a few hundred KiB even with thousands of files).
const MAX_BLOB: usize = 32 << 20;
/// `RPM_INT32_TYPE`.
const INT32: u32 = 4;
/// `RPM_STRING_TYPE`.
const STRING: u32 = 6;
/// `RPMTAG_NAME`.
const TAG_NAME: u32 = 1000;
/// `RPMTAG_VERSION`.
const TAG_VERSION: u32 = 1001;
/// `RPMTAG_RELEASE`.
const TAG_RELEASE: u32 = 1002;
/// `RPMTAG_EPOCH`.
const TAG_EPOCH: u32 = 1003;
/// Longest NAME, VERSION or RELEASE read (rpm's own are far shorter).
const MAX_STRING: usize = 4096;

/// Why a header blob was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BadHeader(pub(crate) String);

impl fmt::Display for BadHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Name, epoch, version and release of one package, as `rpm -q --qf` prints them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Nevr {
    /// `NAME`.
    pub(crate) name: String,
    /// `EPOCH` (`None`: the package has none, rpm prints `(none)`).
    pub(crate) epoch: Option<u32>,
    /// `VERSION`.
    pub(crate) version: String,
    /// `RELEASE`.
    pub(crate) release: String,
}

/// Reads a big-endian u32 at `at` (the caller checked the bounds).
fn be32(b: &[u8], at: usize) -> Option<u32> {
    let bytes: [u8; 4] = b.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(u32::from_be_bytes(bytes))
}

/// Just the NAME of a header blob (the scan for `kata-containers` reads every package's).
pub(crate) fn name(blob: &[u8]) -> Result<String, BadHeader> {
    let h = Index::parse(blob)?;
    h.string(TAG_NAME, "NAME")
}

/// NAME, EPOCH, VERSION and RELEASE of a header blob.
pub(crate) fn nevr(blob: &[u8]) -> Result<Nevr, BadHeader> {
    let h = Index::parse(blob)?;
    Ok(Nevr {
        name: h.string(TAG_NAME, "NAME")?,
        epoch: h.int32(TAG_EPOCH, "EPOCH")?,
        version: h.string(TAG_VERSION, "VERSION")?,
        release: h.string(TAG_RELEASE, "RELEASE")?,
    })
}

/// A checked header: its index and data store.
struct Index<'a> {
    /// The index entries, `il` × 16 bytes.
    entries: &'a [u8],
    /// The data store, `dl` bytes.
    data: &'a [u8],
}

/// One index entry.
struct Entry {
    /// The entry's type (`RPM_*_TYPE`).
    kind: u32,
    /// Its offset into the data store (checked to be inside it).
    offset: usize,
    /// Its count of items.
    count: u32,
}

impl<'a> Index<'a> {
    /// Checks the counts and the length of a blob (rpm's `headerImport` checks).
    fn parse(blob: &'a [u8]) -> Result<Index<'a>, BadHeader> {
        if blob.len() > MAX_BLOB {
            return Err(BadHeader(format!("a header of {} bytes, more than {MAX_BLOB}", blob.len())));
        }
        let (Some(il), Some(dl)) = (be32(blob, 0), be32(blob, 4)) else {
            return Err(BadHeader(format!("a header of {} bytes, shorter than its 8-byte preamble", blob.len())));
        };
        if il == 0 || il > MAX_TAGS {
            return Err(BadHeader(format!("an index of {il} entries (1 to {MAX_TAGS} accepted)")));
        }
        let want = 8u64 + 16 * u64::from(il) + u64::from(dl);
        if want != blob.len() as u64 {
            return Err(BadHeader(format!(
                "{il} index entries and {dl} data bytes need {want} bytes, the header has {}",
                blob.len()
            )));
        }
        let split = 8 + 16 * il as usize;
        Ok(Index { entries: &blob[8..split], data: &blob[split..] })
    }

    /// The entry of `tag`: `None` when absent; an error when it is there twice or its
    /// offset is outside the data store.
    fn entry(&self, tag: u32, what: &str) -> Result<Option<Entry>, BadHeader> {
        let mut found = None;
        for e in self.entries.chunks_exact(16) {
            if be32(e, 0) != Some(tag) {
                continue;
            }
            if found.is_some() {
                return Err(BadHeader(format!("{what} ({tag}) is in the index twice")));
            }
            let (Some(kind), Some(offset), Some(count)) = (be32(e, 4), be32(e, 8), be32(e, 12)) else {
                return Err(BadHeader(format!("a truncated index entry of {what}")));
            };
            // rpm reads the offset as a signed 32-bit number: negative is out of the store.
            let offset = offset as usize;
            if offset >= self.data.len() || offset > i32::MAX as usize {
                return Err(BadHeader(format!(
                    "{what} at offset {offset}, outside the {} data bytes",
                    self.data.len()
                )));
            }
            found = Some(Entry { kind, offset, count });
        }
        Ok(found)
    }

    /// A STRING entry, which must be present, NUL-terminated inside the store and UTF-8.
    fn string(&self, tag: u32, what: &str) -> Result<String, BadHeader> {
        let Some(e) = self.entry(tag, what)? else {
            return Err(BadHeader(format!("no {what} ({tag}) in the header")));
        };
        if e.kind != STRING || e.count != 1 {
            return Err(BadHeader(format!(
                "{what} is of type {} with {} items, a string was expected",
                e.kind, e.count
            )));
        }
        let rest = &self.data[e.offset..];
        let window = &rest[..rest.len().min(MAX_STRING + 1)];
        let Some(end) = window.iter().position(|&b| b == 0) else {
            return Err(BadHeader(format!("{what} is not NUL-terminated within {MAX_STRING} bytes of the store")));
        };
        String::from_utf8(window[..end].to_vec()).map_err(|_| BadHeader(format!("{what} is not UTF-8")))
    }

    /// An INT32 entry's first item, `None` when the tag is absent.
    fn int32(&self, tag: u32, what: &str) -> Result<Option<u32>, BadHeader> {
        let Some(e) = self.entry(tag, what)? else { return Ok(None) };
        if e.kind != INT32 || e.count != 1 {
            return Err(BadHeader(format!(
                "{what} is of type {} with {} items, one INT32 was expected",
                e.kind, e.count
            )));
        }
        if e.offset % 4 != 0 {
            return Err(BadHeader(format!("{what} at offset {}, not aligned to 4", e.offset)));
        }
        be32(self.data, e.offset)
            .map(Some)
            .ok_or_else(|| BadHeader(format!("{what} at offset {} runs past the data store", e.offset)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blob with the given entries (tag, type, offset, count) and store.
    fn blob(entries: &[(u32, u32, u32, u32)], data: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend((entries.len() as u32).to_be_bytes());
        b.extend((data.len() as u32).to_be_bytes());
        for (t, k, o, c) in entries {
            for v in [t, k, o, c] {
                b.extend(v.to_be_bytes());
            }
        }
        b.extend(data);
        b
    }

    #[test]
    fn reads_name_epoch_version_release() {
        let data = b"\0\0\0\x02kata-containers\x003.25.0\x006.el9\0";
        let b = blob(&[(1000, 6, 4, 1), (1003, 4, 0, 1), (1001, 6, 20, 1), (1002, 6, 27, 1)], data);
        let n = nevr(&b).unwrap();
        assert_eq!(
            n,
            Nevr { name: "kata-containers".into(), epoch: Some(2), version: "3.25.0".into(), release: "6.el9".into() }
        );
    }

    #[test]
    fn hostile_counts_and_offsets_are_errors() {
        let data = b"kata\0";
        for bad in [
            blob(&[(1000, 6, 0x8000_0000, 1)], data),
            blob(&[(1000, 6, 5, 1)], data),
            blob(&[(1000, 6, 0, 1), (1000, 6, 0, 1)], data),
            blob(&[(1000, 8, 0, 0xffff_ffff)], data),
            blob(&[(1000, 6, 0, 1)], b"kata"),
            blob(&[(1003, 4, 2, 1), (1000, 6, 0, 1)], data),
        ] {
            assert!(nevr(&bad).is_err());
        }
        let mut huge = blob(&[(1000, 6, 0, 1)], data);
        huge[0..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(name(&huge).is_err());
        huge[0..4].copy_from_slice(&1u32.to_be_bytes());
        huge[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(name(&huge).is_err());
        assert!(name(&[0, 0, 0]).is_err());
    }
}
