//! Unit tests of the pure parts; resolution on node roots with containerd as the oracle
//! is in `tests/tests/runtime_class.rs`.

use super::files::clean_abs;
use super::tee::of_layout;
use crate::policy::Provider;

#[test]
fn paths_are_cleaned_as_go_cleans_them() {
    assert_eq!(clean_abs("/etc/containerd/./conf.d//x.toml"), "/etc/containerd/conf.d/x.toml");
    assert_eq!(clean_abs("/etc/containerd/extra/../snp.toml"), "/etc/containerd/snp.toml");
    assert_eq!(clean_abs("/../../x"), "/x");
    assert_eq!(clean_abs("/"), "/");
}

#[test]
fn the_layout_names_the_tee() {
    let d = "/opt/kata/share/defaults/kata-containers";
    for (p, t) in [
        ("/etc/kata-containers/kata-snp/configuration.toml", Some(Provider::Snp)),
        ("/etc/kata-containers/kata-se/configuration.toml", Some(Provider::Se)),
        (&format!("{d}/runtimes/qemu-tdx/configuration-qemu-tdx.toml") as &str, Some(Provider::Tdx)),
        (
            &format!(
                "{d}/runtime-rs/runtimes/qemu-nvidia-gpu-snp-runtime-rs/configuration-qemu-nvidia-gpu-snp-runtime-rs.toml"
            ),
            Some(Provider::Snp),
        ),
        (&format!("{d}/custom-runtimes/my-gpu/configuration-qemu-nvidia-gpu-tdx.toml"), Some(Provider::Tdx)),
        (&format!("{d}/runtimes/qemu/configuration-qemu.toml"), None),
        (&format!("{d}/runtimes/qemu-coco-dev/configuration-qemu-coco-dev.toml"), None),
        ("/etc/kata-containers/configuration.toml", None),
    ] {
        assert_eq!(of_layout(p), t, "{p}");
    }
}
