//! `snp_launch_measurement`: the AMD SEV-SNP launch digest of a runtime configuration's
//! guest, for every vCPU count it may boot with (`docs/attestation.md`).
//!
//! The digest is virtee's `sev` crate's (`measurement::snp`), fed the configuration's
//! `firmware`, `kernel` and `initrd`, the command line Kata composes ([`super::cmdline`]),
//! QEMU's VMM type, guest features `0x1` (SNPActive: what QEMU sets and what
//! `sev-snp-measure` and Kata's CI assume) and the vCPU type Kata passes (`EPYC-v4`).
//!
//! Every input byte is hashed once for all counts: the crate measures the firmware pages,
//! the metadata pages and the kernel-hashes page once (a call with 0 vCPUs, whose digest is
//! the one every count continues from), then the smallest count continues from that digest
//! (the crate's `ovmf_hash_str` seed) over a firmware tail whose SEV metadata lists no
//! section: only its VMSA pages are measured. Each larger count continues from the digest
//! of the count before it over the application processors' VMSA pages it adds (the VMSA
//! pages are measured last, the bootstrap processor's first, and every AP's page is the
//! same), so `n` vCPUs cost one page update each, not `n`: see [`extend_aps`].
//!
//! The firmware file is hostile: it is read with a size cap, and [`Firmware::check`] checks
//! every offset and size the crate's OVMF parser and page updates rely on (they index and
//! assert without checks) before the crate sees the bytes, from a sealed in-memory copy.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::PathBuf;

use sev::measurement::ovmf::OVMF;
use sev::measurement::snp::{SnpMeasurementArgs, snp_calc_launch_digest};
use sev::measurement::vcpu_types::CpuType;
use sev::measurement::vmsa::{GuestFeatures, VMMType, VMSA};
use sha2::{Digest, Sha384};

use super::cmdline::{self, Runtime};
use super::{Provenance, RefValue, Target, Value};
use crate::kata_config::Setting;

/// The vCPU type both Kata runtimes pass to QEMU for SNP guests (Go `qemu_amd64.go:245`,
/// runtime-rs `cmdline_generator.rs:3422`).
pub const DEFAULT_VCPU_TYPE: &str = "EPYC-v4";
/// Largest firmware read (an OVMF image is a few MiB and must fit below 4 GiB).
pub const MAX_FIRMWARE: u64 = 32 << 20;
/// Largest kernel or initrd measured (the crate reads each whole into memory).
pub const MAX_BOOT_FILE: u64 = 1 << 30;
/// Most vCPUs measured (QEMU's q35 limit with x2APIC is 1024).
pub const MAX_VCPUS: u32 = 1024;
/// Most guest pages the firmware's SEV metadata may describe (256 MiB).
const MAX_METADATA_PAGES: u64 = 1 << 16;

const PAGE: usize = 4096;
/// The footer table ends this many bytes before the end of the image.
const FOOTER_GAP: usize = 32;
/// A footer table entry's header: `u16` size and a GUID, after the entry's data.
const ENTRY_HEADER: usize = 18;
/// `OvmfSevMetadataHeader`: signature, size, version, number of items.
const META_HEADER: usize = 16;
/// `OvmfSevMetadataSectionDesc`: gpa, size, type (`u32` each).
const META_ITEM: usize = 12;
/// QEMU's `PaddedSevHashTable` (168 bytes of table, padded to 16).
const HASH_TABLE: usize = 176;

/// A GUID's little-endian bytes, as OVMF stores them.
const fn guid(d1: u32, d2: u16, d3: u16, d4: [u8; 8]) -> [u8; 16] {
    let a = d1.to_le_bytes();
    let b = d2.to_le_bytes();
    let c = d3.to_le_bytes();
    [a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], d4[0], d4[1], d4[2], d4[3], d4[4], d4[5], d4[6], d4[7]]
}

/// `96b582de-1fb2-45f7-baea-a366c55a082d`: the footer table itself.
const FOOTER_GUID: [u8; 16] = guid(0x96b5_82de, 0x1fb2, 0x45f7, [0xba, 0xea, 0xa3, 0x66, 0xc5, 0x5a, 0x08, 0x2d]);
/// `7255371f-3a3b-4b04-927b-1da6efa8d454`: where QEMU writes the kernel hashes table.
const HASH_TABLE_GUID: [u8; 16] = guid(0x7255_371f, 0x3a3b, 0x4b04, [0x92, 0x7b, 0x1d, 0xa6, 0xef, 0xa8, 0xd4, 0x54]);
/// `00f771de-1a7e-4fcb-890e-68c77e2fb44e`: the SEV-ES reset block (the APs' reset address).
const RESET_GUID: [u8; 16] = guid(0x00f7_71de, 0x1a7e, 0x4fcb, [0x89, 0x0e, 0x68, 0xc7, 0x7e, 0x2f, 0xb4, 0x4e]);
/// `dc886566-984a-4798-a75e-5585a7bf67cc`: the SEV metadata (the pages the PSP measures).
const META_GUID: [u8; 16] = guid(0xdc88_6566, 0x984a, 0x4798, [0xa7, 0x5e, 0x55, 0x85, 0xa7, 0xbf, 0x67, 0xcc]);

/// SEV metadata section types (`OvmfSevMetadata.asm`).
const SEC_MEM: u32 = 1;
const SECRETS: u32 = 2;
const CPUID: u32 = 3;
const SVSM_CAA: u32 = 4;
const KERNEL_HASHES: u32 = 0x10;

fn le16(b: &[u8], at: usize) -> usize {
    usize::from(u16::from_le_bytes([b[at], b[at + 1]]))
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// A firmware image whose footer table, SEV metadata and kernel-hashes table were checked
/// against everything the `sev` crate's parser and page updates assume.
pub struct Firmware {
    bytes: Vec<u8>,
    /// Offset of the SEV metadata header.
    meta: usize,
    /// Bytes at the end that hold the footer table and the metadata header.
    tail: usize,
}

impl Firmware {
    /// Checks a firmware image; the reason names what is missing or damaged.
    pub fn check(bytes: Vec<u8>) -> Result<Firmware, String> {
        let size = bytes.len();
        if size < FOOTER_GAP + ENTRY_HEADER || !size.is_multiple_of(PAGE) || size as u64 > MAX_FIRMWARE {
            return Err(format!(
                "is {size} bytes: an OVMF image is a whole number of 4 KiB pages, at most {MAX_FIRMWARE} bytes"
            ));
        }
        let footer = size - FOOTER_GAP - ENTRY_HEADER;
        if bytes[footer + 2..footer + ENTRY_HEADER] != FOOTER_GUID {
            return Err(
                "has no OVMF footer table (GUID 96b582de-1fb2-45f7-baea-a366c55a082d 32 bytes before its end): \
                 it is not an OVMF image built for SEV"
                    .into(),
            );
        }
        let total = le16(&bytes, footer);
        if total < ENTRY_HEADER || total - ENTRY_HEADER > footer {
            return Err(format!("has a damaged OVMF footer table: it claims {total} bytes"));
        }
        let table = &bytes[footer - (total - ENTRY_HEADER)..footer];
        // The entries, walked from the end as the crate walks them (a later entry with the
        // same GUID, nearer the start, replaces an earlier one there too).
        let mut entries: Vec<([u8; 16], &[u8])> = Vec::new();
        let mut off = table.len();
        while off >= ENTRY_HEADER {
            let esize = le16(table, off - ENTRY_HEADER);
            if esize < ENTRY_HEADER || esize > off {
                return Err(format!(
                    "has a damaged OVMF footer table: an entry of {esize} bytes at table offset {off} (entries are \
                     18 bytes of header and their data, inside the table)"
                ));
            }
            let mut g = [0u8; 16];
            g.copy_from_slice(&table[off - 16..off]);
            entries.retain(|(h, _)| *h != g);
            entries.push((g, &table[off - esize..off - ENTRY_HEADER]));
            off -= esize;
        }
        let entry = |g, name, min| find(&entries, g, name, min);
        let reset = entry(RESET_GUID, "SEV-ES reset block (00f771de-1a7e-4fcb-890e-68c77e2fb44e)", 4)?;
        if le32(reset, 0) == 0 {
            return Err("has an SEV-ES reset block with address 0".into());
        }
        let meta_entry = entry(META_GUID, "SEV metadata (dc886566-984a-4798-a75e-5585a7bf67cc)", 4)?;
        let from_end = le32(meta_entry, 0) as usize;
        if from_end > size || from_end < META_HEADER || i32::try_from(from_end).is_err() {
            return Err(format!("has a damaged SEV metadata entry: its header {from_end} bytes before the end"));
        }
        let meta = size - from_end;
        let h = &bytes[meta..meta + META_HEADER];
        if &h[0..4] != b"ASEV" || le32(h, 8) != 1 {
            return Err("has a damaged SEV metadata header (signature `ASEV`, version 1 expected)".into());
        }
        let (hsize, items) = (le32(h, 4) as usize, le32(h, 12) as usize);
        if hsize < META_HEADER || hsize > from_end || items > (hsize - META_HEADER) / META_ITEM {
            return Err(format!("has a damaged SEV metadata header: {hsize} bytes for {items} sections"));
        }
        let mut pages = 0u64;
        let mut hashes = false;
        for i in 0..items {
            let d = &bytes[meta + META_HEADER + i * META_ITEM..meta + META_HEADER + (i + 1) * META_ITEM];
            let (gpa, len, kind) = (u64::from(le32(d, 0)), u64::from(le32(d, 4)), le32(d, 8));
            let what = format!("SEV metadata section {i} (type {kind:#x}, {len} bytes at {gpa:#x})");
            if !matches!(kind, SEC_MEM | SECRETS | CPUID | SVSM_CAA | KERNEL_HASHES) {
                return Err(format!("has an unknown {what}"));
            }
            if !gpa.is_multiple_of(PAGE as u64) || !len.is_multiple_of(PAGE as u64) || gpa + len > 1 << 32 {
                return Err(format!("has a damaged {what}: whole pages below 4 GiB expected"));
            }
            if kind == KERNEL_HASHES {
                if len != PAGE as u64 {
                    return Err(format!("has a damaged {what}: the kernel-hashes section is one page"));
                }
                hashes = true;
            }
            pages += if matches!(kind, SECRETS | CPUID) { 1 } else { len / PAGE as u64 };
        }
        if pages > MAX_METADATA_PAGES {
            return Err(format!(
                "has SEV metadata describing {pages} pages: at most {MAX_METADATA_PAGES} are measured"
            ));
        }
        if !hashes {
            return Err("has SEV metadata without a kernel-hashes section (type 0x10): QEMU cannot measure the \
                        kernel, initrd and command line into this firmware (an OVMF not built for SNP with \
                        kernel hashes, such as Debian's)"
                .into());
        }
        let t = entry(HASH_TABLE_GUID, "SEV hash table (7255371f-3a3b-4b04-927b-1da6efa8d454)", 8)?;
        let (base, tsize) = (le32(t, 0) as usize, le32(t, 4) as usize);
        if base == 0 || tsize < HASH_TABLE || base % PAGE + HASH_TABLE > PAGE {
            return Err(format!(
                "has a damaged SEV hash table entry ({tsize} bytes at {base:#x}): QEMU needs {HASH_TABLE} bytes inside one page"
            ));
        }
        let tail = from_end.max(FOOTER_GAP + total).div_ceil(PAGE).saturating_mul(PAGE).min(size);
        Ok(Firmware { bytes, meta, tail })
    }

    /// The last pages with the footer table and the SEV metadata header, listing no
    /// section: what the crate reads to measure the VMSA pages after a seed digest.
    fn vmsa_only(&self) -> Vec<u8> {
        let start = self.bytes.len() - self.tail;
        let mut t = self.bytes[start..].to_vec();
        let items = self.meta - start + 12;
        t[items..items + 4].copy_from_slice(&0u32.to_le_bytes());
        t
    }
}

/// The data of the footer table entry `g` (`name` in messages), at least `min` bytes.
fn find<'a>(entries: &[([u8; 16], &'a [u8])], g: [u8; 16], name: &str, min: usize) -> Result<&'a [u8], String> {
    match entries.iter().find(|(h, _)| *h == g) {
        Some((_, d)) if d.len() >= min => Ok(d),
        Some((_, d)) => Err(format!("has a damaged {name} entry: {} bytes of data, {min} needed", d.len())),
        None => Err(format!("has no {name} entry in its OVMF footer table")),
    }
}

/// Reads at most `cap` bytes of `file`; more is refused.
pub fn read_capped(file: &File, cap: u64) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    file.take(cap + 1).read_to_end(&mut out).map_err(|e| format!("cannot be read: {e}"))?;
    if out.len() as u64 > cap {
        return Err(format!("is larger than {cap} bytes"));
    }
    Ok(out)
}

/// An anonymous in-memory file holding `data`, and the path the crate opens it by.
fn memfd(name: &str, data: &[u8]) -> Result<(File, PathBuf), String> {
    let fd = rustix::fs::memfd_create(name, rustix::fs::MemfdFlags::CLOEXEC)
        .map_err(|e| format!("cannot create an in-memory file: {e}"))?;
    let mut f = File::from(fd);
    f.write_all(data).map_err(|e| format!("cannot write an in-memory file: {e}"))?;
    let path = proc_path(&f);
    Ok((f, path))
}

/// `/proc/self/fd/N`: the crate takes paths, and this one is the open file itself.
fn proc_path(f: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()))
}

/// The `sev` crate's vCPU type for a QEMU CPU model name; the reason lists the known ones.
pub fn vcpu_type(name: &str) -> Result<CpuType, String> {
    CpuType::try_from(name).map_err(|_| {
        format!(
            "unknown vCPU type {name:?}: the known ones are EPYC, EPYC-v1..v4, EPYC-IBPB, EPYC-Rome(-v1..v3), \
             EPYC-Milan(-v1, -v2), EPYC-Genoa(-v1), EPYC-Turin(-v1, -v2)"
        )
    })
}

/// Checks a command line the way QEMU hands it to the measurement: no NUL, no white space
/// at either end (the crate trims it; QEMU measures it byte for byte).
pub fn check_cmdline(cmdline: &str) -> Result<(), String> {
    if cmdline.contains('\0') {
        return Err("the kernel command line contains a NUL byte: QEMU cannot pass it".into());
    }
    if cmdline.trim() != cmdline {
        return Err("the kernel command line starts or ends with white space: QEMU measures it as given but the \
                    measurement library trims it; give it without"
            .into());
    }
    Ok(())
}

/// The launch digests (96 hex) of one guest for each of `counts` vCPUs, in order: every
/// byte of firmware, kernel and initrd hashed once (see the module documentation).
pub fn launch_digests(
    fw: &Firmware,
    kernel: &File,
    initrd: Option<&File>,
    cmdline: &str,
    vcpu: CpuType,
    counts: &[u32],
) -> Result<Vec<String>, String> {
    check_cmdline(cmdline)?;
    if let Some(n) = counts.iter().find(|n| **n == 0 || **n > MAX_VCPUS) {
        return Err(format!("{n} vCPUs: 1 to {MAX_VCPUS} are measured"));
    }
    for (f, what) in std::iter::once((kernel, "the kernel")).chain(initrd.map(|f| (f, "the initrd"))) {
        let len = f.metadata().map_err(|e| format!("{what} cannot be inspected: {e}"))?.len();
        if len > MAX_BOOT_FILE {
            return Err(format!("{what} is {len} bytes: at most {MAX_BOOT_FILE} are measured"));
        }
    }
    let (_full, full_path) = memfd("kata-addons-firmware", &fw.bytes)?;
    let (_tail, tail_path) = memfd("kata-addons-firmware-tail", &fw.vmsa_only())?;
    let args = |vcpus: u32, ovmf: PathBuf| SnpMeasurementArgs {
        vcpus,
        vcpu_type: vcpu,
        ovmf_file: ovmf,
        guest_features: GuestFeatures(1),
        kernel_file: None,
        initrd_file: None,
        append: None,
        ovmf_hash_str: None,
        vmm_type: Some(VMMType::QEMU),
    };
    let failed = |e: sev::error::MeasurementError| format!("the launch digest cannot be computed: {e}");
    let prefix = snp_calc_launch_digest(SnpMeasurementArgs {
        kernel_file: Some(proc_path(kernel)),
        initrd_file: initrd.map(proc_path),
        append: Some(cmdline),
        ..args(0, full_path)
    })
    .map_err(failed)?
    .get_hex_ld();
    let mut sorted = counts.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let (Some(&first), Some(&last)) = (sorted.first(), sorted.last()) else {
        return Ok(Vec::new());
    };
    // The smallest count from the crate; the APs' VMSA page as the crate builds it.
    let start =
        snp_calc_launch_digest(SnpMeasurementArgs { ovmf_hash_str: Some(&prefix), ..args(first, tail_path.clone()) })
            .map_err(failed)?
            .get_hex_ld();
    let ap_eip = OVMF::new(tail_path).and_then(|o| Ok(o.sev_es_reset_eip()?)).map_err(failed)?;
    let pages = VMSA::new(ap_eip.into(), vcpu, VMMType::QEMU, Some(u64::from(last)), GuestFeatures(1))
        .pages(2)
        .map_err(failed)?;
    let ap = pages.get(1).ok_or("the firmware has no SEV-ES reset address for the application processors")?;
    let mut ld = from_hex(&start)?;
    let mut at = first;
    let mut digests = Vec::with_capacity(sorted.len());
    for n in sorted {
        ld = extend_aps(ld, ap, n - at);
        at = n;
        digests.push((n, hex::encode(ld)));
    }
    Ok(counts.iter().filter_map(|n| digests.iter().find(|(c, _)| c == n).map(|(_, d)| d.clone())).collect())
}

/// A launch digest from the crate's hex.
fn from_hex(text: &str) -> Result<[u8; 48], String> {
    let mut out = [0u8; 48];
    hex::decode_to_slice(text, &mut out)
        .map_err(|e| format!("the launch digest {text:?} is not 48 bytes of hex: {e}"))?;
    Ok(out)
}

/// The launch digest `ld` continued over `count` more VMSA pages `page`: each is the
/// SEV-SNP firmware's `SNP_LAUNCH_UPDATE` of a VMSA page, `ld = SHA-384(PAGE_INFO)` with
/// PAGE_INFO = the digest so far, SHA-384 of the page, its length 0x70, page type 2 (VMSA),
/// no IMI, no VMPL permissions, and the VMSA's GPA (AMD SEV-SNP firmware ABI, `PAGE_INFO`;
/// the `sev` crate's `Gctx::update_page`, whose digest the crate does not expose between
/// pages). `tests/tests/snp_measure.rs` checks it against `sev-snp-measure` and the unit
/// tests against the crate's own per-count digest.
fn extend_aps(mut ld: [u8; 48], page: &[u8], count: u32) -> [u8; 48] {
    /// The GPA the VMSA page is recorded at: (u64)-1, page-aligned, bits above 51 clear.
    const VMSA_GPA: u64 = 0xFFFF_FFFF_F000;
    let page_hash = Sha384::digest(page);
    for _ in 0..count {
        let mut info = [0u8; 0x70];
        info[..48].copy_from_slice(&ld);
        info[48..96].copy_from_slice(&page_hash);
        info[96..98].copy_from_slice(&0x70u16.to_le_bytes());
        info[98] = 2;
        info[104..].copy_from_slice(&VMSA_GPA.to_le_bytes());
        ld.copy_from_slice(&Sha384::digest(info));
    }
    ld
}

/// The reference value's name, as Trustee's default SNP policy names it.
pub(crate) const NAME: &str = "snp_launch_measurement";

/// Most bytes of `/proc/cpuinfo` read to count the node's CPUs.
const MAX_CPUINFO: u64 = 16 << 20;

/// The SNP reference values of a target: `snp_launch_measurement`, one value per vCPU count,
/// or why it cannot be computed.
pub(crate) fn reference_values(t: &Target<'_>) -> Vec<Value> {
    match measure(t) {
        Ok((values, provenance)) => {
            vec![Value::Computed(RefValue { name: NAME.to_string(), values, provenance })]
        }
        Err(reason) => vec![Value::Unavailable { name: NAME.to_string(), reason }],
    }
}

/// A boolean setting: `Some(true)` only for TOML `true`.
fn is_true(s: &Option<Setting>) -> bool {
    s.as_ref().is_some_and(|s| s.value == "true")
}

/// The node's CPU count as Kata's Go runtime counts it (`processor` lines of `/proc/cpuinfo`,
/// `pkg/katautils/config.go:456`).
fn host_cpus() -> Result<u32, String> {
    let f = File::open("/proc/cpuinfo").map_err(|e| format!("/proc/cpuinfo cannot be opened: {e}"))?;
    let text = read_capped(&f, MAX_CPUINFO).map_err(|e| format!("/proc/cpuinfo {e}"))?;
    let n = String::from_utf8_lossy(&text)
        .lines()
        .filter(|l| l.split(':').next().is_some_and(|k| k.trim() == "processor"))
        .count();
    u32::try_from(n).ok().filter(|n| *n > 0).ok_or_else(|| "/proc/cpuinfo lists no processor".to_string())
}

/// Whether the node's kernel runs in FIPS mode (what the Go runtime reads,
/// `pkg/katautils/create.go:221`).
fn fips() -> bool {
    std::fs::read_to_string("/proc/sys/crypto/fips_enabled").is_ok_and(|s| s.trim() == "1")
}

/// The vCPU counts: `--vcpus`, else `default_vcpus` to `default_maxvcpus` as both runtimes
/// adjust them (0 or more than the node has: the node's count; `default_vcpus` 0: 1;
/// rounded up; Go caps at 240: `pkg/katautils/config.go:487`, `500`; runtime-rs
/// `kata-types/src/config/hypervisor/mod.rs` `CpuInfo::adjust_config`).
fn counts(t: &Target<'_>, runtime: Runtime, prov: &mut Vec<Provenance>) -> Result<Vec<u32>, String> {
    if let Some((a, b)) = t.overrides.vcpus {
        if a == 0 || b < a || b > MAX_VCPUS {
            return Err(format!("--vcpus {a}-{b}: 1 to {MAX_VCPUS}, the first not above the last"));
        }
        prov.push(Provenance { what: format!("vCPU counts {a} to {b}"), file: None, key: Some("--vcpus".into()) });
        return Ok((a..=b).collect());
    }
    let mut host: Option<u32> = None;
    let mut host_cpus = || -> Result<u32, String> {
        if let Some(h) = host {
            return Ok(h);
        }
        let h = host_cpus()?;
        host = Some(h);
        Ok(h)
    };
    let max_set = match &t.default_maxvcpus {
        None => 0,
        Some(s) => s
            .value
            .parse::<u32>()
            .map_err(|_| format!("default_maxvcpus {:?} in {} is not a count", s.value, s.from))?,
    };
    let mut max = if max_set == 0 || max_set > host_cpus()? { host_cpus()? } else { max_set };
    if runtime == Runtime::Go {
        max = max.min(240);
    }
    let vcpus = match &t.default_vcpus {
        None => 0.0,
        Some(s) => {
            s.value.parse::<f64>().map_err(|_| format!("default_vcpus {:?} in {} is not a number", s.value, s.from))?
        }
    };
    let vcpus = if vcpus < 0.0 || vcpus > f64::from(host_cpus()?) {
        f64::from(host_cpus()?)
    } else if vcpus == 0.0 {
        1.0
    } else {
        vcpus
    };
    let min = (vcpus.ceil() as u32).clamp(1, max.max(1));
    let max = max.max(min).min(MAX_VCPUS);
    for (key, s) in [("default_vcpus", &t.default_vcpus), ("default_maxvcpus", &t.default_maxvcpus)] {
        if let Some(s) = s {
            prov.push(t.provenance(key, s));
        }
    }
    prov.push(Provenance {
        what: match host {
            Some(h) => format!("vCPU counts {min} to {max} (the node has {h} CPUs)"),
            None => format!("vCPU counts {min} to {max}"),
        },
        file: None,
        key: None,
    });
    Ok((min..=max).collect())
}

/// Opens a boot file the configuration names.
fn open(t: &Target<'_>, what: &str, s: &Setting) -> Result<File, String> {
    t.open(&s.value).map(|(f, _)| f).map_err(|e| format!("the {what} {} (set in {}): {e:#}", s.value, s.from))
}

/// Everything [`reference_values`] computes, or the first reason it cannot.
fn measure(t: &Target<'_>) -> Result<(Vec<String>, Vec<Provenance>), String> {
    let cfg = &t.runtime_config;
    if !is_true(&t.confidential_guest) {
        return Err(format!("{cfg} does not set confidential_guest = true: its guests are not launched under SEV-SNP"));
    }
    let mut key: Vec<&str> = t.table.split('.').collect();
    key.push("sev_snp_guest");
    let snp = crate::kata_config::effective(&t.fragments, &key);
    if !is_true(&snp) {
        return Err(format!("{cfg} does not set sev_snp_guest = true: Kata launches an SEV (not SEV-SNP) guest"));
    }
    let runtime = Runtime::of_config(cfg);
    let mut prov = Vec::new();
    let fw = t.firmware.as_ref().filter(|s| !s.value.is_empty()).ok_or_else(|| {
        format!("{cfg} names no firmware (`firmware`): the launch digest measures the OVMF image QEMU boots")
    })?;
    let fw_file = open(t, "firmware", fw)?;
    let bytes = read_capped(&fw_file, MAX_FIRMWARE).map_err(|e| format!("the firmware {} {e}", fw.value))?;
    let firmware = Firmware::check(bytes).map_err(|e| format!("the firmware {} {e}", fw.value))?;
    prov.push(t.provenance("firmware", fw));
    let kernel = t.kernel.as_ref().filter(|s| !s.value.is_empty()).ok_or_else(|| format!("{cfg} names no kernel"))?;
    let kernel_file = open(t, "kernel", kernel)?;
    prov.push(t.provenance("kernel", kernel));
    let initrd = t.initrd.as_ref().filter(|s| !s.value.is_empty());
    let initrd_file = initrd.map(|s| open(t, "initrd", s)).transpose()?;
    if let Some(s) = initrd {
        prov.push(t.provenance("initrd", s));
    }
    let composed = cmdline::compose(&cmdline::Inputs {
        runtime,
        fragments: &t.fragments,
        fips: fips(),
        host_cpus: host_cpus().unwrap_or(1),
    })
    .map_err(|e| format!("the kernel command line: {e}"))?;
    let mut line = composed.cmdline.clone();
    if let Some(extra) = t.overrides.append.as_deref().filter(|a| !a.is_empty()) {
        line = format!("{line} {extra}");
        prov.push(Provenance {
            what: format!("appended to the command line: {extra}"),
            file: None,
            key: Some("--append".into()),
        });
    }
    prov.push(Provenance {
        what: format!("kernel command line ({} runtime, Kata {}): {line}", runtime.name(), cmdline::KATA_COMMIT),
        file: None,
        key: None,
    });
    for piece in &composed.pieces {
        prov.push(Provenance {
            what: format!("command line `{}` from {}", piece.text, piece.origin),
            file: None,
            key: None,
        });
    }
    let vcpu_name = match &t.overrides.vcpu_type {
        Some(v) => {
            prov.push(Provenance { what: format!("vCPU type {v}"), file: None, key: Some("--vcpu-type".into()) });
            v.clone()
        }
        None => {
            if let Some(s) = &t.cpu_features {
                let sig = s
                    .value
                    .split(',')
                    .map(str::trim)
                    .find(|f| ["family=", "model=", "stepping="].iter().any(|p| f.starts_with(p)));
                if let Some(f) = sig {
                    return Err(format!(
                        "cpu_features in {} sets `{f}`: the guest's CPUID signature then differs from {DEFAULT_VCPU_TYPE}'s; give --vcpu-type",
                        s.from
                    ));
                }
            }
            prov.push(Provenance {
                what: format!("vCPU type {DEFAULT_VCPU_TYPE} (what Kata passes for SNP: Go qemu_amd64.go:245, runtime-rs cmdline_generator.rs:3422)"),
                file: None,
                key: None,
            });
            DEFAULT_VCPU_TYPE.to_string()
        }
    };
    let vcpu = vcpu_type(&vcpu_name)?;
    let counts = counts(t, runtime, &mut prov)?;
    prov.push(Provenance { what: "guest features 0x1 (SNPActive), VMM QEMU".into(), file: None, key: None });
    let values = launch_digests(&firmware, &kernel_file, initrd_file.as_ref(), &line, vcpu, &counts)?;
    Ok((values, prov))
}

#[cfg(test)]
#[path = "snp_tests.rs"]
mod tests;
