//! The SEV-SNP launch digests of one guest for a range of vCPU counts, as `reference-values`
//! computes them (`kata_addons::attest::snp`), for `bench/snp-measure`:
//!
//!   snp_digests FIRMWARE KERNEL INITRD|- CMDLINE FIRST LAST [VCPU_TYPE]
//!
//! Prints one digest per line, then `bytes read: N` (the process's `rchar`) on stderr.

use std::fs::File;
use std::process::ExitCode;

use kata_addons::attest::snp::{Firmware, MAX_FIRMWARE, launch_digests, read_capped, vcpu_type};

fn main() -> ExitCode {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 7 {
        eprintln!("usage: snp_digests FIRMWARE KERNEL INITRD|- CMDLINE FIRST LAST [VCPU_TYPE]");
        return ExitCode::from(64);
    }
    match run(&a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("snp_digests: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(a: &[String]) -> Result<(), String> {
    let open = |p: &str| File::open(p).map_err(|e| format!("{p}: {e}"));
    let fw = Firmware::check(read_capped(&open(&a[1])?, MAX_FIRMWARE)?)?;
    let kernel = open(&a[2])?;
    let initrd = if a[3] == "-" { None } else { Some(open(&a[3])?) };
    let first: u32 = a[5].parse().map_err(|_| "FIRST is not a count".to_string())?;
    let last: u32 = a[6].parse().map_err(|_| "LAST is not a count".to_string())?;
    let t = vcpu_type(a.get(7).map_or("EPYC-v4", String::as_str))?;
    let counts: Vec<u32> = (first..=last).collect();
    for d in launch_digests(&fw, &kernel, initrd.as_ref(), &a[4], t, &counts)? {
        println!("{d}");
    }
    let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    if let Some(r) = io.lines().find_map(|l| l.strip_prefix("rchar: ")) {
        eprintln!("bytes read: {r}");
    }
    Ok(())
}
