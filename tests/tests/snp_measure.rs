//! The SEV-SNP launch digest (`snp_launch_measurement`) against `sev-snp-measure`, case for
//! case: the same firmware (test images shaped like Kata's AMDSEV OVMF, `tests/src/ovmf.rs`),
//! kernel, initrd, command line, vCPU count and type. Damaged firmware is refused with a
//! reason, never a panic; Debian's OVMF (SEV metadata, no kernel-hashes section) is refused.

use std::fs::File;
use std::path::{Path, PathBuf};

use kata_addons::attest::snp::{Firmware, launch_digests, vcpu_type};
use kata_addons_tests::ovmf::{self, CPUID, KERNEL_HASHES, Ovmf, SEC_MEM, SECRETS, SVSM_CAA};

/// Kata's dm-verity root parameters as both runtimes write them (`cmdline.rs` pins them).
const VERITY: &str = "dm-mod.create=\"dm-verity,,,ro,0 592 verity 1 /dev/vda1 /dev/vda2 4096 4096 74 0 sha256 \
                      278d7cfa2bf79e43ca873d5f203bf2622358a5c0cbbadc3b0d3757675fa1a6ef 5eed\" root=/dev/dm-0 \
                      rootflags=ro rootfstype=erofs";

fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..len).map(|_| rng.u8(..)).collect()
}

fn write(dir: &Path, name: &str, data: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, data).expect("write test file");
    p
}

fn open(p: &Path) -> File {
    File::open(p).expect("open test file")
}

fn require_oracle() {
    assert!(
        ovmf::oracle().exists(),
        "sev-snp-measure is not installed at {} (tests/run installs it into its venv)",
        ovmf::oracle().display()
    );
}

/// One guest: inputs and the vCPU counts compared with the oracle (all of `counts` are
/// computed in one call; `compare` are checked one by one).
struct Guest {
    label: &'static str,
    firmware: Vec<u8>,
    kernel: Vec<u8>,
    initrd: Option<Vec<u8>>,
    cmdline: String,
    vcpu_type: &'static str,
    counts: Vec<u32>,
    compare: Vec<u32>,
}

fn guests() -> Vec<Guest> {
    let kernel = random(3 << 20, 1);
    let odd_kernel = random((5 << 20) + 123, 2);
    let initrd = random(8 << 20, 3);
    let base = Ovmf::amdsev(7).build();
    let console = "reboot=k panic=1 systemd.unit=kata-containers.target console=hvc0".to_string();
    let rs = format!(
        "reboot=k panic=1 systemd.unit=kata-containers.target systemd.mask=systemd-networkd.service \
         systemd.mask=systemd-networkd.socket {VERITY} agent.cdh_api_timeout=50 selinux=0 console=hvc0"
    );
    let mut hash_near_end = Ovmf::amdsev(9);
    hash_near_end.hash_table = Some((0x80_e000 + 4096 - 176, 176));
    let mut big = Ovmf::amdsev(11);
    big.size = 4 << 20;
    big.meta_from_end = 0x3000;
    big.sections.push((0x90_0000, 0x4_0000, SEC_MEM));
    let mut extra = Ovmf::amdsev(13);
    extra.extra = vec![
        ("4c2eb361-7d9b-4cc3-8081-127c90d3d294".into(), vec![0x11; 24]),
        (ovmf::RESET.into(), 0xffff_e000u32.to_le_bytes().to_vec()),
    ];
    let mut minimal = Ovmf::amdsev(17);
    minimal.sections = vec![(0x80_0000, 0x1000, SECRETS), (0x80_1000, 0x1000, KERNEL_HASHES)];
    minimal.hash_table = Some((0x80_1000 + 0x100, 0x400));
    minimal.size = 64 << 10;
    let _ = CPUID;
    let _ = SVSM_CAA;
    let all: Vec<u32> = (1..=64).collect();
    vec![
        Guest {
            label: "runtime-rs cmdline, dm-verity, no initrd",
            firmware: base.clone(),
            kernel: kernel.clone(),
            initrd: None,
            cmdline: rs.clone(),
            vcpu_type: "EPYC-v4",
            counts: all.clone(),
            compare: vec![1, 2, 3, 4, 7, 8, 16, 31, 32, 33, 63, 64],
        },
        Guest {
            label: "initrd 8 MiB, quotes and spaces",
            firmware: base.clone(),
            kernel: kernel.clone(),
            initrd: Some(initrd.clone()),
            cmdline: format!("{console} agent.https_proxy=\"http://proxy:3128\" a=\"b  c\" \u{e9}t\u{e9}"),
            vcpu_type: "EPYC-v4",
            counts: all.clone(),
            compare: vec![1, 5, 64],
        },
        Guest {
            label: "empty initrd file",
            firmware: base.clone(),
            kernel: odd_kernel.clone(),
            initrd: Some(Vec::new()),
            cmdline: console.clone(),
            vcpu_type: "EPYC-v4",
            counts: vec![2, 3],
            compare: vec![2, 3],
        },
        Guest {
            label: "empty command line",
            firmware: base.clone(),
            kernel: odd_kernel.clone(),
            initrd: None,
            cmdline: String::new(),
            vcpu_type: "EPYC-v4",
            counts: vec![1],
            compare: vec![1],
        },
        Guest {
            label: "EPYC-Milan",
            firmware: base.clone(),
            kernel: kernel.clone(),
            initrd: Some(initrd.clone()),
            cmdline: rs.clone(),
            vcpu_type: "EPYC-Milan",
            counts: vec![4, 12],
            compare: vec![4, 12],
        },
        Guest {
            label: "EPYC-Genoa",
            firmware: base.clone(),
            kernel: kernel.clone(),
            initrd: None,
            cmdline: rs.clone(),
            vcpu_type: "EPYC-Genoa",
            counts: vec![4],
            compare: vec![4],
        },
        Guest {
            label: "EPYC-Rome-v2",
            firmware: base.clone(),
            kernel: kernel.clone(),
            initrd: None,
            cmdline: rs.clone(),
            vcpu_type: "EPYC-Rome-v2",
            counts: vec![3],
            compare: vec![3],
        },
        Guest {
            label: "EPYC",
            firmware: base,
            kernel: kernel.clone(),
            initrd: None,
            cmdline: console.clone(),
            vcpu_type: "EPYC",
            counts: vec![2],
            compare: vec![2],
        },
        Guest {
            label: "hash table at the end of its page",
            firmware: hash_near_end.build(),
            kernel: kernel.clone(),
            initrd: Some(initrd.clone()),
            cmdline: rs.clone(),
            vcpu_type: "EPYC-v4",
            counts: vec![1, 8],
            compare: vec![1, 8],
        },
        Guest {
            label: "4 MiB image, metadata 12 KiB from the end",
            firmware: big.build(),
            kernel: kernel.clone(),
            initrd: None,
            cmdline: rs.clone(),
            vcpu_type: "EPYC-v4",
            counts: vec![2, 6],
            compare: vec![2, 6],
        },
        Guest {
            label: "unknown and duplicate footer entries",
            firmware: extra.build(),
            kernel: kernel.clone(),
            initrd: None,
            cmdline: console.clone(),
            vcpu_type: "EPYC-v4",
            counts: vec![1, 2, 9],
            compare: vec![1, 2, 9],
        },
        Guest {
            label: "64 KiB image, two sections",
            firmware: minimal.build(),
            kernel,
            initrd: Some(initrd),
            cmdline: console,
            vcpu_type: "EPYC-v4",
            counts: vec![1, 2],
            compare: vec![1, 2],
        },
    ]
}

#[test]
fn launch_digests_match_sev_snp_measure_case_for_case() {
    require_oracle();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut rows = Vec::new();
    for (i, g) in guests().into_iter().enumerate() {
        let fw_path = write(dir.path(), &format!("fw{i}.fd"), &g.firmware);
        let k_path = write(dir.path(), &format!("vmlinuz{i}"), &g.kernel);
        let i_path = g.initrd.as_ref().map(|d| write(dir.path(), &format!("initrd{i}"), d));
        let fw = Firmware::check(g.firmware.clone()).unwrap_or_else(|e| panic!("{}: the firmware {e}", g.label));
        let kernel = open(&k_path);
        let initrd = i_path.as_deref().map(open);
        let ours =
            launch_digests(&fw, &kernel, initrd.as_ref(), &g.cmdline, vcpu_type(g.vcpu_type).expect("type"), &g.counts)
                .unwrap_or_else(|e| panic!("{}: {e}", g.label));
        assert_eq!(ours.len(), g.counts.len());
        let mut distinct = ours.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), ours.len(), "{}: every vCPU count has its own digest", g.label);
        for n in &g.compare {
            let at = g.counts.iter().position(|c| c == n).expect("compared count is computed");
            let want = ovmf::measure(&fw_path, &k_path, i_path.as_deref(), &g.cmdline, *n, g.vcpu_type)
                .unwrap_or_else(|e| panic!("{}: sev-snp-measure failed: {e}", g.label));
            assert_eq!(ours[at], want, "{} with {n} vCPUs", g.label);
            rows.push(format!(
                "| {} | {} KiB | {} | {} | {n} | {} | {}… |",
                g.label,
                g.firmware.len() >> 10,
                g.kernel.len(),
                g.initrd.as_ref().map_or("none".to_string(), |d| d.len().to_string()),
                g.vcpu_type,
                &want[..16]
            ));
        }
    }
    println!(
        "| guest | firmware | kernel bytes | initrd bytes | vCPUs | type | digest |\n|---|---|---|---|---|---|---|"
    );
    for r in &rows {
        println!("{r}");
    }
    assert!(rows.len() >= 30, "{} cases", rows.len());
}

/// A damage to a valid image, and whether `sev-snp-measure` fails on it too.
type Damage = (&'static str, fn(&mut Vec<u8>), bool);

fn set16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

fn set32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// Offset of the SEV metadata header in `Ovmf::amdsev` (0x1000 before the end).
fn meta(b: &[u8]) -> usize {
    b.len() - 0x1000
}

/// Offset of the n-th footer entry's header (from the end: 0 = hash table, 1 = metadata,
/// 2 = reset block) in `Ovmf::amdsev`: each of these entries is 18 + 8 or 18 + 4 bytes.
fn entry(b: &[u8], n: usize) -> usize {
    let footer = ovmf::footer_at(b.len());
    let sizes = [26, 22, 22];
    footer - sizes[..=n].iter().sum::<usize>() + sizes[n] - 18
}

fn damages() -> Vec<Damage> {
    vec![
        (
            "no footer GUID",
            |b| {
                let at = ovmf::footer_at(b.len()) + 5;
                b[at] ^= 0xff
            },
            true,
        ),
        (
            "footer table size below its header",
            |b| {
                let at = ovmf::footer_at(b.len());
                set16(b, at, 4)
            },
            true,
        ),
        (
            "64 KiB image whose footer table claims 0xffff bytes",
            |b| {
                *b = b[b.len() - 0x1_0000..].to_vec();
                let at = ovmf::footer_at(b.len());
                set16(b, at, 0xffff)
            },
            true,
        ),
        (
            "an entry of size 0",
            |b| {
                let at = entry(b, 0);
                set16(b, at, 0)
            },
            true,
        ),
        (
            "an entry running past the table",
            |b| {
                let at = entry(b, 2);
                set16(b, at, 0x400)
            },
            false,
        ),
        (
            "metadata header beyond the start",
            |b| {
                let at = entry(b, 1) - 4;
                set32(b, at, 0x7fff_ffff)
            },
            true,
        ),
        (
            "metadata offset negative",
            |b| {
                let at = entry(b, 1) - 4;
                set32(b, at, 0xffff_fff0)
            },
            true,
        ),
        (
            "metadata offset inside the last 16 bytes",
            |b| {
                let at = entry(b, 1) - 4;
                set32(b, at, 8)
            },
            true,
        ),
        (
            "metadata signature",
            |b| {
                let at = meta(b);
                b[at] = b'X'
            },
            true,
        ),
        (
            "metadata version 2",
            |b| {
                let at = meta(b) + 8;
                set32(b, at, 2)
            },
            true,
        ),
        (
            "metadata header smaller than its sections",
            |b| {
                let at = meta(b) + 4;
                set32(b, at, 20)
            },
            true,
        ),
        (
            "metadata claiming 2^32-1 sections",
            |b| {
                let at = meta(b) + 12;
                set32(b, at, u32::MAX)
            },
            true,
        ),
        (
            "metadata larger than the image",
            |b| {
                let at = meta(b) + 4;
                set32(b, at, 0x10_0000)
            },
            false,
        ),
        (
            "unknown section type 7",
            |b| {
                let at = meta(b) + 16 + 8;
                set32(b, at, 7)
            },
            true,
        ),
        (
            "section type 0x110",
            |b| {
                let at = meta(b) + 16 + 8;
                set32(b, at, 0x110)
            },
            true,
        ),
        (
            "kernel-hashes section of two pages",
            |b| {
                let at = meta(b) + 16 + 5 * 12 + 4;
                set32(b, at, 0x2000)
            },
            true,
        ),
        (
            "zero section not whole pages",
            |b| {
                let at = meta(b) + 16 + 4;
                set32(b, at, 0x9001)
            },
            true,
        ),
        (
            "section above 4 GiB",
            |b| {
                let at = meta(b) + 16;
                set32(b, at, 0xffff_f000)
            },
            false,
        ),
        (
            "no kernel-hashes section",
            |b| {
                let at = meta(b) + 16 + 5 * 12 + 8;
                set32(b, at, SEC_MEM)
            },
            true,
        ),
        (
            "hash table entry missing",
            |b| {
                let at = entry(b, 0) + 2;
                b[at] ^= 1
            },
            true,
        ),
        (
            "hash table at 0",
            |b| {
                let at = entry(b, 0) - 8;
                set32(b, at, 0)
            },
            false,
        ),
        (
            "hash table smaller than QEMU's",
            |b| {
                let at = entry(b, 0) - 4;
                set32(b, at, 100)
            },
            false,
        ),
        (
            "hash table across its page",
            |b| {
                let at = entry(b, 0) - 8;
                set32(b, at, 0x80_ef80)
            },
            true,
        ),
        (
            "reset block missing",
            |b| {
                let at = entry(b, 2) + 2;
                b[at] ^= 1
            },
            true,
        ),
        (
            "reset block address 0",
            |b| {
                let at = entry(b, 2) - 4;
                set32(b, at, 0)
            },
            false,
        ),
        ("image not whole pages", |b| b.truncate(b.len() - 100), true),
        ("image of 49 bytes", |b| b.truncate(49), true),
        ("image cut 8 KiB before its end", |b| b.truncate(b.len() - 8192), true),
    ]
}

#[test]
fn damaged_firmware_is_refused_with_a_reason_never_a_panic() {
    require_oracle();
    let dir = tempfile::tempdir().expect("tempdir");
    let kernel = write(dir.path(), "vmlinuz", &random(1 << 20, 5));
    let valid = Ovmf::amdsev(3).build();
    assert!(Firmware::check(valid.clone()).is_ok());
    println!("| damage | refusal | sev-snp-measure |\n|---|---|---|");
    for (what, damage, oracle_fails) in damages() {
        let mut b = valid.clone();
        damage(&mut b);
        let fw = write(dir.path(), "damaged.fd", &b);
        let refused = match Firmware::check(b) {
            Ok(_) => panic!("{what}: accepted"),
            Err(e) => e,
        };
        let oracle = ovmf::measure(&fw, &kernel, None, "console=hvc0", 2, "EPYC-v4");
        println!(
            "| {what} | {refused} | {} |",
            oracle.as_ref().map_or_else(|e| e.lines().last().unwrap_or("").to_string(), |d| d.clone())
        );
        if oracle_fails {
            assert!(oracle.is_err(), "{what}: sev-snp-measure measured it: {oracle:?}");
        }
    }
}

#[test]
fn random_damage_near_the_footer_never_panics() {
    let mut small = Ovmf::amdsev(21);
    small.size = 64 << 10;
    let valid = small.build();
    let dir = tempfile::tempdir().expect("tempdir");
    let kernel = open(&write(dir.path(), "vmlinuz", &random(64 << 10, 6)));
    let mut rng = fastrand::Rng::with_seed(0x5e5);
    let (mut accepted, mut refused) = (0, 0);
    for _ in 0..3000 {
        let mut b = valid.clone();
        for _ in 0..rng.usize(1..6) {
            let at = b.len() - 1 - rng.usize(..0x1100);
            b[at] = rng.u8(..);
        }
        match Firmware::check(b) {
            Ok(fw) => {
                accepted += 1;
                if accepted % 50 == 1 {
                    let v = launch_digests(&fw, &kernel, None, "x", vcpu_type("EPYC-v4").expect("type"), &[1, 2]);
                    assert!(v.is_ok(), "{v:?}");
                }
            }
            Err(e) => {
                refused += 1;
                assert!(!e.is_empty());
            }
        }
    }
    assert!(accepted > 0 && refused > 0, "accepted {accepted}, refused {refused}");
}

#[test]
fn debians_ovmf_is_refused_for_its_missing_kernel_hashes() {
    let path = Path::new("/usr/share/ovmf/OVMF.fd");
    assert!(path.exists(), "{} is missing (tests/run installs Debian's ovmf)", path.display());
    let bytes = std::fs::read(path).expect("read OVMF.fd");
    let e = Firmware::check(bytes).err().expect("refused");
    assert!(e.contains("without a kernel-hashes section"), "{e}");
    require_oracle();
    let dir = tempfile::tempdir().expect("tempdir");
    let kernel = write(dir.path(), "vmlinuz", &random(1 << 20, 8));
    let oracle = ovmf::measure(path, &kernel, None, "console=hvc0", 1, "EPYC-v4");
    assert!(oracle.is_err_and(|e| e.contains("SNP_KERNEL_HASHES")));
}

#[test]
fn command_lines_and_counts_outside_what_qemu_measures_are_refused() {
    let fw = Firmware::check(Ovmf::amdsev(1).build()).expect("valid");
    let dir = tempfile::tempdir().expect("tempdir");
    let kernel = open(&write(dir.path(), "vmlinuz", b"kernel"));
    let t = vcpu_type("EPYC-v4").expect("type");
    for (cmdline, counts, want) in [
        ("x ", vec![1], "white space"),
        ("a\0b", vec![1], "NUL"),
        ("x", vec![0], "0 vCPUs"),
        ("x", vec![1025], "1025 vCPUs"),
    ] {
        let r = launch_digests(&fw, &kernel, None, cmdline, t, &counts);
        assert!(r.as_ref().is_err_and(|e| e.contains(want)), "{cmdline:?} {counts:?}: {r:?}");
    }
    assert!(vcpu_type("EPYC-v9").is_err());
}

#[test]
fn every_count_continued_from_the_one_before_is_the_crates_own_digest_for_that_count() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Small inputs: this compares the VMSA pages, hashed once per count by the crate.
    let mut small = Ovmf::amdsev(3);
    small.size = 64 << 10;
    let fw = Firmware::check(small.build()).expect("valid");
    let kernel = open(&write(dir.path(), "vmlinuz", &random(16 << 10, 9)));
    let initrd = open(&write(dir.path(), "initrd", &random(16 << 10, 10)));
    for t in ["EPYC-v4", "EPYC-Milan"] {
        let t = vcpu_type(t).expect("type");
        let all: Vec<u32> = (1..=40).chain([64, 255]).collect();
        let chained = launch_digests(&fw, &kernel, Some(&initrd), VERITY, t, &all).expect("digests");
        for (n, d) in all.iter().zip(&chained) {
            // One count alone: the crate measures its n VMSA pages itself.
            let alone = launch_digests(&fw, &kernel, Some(&initrd), VERITY, t, &[*n]).expect("digest");
            assert_eq!(&alone[0], d, "{n} vCPUs");
        }
        // Any order, repeats: each in its place.
        let mixed = launch_digests(&fw, &kernel, Some(&initrd), VERITY, t, &[64, 2, 9, 2, 1]).expect("digests");
        let at = |n: u32| chained[all.iter().position(|c| *c == n).expect("computed")].clone();
        assert_eq!(mixed, vec![at(64), at(2), at(9), at(2), at(1)]);
    }
}
