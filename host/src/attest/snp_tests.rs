use super::*;

/// The textual GUID's little-endian bytes (RFC 4122 text, OVMF's byte order).
fn le(text: &str) -> [u8; 16] {
    let hex: String = text.chars().filter(|c| *c != '-').collect();
    let b: Vec<u8> = (0..16).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex")).collect();
    let mut out = [0u8; 16];
    out[..4].copy_from_slice(&[b[3], b[2], b[1], b[0]]);
    out[4..6].copy_from_slice(&[b[5], b[4]]);
    out[6..8].copy_from_slice(&[b[7], b[6]]);
    out[8..].copy_from_slice(&b[8..]);
    out
}

#[test]
fn the_guids_are_ovmfs() {
    assert_eq!(FOOTER_GUID, le("96b582de-1fb2-45f7-baea-a366c55a082d"));
    assert_eq!(HASH_TABLE_GUID, le("7255371f-3a3b-4b04-927b-1da6efa8d454"));
    assert_eq!(RESET_GUID, le("00f771de-1a7e-4fcb-890e-68c77e2fb44e"));
    assert_eq!(META_GUID, le("dc886566-984a-4798-a75e-5585a7bf67cc"));
}

#[test]
fn command_lines_qemu_cannot_measure_as_given_are_refused() {
    assert!(check_cmdline("console=hvc0 a=\"b c\"").is_ok());
    assert!(check_cmdline("").is_ok());
    for bad in [" x", "x ", "x\n", "a\0b"] {
        assert!(check_cmdline(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn small_or_unaligned_images_are_refused_before_any_parsing() {
    for size in [0usize, 49, 4095, 4097] {
        let r = Firmware::check(vec![0u8; size]);
        assert!(r.is_err_and(|e| e.contains("4 KiB pages")), "{size}");
    }
    let r = Firmware::check(vec![0u8; 4096]);
    assert!(r.is_err_and(|e| e.contains("no OVMF footer table")));
}

#[test]
fn vcpu_types_are_the_crates() {
    assert!(vcpu_type("EPYC-v4").is_ok());
    assert!(vcpu_type("epyc-milan").is_ok());
    assert!(vcpu_type("host").is_err_and(|e| e.contains("unknown vCPU type \"host\"")));
}
