//! Partitions 1 and 2 of a disk image, as the guest kernel numbers them (`vda1`, `vda2`):
//! a GPT (behind its protective MBR) numbers partitions by entry, an MBR by primary slot.
//! Both tables are read with cecton's maintained `gptman` and `mbrman` crates; 512-byte
//! logical sectors, what the guest's virtio-blk disk reports.
//!
//! The GPT's header sizes its entry array, and the header comes from the image: it is read
//! with `gptman::GPTHeader::read_from` and its entry count, entry size and array location
//! are checked ([`check_gpt_header`]) before any entry is read. The entries are then read
//! with `gptman::GPTPartitionEntry::read_from` and the array's CRC32 checked with the
//! header's own `generate_partition_entry_array_crc32`. `gptman::GPT::read_from` is not
//! used: it sizes a `Vec` from the header's count before any check (0xFFFFFFFF entries
//! abort on allocation), asserts count × size equals what it read (an entry size other
//! than 128 panics), and unwraps an alignment search that panics when every used entry
//! starts at LBA 0.

use std::io::{Read, Seek, SeekFrom};

use gptman::{GPTHeader, GPTPartitionEntry};

/// Logical sector size of the guest's disk.
pub(crate) const SECTOR: u64 = 512;

/// MBR partition types that hold further partitions instead of data.
const EXTENDED: [u8; 3] = [0x05, 0x0f, 0x85];
/// The MBR partition type of a GPT's protective MBR.
const PROTECTIVE: u8 = 0xee;

/// Which partition table the image has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TableKind {
    /// GUID partition table.
    Gpt,
    /// DOS/MBR partition table.
    Mbr,
}

impl TableKind {
    /// Lowercase name (`gpt`, `mbr`).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TableKind::Gpt => "gpt",
            TableKind::Mbr => "mbr",
        }
    }
}

/// One partition, in bytes of the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Part {
    /// Offset of its first byte.
    pub(crate) start: u64,
    /// Its size.
    pub(crate) size: u64,
}

/// Partitions 1 and 2 of an image's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Table {
    /// GPT or MBR.
    pub(crate) kind: TableKind,
    /// Partition 1, if the table has it.
    pub(crate) p1: Option<Part>,
    /// Partition 2, if the table has it.
    pub(crate) p2: Option<Part>,
}

/// Reads the partition table of an image of `len` bytes: `Ok(None)` when it has none
/// (no boot signature), an error when the table is damaged or a partition lies outside
/// the image.
pub(crate) fn read<R: Read + Seek>(r: &mut R, len: u64) -> Result<Option<Table>, String> {
    if len < SECTOR {
        return Ok(None);
    }
    r.seek(SeekFrom::Start(0)).map_err(|e| format!("reading the partition table: {e}"))?;
    let mut sector0 = [0u8; SECTOR as usize];
    r.read_exact(&mut sector0).map_err(|e| format!("reading the partition table: {e}"))?;
    if sector0[510..512] != [0x55, 0xaa] {
        return Ok(None);
    }
    let mbr = mbrman::MBRHeader::read_from(&mut std::io::Cursor::new(&sector0[..]))
        .map_err(|e| format!("the MBR does not read: {e}"))?;
    let primaries = [&mbr.partition_1, &mbr.partition_2, &mbr.partition_3, &mbr.partition_4];
    let table = if primaries.iter().any(|p| p.sys == PROTECTIVE) {
        let entries = read_gpt(r)?;
        let entry = |i: u32| -> Result<Option<Part>, String> {
            let Some(e) = usize::try_from(i - 1).ok().and_then(|n| entries.get(n)) else { return Ok(None) };
            if !e.is_used() {
                return Ok(None);
            }
            if e.ending_lba < e.starting_lba {
                return Err(format!(
                    "GPT partition {i} ends (LBA {}) before it starts (LBA {})",
                    e.ending_lba, e.starting_lba
                ));
            }
            let sectors = (e.ending_lba - e.starting_lba)
                .checked_add(1)
                .ok_or_else(|| format!("GPT partition {i} lies beyond any possible image"))?;
            part(i, e.starting_lba, sectors)
        };
        Table { kind: TableKind::Gpt, p1: entry(1)?, p2: entry(2)? }
    } else {
        let slot = |i: u32, p: &mbrman::MBRPartitionEntry| -> Result<Option<Part>, String> {
            if !p.is_used() {
                return Ok(None);
            }
            if EXTENDED.contains(&p.sys) {
                return Err(format!(
                    "MBR partition {i} is an extended partition (type {:#04x}), not a data partition",
                    p.sys
                ));
            }
            part(i, u64::from(p.starting_lba), u64::from(p.sectors))
        };
        Table { kind: TableKind::Mbr, p1: slot(1, &mbr.partition_1)?, p2: slot(2, &mbr.partition_2)? }
    };
    for (i, p) in [(1, table.p1), (2, table.p2)] {
        if let Some(p) = p
            && p.start.checked_add(p.size).is_none_or(|end| end > len)
        {
            return Err(format!(
                "{} partition {i} (bytes {}..{}) extends beyond the end of the image ({len} bytes)",
                table.kind.as_str().to_uppercase(),
                p.start,
                p.start.saturating_add(p.size)
            ));
        }
    }
    if let (Some(a), Some(b)) = (table.p1, table.p2)
        && a.start < b.start + b.size
        && b.start < a.start + a.size
    {
        return Err("partitions 1 and 2 overlap".to_string());
    }
    Ok(Some(table))
}

/// Size in bytes of a GPT partition entry that is read. The UEFI specification allows
/// 128 × 2^n; Linux's GPT code (what the guest kernel runs: `block/partitions/efi.c`)
/// and `gptman` read exactly 128, what every partitioning tool writes.
pub(crate) const GPT_ENTRY_SIZE: u32 = 128;

/// Most GPT partition entries read: 32 times the 128 every tool writes by default (the
/// UEFI minimum array of 16 KiB), an array of at most 512 KiB.
pub(crate) const MAX_GPT_ENTRIES: u32 = 4096;

/// The GPT header `gptman` would use: the primary at LBA 1, else the backup in the last
/// sector of the reader (as `gptman::GPT::read_from` looks for them).
fn gpt_header<R: Read + Seek>(r: &mut R) -> Result<GPTHeader, String> {
    let io = |e: std::io::Error| format!("reading the GPT header: {e}");
    r.seek(SeekFrom::Start(SECTOR)).map_err(io)?;
    let primary = match GPTHeader::read_from(r) {
        Ok(h) => return Ok(h),
        Err(e) => e,
    };
    let end = r.seek(SeekFrom::End(0)).map_err(io)?;
    if end < SECTOR {
        return Err(format!("the GPT does not read: primary header: {primary}"));
    }
    r.seek(SeekFrom::Start((end / SECTOR - 1) * SECTOR)).map_err(io)?;
    GPTHeader::read_from(r)
        .map_err(|backup| format!("the GPT does not read: primary header: {primary}; backup header: {backup}"))
}

/// Where the entry array of `h` lies (byte offset, length), once its count, entry size and
/// location are within what is read: [`MAX_GPT_ENTRIES`] entries of [`GPT_ENTRY_SIZE`]
/// bytes, wholly inside the `end` bytes of the image.
pub(crate) fn check_gpt_header(h: &GPTHeader, end: u64) -> Result<(u64, usize), String> {
    let (count, size) = (h.number_of_partition_entries, h.size_of_partition_entry);
    if size != GPT_ENTRY_SIZE {
        return Err(format!(
            "the GPT header gives partition entries of {size} bytes: only {GPT_ENTRY_SIZE}-byte entries are read \
             (the size Linux, which the guest runs, requires)"
        ));
    }
    if count > MAX_GPT_ENTRIES {
        return Err(format!(
            "the GPT header gives {count} partition entries: at most {MAX_GPT_ENTRIES} are read (tools write 128)"
        ));
    }
    let len = u64::from(count) * u64::from(size);
    let start = h.partition_entry_lba.checked_mul(SECTOR);
    match start.and_then(|s| s.checked_add(len)) {
        Some(stop) if stop <= end => Ok((stop - len, len as usize)),
        _ => Err(format!(
            "the GPT's partition entry array (LBA {}, {count} entries of {size} bytes) extends beyond the end of the \
             image ({end} bytes)",
            h.partition_entry_lba
        )),
    }
}

/// The entries of the image's GPT, in order (entry `n` is partition `n + 1`), the header
/// checked first and the array's CRC32 verified.
fn read_gpt<R: Read + Seek>(r: &mut R) -> Result<Vec<GPTPartitionEntry>, String> {
    let h = gpt_header(r)?;
    let end = r.seek(SeekFrom::End(0)).map_err(|e| format!("reading the GPT: {e}"))?;
    let (start, len) = check_gpt_header(&h, end)?;
    let mut array = vec![0u8; len];
    r.seek(SeekFrom::Start(start)).map_err(|e| format!("reading the GPT partition entries: {e}"))?;
    r.read_exact(&mut array).map_err(|e| format!("reading the GPT partition entries: {e}"))?;
    let mut cursor = std::io::Cursor::new(&array[..]);
    let mut entries = Vec::with_capacity(len / GPT_ENTRY_SIZE as usize);
    for i in 0..h.number_of_partition_entries {
        let e = GPTPartitionEntry::read_from(&mut cursor)
            .map_err(|e| format!("GPT partition entry {} does not read: {e}", u64::from(i) + 1))?;
        entries.push(e);
    }
    let sum = h.generate_partition_entry_array_crc32(&entries);
    if sum != h.partition_entry_array_crc32 {
        return Err(format!(
            "the GPT's partition entry array has CRC32 {sum:#010x}, its header says {:#010x}",
            h.partition_entry_array_crc32
        ));
    }
    Ok(entries)
}

fn part(i: u32, lba: u64, sectors: u64) -> Result<Option<Part>, String> {
    let start = lba.checked_mul(SECTOR);
    let size = sectors.checked_mul(SECTOR);
    match (start, size) {
        (Some(start), Some(size)) if size > 0 => Ok(Some(Part { start, size })),
        (Some(_), Some(_)) => Ok(None),
        _ => Err(format!("partition {i} lies beyond any possible image")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;
    use std::time::{Duration, Instant};

    /// A 4 MiB disk with a protective MBR and a GPT of `entries` (first and last LBA),
    /// written with gptman's header writer, which checks no entry.
    fn disk(entries: &[(u64, u64)]) -> Vec<u8> {
        let mut cur = Cursor::new(vec![0u8; 4 << 20]);
        let gpt = gptman::GPT::new_from(&mut cur, SECTOR, [7; 16]).expect("new gpt");
        let mut all = vec![GPTPartitionEntry::empty(); gpt.header.number_of_partition_entries as usize];
        for (i, (start, end)) in entries.iter().enumerate() {
            all[i] = GPTPartitionEntry {
                partition_type_guid: [1; 16],
                unique_partition_guid: [i as u8 + 1; 16],
                starting_lba: *start,
                ending_lba: *end,
                attribute_bits: 0,
                partition_name: "p".into(),
            };
        }
        let mut h = gpt.header.clone();
        h.write_into(&mut cur, SECTOR, &all).expect("write header");
        gptman::GPT::write_protective_mbr_into(&mut cur, SECTOR).expect("mbr");
        cur.into_inner()
    }

    /// `d` with its primary header changed by `f`, the header CRC32 recomputed by gptman
    /// (the fields a hostile header plays with, at their offsets in LBA 1).
    fn edit(mut d: Vec<u8>, f: impl FnOnce(&mut GPTHeader)) -> Vec<u8> {
        let at = SECTOR as usize;
        let mut h = GPTHeader::read_from(&mut Cursor::new(&d[at..])).expect("header");
        f(&mut h);
        h.update_crc32_checksum();
        d[at + 16..at + 20].copy_from_slice(&h.crc32_checksum.to_le_bytes());
        d[at + 72..at + 80].copy_from_slice(&h.partition_entry_lba.to_le_bytes());
        d[at + 80..at + 84].copy_from_slice(&h.number_of_partition_entries.to_le_bytes());
        d[at + 84..at + 88].copy_from_slice(&h.size_of_partition_entry.to_le_bytes());
        d
    }

    /// A change to a header.
    type Edit = Box<dyn Fn(&mut GPTHeader)>;

    fn read_all(d: &[u8]) -> Result<Option<Table>, String> {
        read(&mut Cursor::new(d), d.len() as u64)
    }

    #[test]
    fn a_gpt_gives_partitions_1_and_2() {
        let t = read_all(&disk(&[(2048, 4095), (4096, 6143)])).expect("reads").expect("a table");
        assert_eq!(t.kind, TableKind::Gpt);
        assert_eq!(t.p1, Some(Part { start: 2048 * 512, size: 2048 * 512 }));
        assert_eq!(t.p2, Some(Part { start: 4096 * 512, size: 2048 * 512 }));
    }

    #[test]
    fn hostile_header_sizes_are_refused_before_any_entry_is_read() {
        let good = disk(&[(2048, 4095), (4096, 6143)]);
        let cases: [(&str, Edit, &str); 7] = [
            (
                "0xFFFFFFFF entries",
                Box::new(|h| h.number_of_partition_entries = u32::MAX),
                "4294967295 partition entries",
            ),
            ("entry size 0", Box::new(|h| h.size_of_partition_entry = 0), "entries of 0 bytes"),
            (
                "1,000,000 entries of 0 bytes",
                Box::new(|h| {
                    h.number_of_partition_entries = 1_000_000;
                    h.size_of_partition_entry = 0;
                }),
                "entries of 0 bytes",
            ),
            (
                "20,000,000 entries",
                Box::new(|h| h.number_of_partition_entries = 20_000_000),
                "20000000 partition entries",
            ),
            ("entry size 256", Box::new(|h| h.size_of_partition_entry = 256), "entries of 256 bytes"),
            ("array at LBA u64::MAX", Box::new(|h| h.partition_entry_lba = u64::MAX), "extends beyond the end"),
            (
                "array past the end",
                Box::new(|h| {
                    h.partition_entry_lba = 8190;
                    h.number_of_partition_entries = 4096;
                }),
                "extends beyond the end",
            ),
        ];
        for (what, f, says) in cases {
            let d = edit(good.clone(), f);
            let started = Instant::now();
            let e = read_all(&d).expect_err(what);
            assert!(e.contains(says), "{what}: {e}");
            assert!(started.elapsed() < Duration::from_secs(5), "{what}: {:?}", started.elapsed());
        }
    }

    #[test]
    fn entries_gptman_would_panic_on_are_read() {
        // The one used entry at LBA 0, not the first usable LBA: `gptman::GPT::read_from`'s
        // alignment search unwraps None.
        let d = disk(&[(0, 10)]);
        let t = read_all(&d).expect("reads").expect("a table");
        assert_eq!(t.p1, Some(Part { start: 0, size: 11 * 512 }));
        // An entry ending at the last possible LBA: its size does not fit in 64 bits.
        let e = read_all(&disk(&[(0, u64::MAX)])).expect_err("too large");
        assert!(e.contains("beyond any possible image"), "{e}");
        // A damaged array is refused by its CRC32.
        let mut d = disk(&[(2048, 4095)]);
        d[2 * 512 + 32] ^= 1;
        assert!(read_all(&d).expect_err("crc").contains("CRC32"));
    }
}
