//! Partitions 1 and 2 of a disk image, as the guest kernel numbers them (`vda1`, `vda2`):
//! a GPT (behind its protective MBR) numbers partitions by entry, an MBR by primary slot.
//! Both tables are read with cecton's maintained `gptman` and `mbrman` crates; 512-byte
//! logical sectors, what the guest's virtio-blk disk reports.

use std::io::{Read, Seek, SeekFrom};

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
        r.seek(SeekFrom::Start(0)).map_err(|e| format!("reading the GPT: {e}"))?;
        let gpt = gptman::GPT::read_from(r, SECTOR).map_err(|e| format!("the GPT does not read: {e}"))?;
        let entry = |i: u32| -> Result<Option<Part>, String> {
            let Some((_, e)) = gpt.iter().find(|(n, _)| *n == i) else { return Ok(None) };
            if !e.is_used() {
                return Ok(None);
            }
            if e.ending_lba < e.starting_lba {
                return Err(format!(
                    "GPT partition {i} ends (LBA {}) before it starts (LBA {})",
                    e.ending_lba, e.starting_lba
                ));
            }
            part(i, e.starting_lba, e.ending_lba - e.starting_lba + 1)
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

fn part(i: u32, lba: u64, sectors: u64) -> Result<Option<Part>, String> {
    let start = lba.checked_mul(SECTOR);
    let size = sectors.checked_mul(SECTOR);
    match (start, size) {
        (Some(start), Some(size)) if size > 0 => Ok(Some(Part { start, size })),
        (Some(_), Some(_)) => Ok(None),
        _ => Err(format!("partition {i} lies beyond any possible image")),
    }
}
