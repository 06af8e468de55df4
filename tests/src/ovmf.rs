//! Test firmware shaped like Kata's AMDSEV OVMF (`OvmfPkg/AmdSev`): the OVMF footer table
//! (GUIDed entries ending 32 bytes before the end of the image), the SEV metadata (`ASEV`
//! header and its sections, a kernel-hashes page among them), the SEV hash table entry and
//! the SEV-ES reset block, and `sev-snp-measure` (PyPI, in the venv `tests/run` creates) as
//! the oracle of the launch digest.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Footer table GUID `96b582de-1fb2-45f7-baea-a366c55a082d`.
pub const FOOTER: &str = "96b582de-1fb2-45f7-baea-a366c55a082d";
/// SEV hash table (kernel hashes) GUID.
pub const HASH_TABLE: &str = "7255371f-3a3b-4b04-927b-1da6efa8d454";
/// SEV-ES reset block GUID.
pub const RESET: &str = "00f771de-1a7e-4fcb-890e-68c77e2fb44e";
/// SEV metadata GUID.
pub const META: &str = "dc886566-984a-4798-a75e-5585a7bf67cc";

/// SEV metadata section types.
pub const SEC_MEM: u32 = 1;
/// The secrets page.
pub const SECRETS: u32 = 2;
/// The CPUID page.
pub const CPUID: u32 = 3;
/// The SVSM calling area.
pub const SVSM_CAA: u32 = 4;
/// The kernel-hashes page.
pub const KERNEL_HASHES: u32 = 0x10;

/// A GUID's little-endian (OVMF) bytes from its text.
pub fn guid_le(text: &str) -> [u8; 16] {
    let hex: String = text.chars().filter(|c| *c != '-').collect();
    let b: Vec<u8> = (0..16).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex")).collect();
    [b[3], b[2], b[1], b[0], b[5], b[4], b[7], b[6], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]
}

/// A firmware image to build.
#[derive(Debug, Clone)]
pub struct Ovmf {
    /// Image size (a multiple of 4096 for a valid image).
    pub size: usize,
    /// SEV metadata sections: (gpa, size, type).
    pub sections: Vec<(u32, u32, u32)>,
    /// The APs' reset address (SEV-ES reset block).
    pub reset_eip: u32,
    /// The SEV hash table descriptor (base, size); `None` leaves the entry out.
    pub hash_table: Option<(u32, u32)>,
    /// Where the metadata header sits, in bytes before the end.
    pub meta_from_end: usize,
    /// More footer table entries (GUID text, data), placed first (nearest the start).
    pub extra: Vec<(String, Vec<u8>)>,
    /// Varies the page contents.
    pub seed: u8,
}

impl Ovmf {
    /// An image laid out like the AMDSEV build's: 2 MiB, the SEV sections at 8 MiB.
    pub fn amdsev(seed: u8) -> Ovmf {
        Ovmf {
            size: 2 << 20,
            sections: vec![
                (0x80_0000, 0x9000, SEC_MEM),
                (0x80_9000, 0x2000, SEC_MEM),
                (0x80_b000, 0x1000, SECRETS),
                (0x80_c000, 0x1000, CPUID),
                (0x80_d000, 0x1000, SVSM_CAA),
                (0x80_e000, 0x1000, KERNEL_HASHES),
                (0x80_f000, 0x1_1000, SEC_MEM),
            ],
            reset_eip: 0xffff_f004,
            hash_table: Some((0x80_e000, 0x400)),
            meta_from_end: 0x1000,
            extra: Vec::new(),
            seed,
        }
    }

    /// The image bytes.
    pub fn build(&self) -> Vec<u8> {
        let mut fw: Vec<u8> =
            (0..self.size).map(|i| ((i / 4096) as u8).wrapping_mul(31).wrapping_add(self.seed ^ (i as u8))).collect();
        let mut meta = b"ASEV".to_vec();
        meta.extend((16 + 12 * self.sections.len() as u32).to_le_bytes());
        meta.extend(1u32.to_le_bytes());
        meta.extend((self.sections.len() as u32).to_le_bytes());
        for (gpa, size, kind) in &self.sections {
            meta.extend(gpa.to_le_bytes());
            meta.extend(size.to_le_bytes());
            meta.extend(kind.to_le_bytes());
        }
        let at = self.size - self.meta_from_end;
        fw[at..at + meta.len()].copy_from_slice(&meta);
        let entry = |g: &str, data: &[u8]| {
            let mut e = data.to_vec();
            e.extend(((data.len() + 18) as u16).to_le_bytes());
            e.extend(guid_le(g));
            e
        };
        let mut body = Vec::new();
        for (g, d) in &self.extra {
            body.extend(entry(g, d));
        }
        body.extend(entry(RESET, &self.reset_eip.to_le_bytes()));
        body.extend(entry(META, &(self.meta_from_end as u32).to_le_bytes()));
        if let Some((base, size)) = self.hash_table {
            body.extend(entry(HASH_TABLE, &[base.to_le_bytes(), size.to_le_bytes()].concat()));
        }
        let table = entry(FOOTER, &body);
        let end = self.size - 32;
        fw[end - table.len()..end].copy_from_slice(&table);
        fw
    }
}

/// Offset of the footer table's own entry header (size, GUID) in an image of `size` bytes.
pub fn footer_at(size: usize) -> usize {
    size - 32 - 18
}

/// `sev-snp-measure`: `$KATA_ADDONS_SNP_MEASURE`, else where `tests/run` installs it
/// (`${XDG_CACHE_HOME:-~/.cache}/kata-addons/snp-venv/bin/sev-snp-measure`).
pub fn oracle() -> PathBuf {
    if let Some(p) = std::env::var_os("KATA_ADDONS_SNP_MEASURE") {
        return PathBuf::from(p);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache"));
    cache.join("kata-addons/snp-venv/bin/sev-snp-measure")
}

/// What `sev-snp-measure --mode snp` prints for one guest: the digest (hex), or its error.
pub fn measure(
    firmware: &Path,
    kernel: &Path,
    initrd: Option<&Path>,
    append: &str,
    vcpus: u32,
    vcpu_type: &str,
) -> Result<String, String> {
    let mut cmd = Command::new(oracle());
    cmd.args(["--mode", "snp", "--output-format", "hex"])
        .arg(format!("--vcpus={vcpus}"))
        .arg(format!("--vcpu-type={vcpu_type}"))
        .arg("--ovmf")
        .arg(firmware)
        .arg("--kernel")
        .arg(kernel)
        .arg(format!("--append={append}"));
    if let Some(i) = initrd {
        cmd.arg("--initrd").arg(i);
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("run {} (tests/run installs it): {e}", oracle().display()));
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}
