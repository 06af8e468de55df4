//! Measured guest disk images built with the real tools, on regular files (no loop
//! devices): a filesystem from `mkfs.erofs`, `mkfs.ext4 -d` or `mkfs.xfs`, its dm-verity
//! tree from `veritysetup format --no-superblock`, both placed in partitions 1 and 2 of a
//! GPT or MBR made by `sfdisk`. [`veritysetup_verify`] is the oracle: partitions as
//! `sfdisk --json` reads them, extracted to files, checked by `veritysetup verify`.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The tools the measured-image tests need, as `#[ignore]` would name them; `None` when
/// all are on `PATH`.
pub fn missing_tools() -> Option<String> {
    let need = ["mkfs.erofs", "mkfs.ext4", "sfdisk", "veritysetup"];
    let missing: Vec<&str> = need.iter().copied().filter(|t| !on_path(t)).collect();
    if missing.is_empty() { None } else { Some(format!("needs {} (tests/run installs them)", missing.join(", "))) }
}

/// Whether a command is on `PATH` (or in /sbin, /usr/sbin).
pub fn on_path(cmd: &str) -> bool {
    let mut dirs: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    dirs.push("/usr/sbin".into());
    dirs.push("/sbin".into());
    dirs.iter().any(|d| d.join(cmd).is_file())
}

fn tool(cmd: &str) -> Command {
    let on_path =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).any(|d| d.join(cmd).is_file())).unwrap_or(false);
    if !on_path {
        for d in ["/usr/sbin", "/sbin"] {
            let p = Path::new(d).join(cmd);
            if p.is_file() {
                return Command::new(p);
            }
        }
    }
    Command::new(cmd)
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Filesystem of the data partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fs {
    /// `mkfs.erofs`.
    Erofs,
    /// `mkfs.ext4 -d`.
    Ext4,
    /// `mkfs.xfs` (fstests' small-filesystem override).
    Xfs,
}

/// Partition table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Label {
    /// GUID partition table.
    Gpt,
    /// DOS/MBR.
    Mbr,
}

/// dm-verity parameters as `veritysetup format` printed them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verity {
    /// Root hash (64 hex).
    pub root_hash: String,
    /// Salt (hex).
    pub salt: String,
    /// Data blocks.
    pub data_blocks: u64,
    /// Data block size.
    pub data_block_size: u32,
    /// Hash block size.
    pub hash_block_size: u32,
}

impl Verity {
    /// Kata's `kernel_verity_params` form.
    pub fn kata_params(&self) -> String {
        format!(
            "root_hash={},salt={},data_blocks={},data_block_size={},hash_block_size={}",
            self.root_hash, self.salt, self.data_blocks, self.data_block_size, self.hash_block_size
        )
    }
}

/// A filesystem image file `<name>.fs` built from a few files (`bytes` of payload).
pub fn filesystem(dir: &Path, name: &str, fs: Fs, bytes: usize) -> PathBuf {
    let src = dir.join(format!("{name}.src"));
    std::fs::create_dir_all(src.join("usr/bin")).expect("mkdir");
    let mut payload = vec![0u8; bytes];
    let mut x = 0x9e37_79b9u32;
    for b in payload.iter_mut() {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        *b = x as u8;
    }
    std::fs::write(src.join("usr/bin/agent"), &payload).expect("write");
    std::fs::write(src.join("etc-release"), b"kata-addons test guest\n").expect("write");
    let out = dir.join(format!("{name}.fs"));
    let _ = std::fs::remove_file(&out);
    match fs {
        Fs::Erofs => {
            run(tool("mkfs.erofs").arg("--quiet").arg("-T0").arg(&out).arg(&src));
        }
        Fs::Ext4 => {
            let size_kib = (bytes / 1024) * 2 + 4096;
            run(tool("mkfs.ext4")
                .args(["-q", "-F", "-b", "4096", "-d"])
                .arg(&src)
                .arg(&out)
                .arg(format!("{size_kib}k")));
        }
        Fs::Xfs => {
            let f = std::fs::File::create(&out).expect("create");
            f.set_len(((bytes as u64 * 2) + (16 << 20)).max(16 << 20)).expect("size");
            // fstests' override of the 300 MiB minimum, for a small test filesystem.
            run(tool("mkfs.xfs")
                .args(["-q", "-f"])
                .env("TEST_DIR", "1")
                .env("TEST_DEV", "1")
                .env("QA_CHECK_FS", "1")
                .arg(&out));
        }
    }
    out
}

/// `veritysetup format --no-superblock` of `data` into a new hash file.
pub fn format(data: &Path, hash: &Path, salt: &str, data_block_size: u32, hash_block_size: u32) -> Verity {
    let _ = std::fs::remove_file(hash);
    let out = run(tool("veritysetup")
        .args(["format", "--no-superblock"])
        .arg(format!("--salt={salt}"))
        .arg(format!("--data-block-size={data_block_size}"))
        .arg(format!("--hash-block-size={hash_block_size}"))
        .arg(data)
        .arg(hash));
    let field = |name: &str| -> String {
        out.lines()
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
            .unwrap_or_else(|| panic!("veritysetup format printed no {name}: {out}"))
    };
    Verity {
        root_hash: field("Root hash:"),
        salt: field("Salt:"),
        data_blocks: field("Data blocks:").parse().expect("data blocks"),
        data_block_size,
        hash_block_size,
    }
}

/// Sectors of `len` bytes, rounded up to 1 MiB (sfdisk's alignment).
fn mib_sectors(len: u64) -> u64 {
    len.div_ceil(1 << 20) * 2048
}

/// A disk with `parts` (files) in partitions 1.. under `label`, each partition 1 MiB
/// aligned and `extra` bytes larger than its file; returns the disk path.
pub fn disk(path: &Path, label: Label, parts: &[&Path], extra: u64) -> PathBuf {
    let mut script = format!("label: {}\n", if label == Label::Gpt { "gpt" } else { "dos" });
    let mut start = 2048u64;
    let mut placed = Vec::new();
    for p in parts {
        let len = std::fs::metadata(p).expect("part").len() + extra;
        let sectors = mib_sectors(len);
        script.push_str(&format!("start={start}, size={sectors}\n"));
        placed.push((p, start));
        start += sectors;
    }
    let f = std::fs::File::create(path).expect("disk");
    f.set_len((start + 2048) * 512).expect("size");
    drop(f);
    let mut child = tool("sfdisk")
        .args(["--quiet", "--no-reread", "--no-tell-kernel"])
        .arg(path)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("sfdisk");
    child.stdin.take().expect("stdin").write_all(script.as_bytes()).expect("script");
    assert!(child.wait().expect("sfdisk").success(), "sfdisk failed on {script}");
    let mut disk = std::fs::OpenOptions::new().write(true).open(path).expect("open disk");
    for (p, start) in placed {
        disk.seek(SeekFrom::Start(start * 512)).expect("seek");
        let mut src = std::fs::File::open(p).expect("part");
        std::io::copy(&mut src, &mut disk).expect("copy");
    }
    path.to_path_buf()
}

/// Partitions (start, size) in bytes as `sfdisk --json` reads the disk, by number.
pub fn sfdisk_partitions(disk: &Path) -> Option<Vec<(u32, u64, u64)>> {
    let out = tool("sfdisk").arg("--json").arg(disk).output().expect("sfdisk --json");
    if !out.status.success() {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let parts = v["partitiontable"]["partitions"].as_array()?;
    let mut got = Vec::new();
    for p in parts {
        let node = p["node"].as_str()?;
        let digits: String = node.chars().rev().take_while(|c| c.is_ascii_digit()).collect();
        let n: u32 = digits.chars().rev().collect::<String>().parse().ok()?;
        got.push((n, p["start"].as_u64()? * 512, p["size"].as_u64()? * 512));
    }
    Some(got)
}

/// Copies `len` bytes at `start` of `disk` into a new file.
pub fn extract(disk: &Path, start: u64, len: u64, to: &Path) {
    let mut f = std::fs::File::open(disk).expect("disk");
    f.seek(SeekFrom::Start(start)).expect("seek");
    let mut out = std::fs::File::create(to).expect("create");
    std::io::copy(&mut Read::by_ref(&mut f).take(len), &mut out).expect("copy");
}

/// The oracle: `veritysetup verify --no-superblock` on partitions 1 and 2 of `disk` as
/// sfdisk reads them. `Err` names why veritysetup could not even be asked (no partition
/// table, no partition 2): the guest has no hash device then either.
pub fn veritysetup_verify(disk: &Path, v: &Verity, scratch: &Path) -> Result<bool, String> {
    let parts = sfdisk_partitions(disk).ok_or("no partition table")?;
    let find = |n| parts.iter().find(|p| p.0 == n).map(|p| (p.1, p.2));
    let p1 = find(1).ok_or("no partition 1")?;
    let p2 = find(2).ok_or("no partition 2")?;
    let (d, h) = (scratch.join("p1"), scratch.join("p2"));
    extract(disk, p1.0, p1.1, &d);
    extract(disk, p2.0, p2.1, &h);
    let out = tool("veritysetup")
        .args(["verify", "--no-superblock"])
        .arg(format!("--salt={}", v.salt))
        .arg(format!("--data-blocks={}", v.data_blocks))
        .arg(format!("--data-block-size={}", v.data_block_size))
        .arg(format!("--hash-block-size={}", v.hash_block_size))
        .arg(&d)
        .arg(&h)
        .arg(&v.root_hash)
        .output()
        .expect("veritysetup verify");
    let _ = std::fs::remove_file(&d);
    let _ = std::fs::remove_file(&h);
    Ok(out.status.success())
}

/// Flips one byte of a file at `offset`.
pub fn flip(path: &Path, offset: u64) {
    let mut f = std::fs::OpenOptions::new().read(true).write(true).open(path).expect("open");
    f.seek(SeekFrom::Start(offset)).expect("seek");
    let mut b = [0u8; 1];
    f.read_exact(&mut b).expect("read");
    f.seek(SeekFrom::Start(offset)).expect("seek");
    f.write_all(&[b[0] ^ 0x5a]).expect("write");
}

/// A measured disk: filesystem `fs` in partition 1, its tree in partition 2.
pub fn measured(dir: &Path, name: &str, fs: Fs, label: Label, salt: &str, dbs: u32, hbs: u32) -> (PathBuf, Verity) {
    let data = filesystem(dir, name, fs, 300 * 1024);
    let hash = dir.join(format!("{name}.hash"));
    let v = format(&data, &hash, salt, dbs, hbs);
    let disk_path = dir.join(format!("{name}.img"));
    disk(&disk_path, label, &[&data, &hash], 0);
    (disk_path, v)
}

/// A field of the primary GPT header (LBA 1), at its byte offset and width there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GptField {
    /// `my_lba` (8 bytes at 24).
    MyLba,
    /// `alternate_lba` (8 bytes at 32).
    AlternateLba,
    /// `first_usable_lba` (8 bytes at 40).
    FirstUsableLba,
    /// `last_usable_lba` (8 bytes at 48).
    LastUsableLba,
    /// `partition_entry_lba` (8 bytes at 72).
    EntriesLba,
    /// `number_of_partition_entries` (4 bytes at 80).
    Entries,
    /// `size_of_partition_entry` (4 bytes at 84).
    EntrySize,
}

impl GptField {
    /// Every field, for mutators.
    pub const ALL: [GptField; 7] = [
        GptField::MyLba,
        GptField::AlternateLba,
        GptField::FirstUsableLba,
        GptField::LastUsableLba,
        GptField::EntriesLba,
        GptField::Entries,
        GptField::EntrySize,
    ];

    /// Byte offset in the header and width.
    pub fn place(self) -> (usize, usize) {
        match self {
            GptField::MyLba => (24, 8),
            GptField::AlternateLba => (32, 8),
            GptField::FirstUsableLba => (40, 8),
            GptField::LastUsableLba => (48, 8),
            GptField::EntriesLba => (72, 8),
            GptField::Entries => (80, 4),
            GptField::EntrySize => (84, 4),
        }
    }
}

/// Sets fields of the primary GPT header in the disk image bytes `d` (512-byte sectors) and
/// recomputes the header's CRC32 (over its `header_size` bytes with the CRC field zeroed),
/// so the header still reads as intact: what an attacker who edits a disk image does.
pub fn set_gpt_header(d: &mut [u8], edits: &[(GptField, u64)]) {
    const LBA1: usize = 512;
    for (f, v) in edits {
        let (off, width) = f.place();
        d[LBA1 + off..LBA1 + off + width].copy_from_slice(&v.to_le_bytes()[..width]);
    }
    let size = u32::from_le_bytes(d[LBA1 + 12..LBA1 + 16].try_into().expect("4 bytes")).clamp(92, 512) as usize;
    d[LBA1 + 16..LBA1 + 20].copy_from_slice(&[0; 4]);
    let crc = crc32fast::hash(&d[LBA1..LBA1 + size]);
    d[LBA1 + 16..LBA1 + 20].copy_from_slice(&crc.to_le_bytes());
}

/// A field of the primary GPT header of `d`.
pub fn gpt_header_field(d: &[u8], f: GptField) -> u64 {
    let (off, width) = f.place();
    let mut b = [0u8; 8];
    b[..width].copy_from_slice(&d[512 + off..512 + off + width]);
    u64::from_le_bytes(b)
}

/// [`set_gpt_header`] on a disk image file.
pub fn edit_gpt_header(disk: &Path, edits: &[(GptField, u64)]) {
    let mut d = std::fs::read(disk).expect("read disk");
    set_gpt_header(&mut d, edits);
    std::fs::write(disk, d).expect("write disk");
}

/// The hostile GPT headers of the partition-table crash: entry count and entry size as an
/// attacker sets them (header CRC recomputed), with what each did before they were bounded.
pub const HOSTILE_GPT_HEADERS: [(&str, u64, u64); 4] = [
    ("0xFFFFFFFF entries", 0xFFFF_FFFF, 128),
    ("entry size 0", 128, 0),
    ("1,000,000 entries of 0 bytes", 1_000_000, 0),
    ("20,000,000 entries", 20_000_000, 128),
];
