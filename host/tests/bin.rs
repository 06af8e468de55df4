//! The `kata-addons` binary starts (this test also makes `cargo test` build the binary,
//! which the end-to-end tests in `tests/` run).

#[test]
fn binary_prints_its_version() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kata-addons")).arg("--version").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("kata-addons "));
}
