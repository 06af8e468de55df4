//! The cluster proxy (`HTTPS_PROXY`/`HTTP_PROXY`/`NO_PROXY`, which the DaemonSet takes from
//! the optional ConfigMap `kata-addons-proxy`): the runner sends registry traffic through
//! it, decides as containers/image does (loopback never proxied), logs the route it takes,
//! never logs proxy credentials, and refuses a value it cannot use, naming the variable.

use std::process::{Command, Output};

use kata_addons_tests::image::{Compress, Image, LayerBuilder};
use kata_addons_tests::proxy::{Proxy, Rules};
use kata_addons_tests::registry::{Registry, free_port};
use kata_addons_tests::{kata_addons_bin, show};

const PROXY_VARS: &[&str] =
    &["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"];

/// `kata-addons fetch` of `/boot/vmlinuz` from `image` with exactly the proxy variables `vars`.
fn fetch(image: &str, insecure: &str, vars: &[(&str, &str)]) -> (Output, tempfile::TempDir) {
    let home = tempfile::tempdir().expect("home");
    let root = tempfile::tempdir().expect("empty node root");
    let dest = tempfile::tempdir().expect("dest");
    let mut c = Command::new(kata_addons_bin());
    c.env("HOME", home.path()).env_remove("REGISTRY_AUTH_FILE").env_remove("XDG_RUNTIME_DIR");
    for v in PROXY_VARS {
        c.env_remove(v);
    }
    c.envs(vars.iter().copied());
    let out = c
        .args(["fetch", "--image", image, "--path", "/boot/vmlinuz", "--retries", "0", "--timeout", "10"])
        .args(["--insecure-registry", insecure, "--root"])
        .arg(root.path())
        .arg("--dest")
        .arg(dest.path())
        .output()
        .expect("run kata-addons");
    (out, dest)
}

fn kernel_image(kernel: &[u8]) -> Image {
    Image::new(vec![LayerBuilder::new().dir("boot").file("boot/vmlinuz", kernel).build(Compress::Gzip)])
}

#[test]
fn registry_traffic_goes_through_the_proxy_and_the_log_says_so() {
    let reg = Registry::start();
    reg.push("kata/k", "1", &kernel_image(b"VIA-PROXY"));
    let proxy = Proxy::start(reg.addr, Rules::default());
    // A name only the proxy can reach (it forwards everything to the registry): a direct
    // connection could not even resolve it.
    let name = format!("registry.proxied.test:{}", reg.addr.port());
    let url = format!("http://user:s3cret@{}", proxy.host());
    let (out, dest) = fetch(&format!("{name}/kata/k:1"), &name, &[("HTTPS_PROXY", &url), ("HTTP_PROXY", &url)]);
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(std::fs::read(dest.path().join("vmlinuz")).expect("fetched"), b"VIA-PROXY");
    let lines = proxy.requests();
    // HTTPS first (a CONNECT tunnel the test proxy cannot open), then plain HTTP in
    // absolute form, as an insecure registry is tried by containers/image.
    assert!(lines.iter().any(|l| l.starts_with(&format!("CONNECT {name} "))), "{lines:#?}");
    let gets: Vec<&String> = lines.iter().filter(|l| l.starts_with("GET ")).collect();
    assert!(gets.iter().any(|l| l.starts_with(&format!("GET http://{name}/v2/kata/k/blobs/"))), "{lines:#?}");
    assert!(gets.iter().all(|l| l.starts_with(&format!("GET http://{name}/"))), "{lines:#?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("registry proxy from the environment"), "{err}");
    assert!(err.contains(&format!("HTTPS_PROXY=http://***@{}", proxy.host())), "{err}");
    assert!(err.contains(&format!("plain HTTP via proxy http://***@{}", proxy.host())), "{err}");
    assert!(!err.contains("s3cret"), "proxy credentials in the log: {err}");
}

#[test]
fn loopback_registries_are_never_proxied() {
    let reg = Registry::start();
    reg.push("kata/k", "1", &kernel_image(b"DIRECT"));
    // Nothing listens on the proxy port: a proxied request would fail.
    let dead = format!("http://127.0.0.1:{}", free_port());
    let host = reg.host();
    let (out, dest) = fetch(&format!("{host}/kata/k:1"), &host, &[("HTTPS_PROXY", &dead), ("http_proxy", &dead)]);
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(std::fs::read(dest.path().join("vmlinuz")).expect("fetched"), b"DIRECT");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("direct (NO_PROXY or loopback)"), "{err}");
}

#[test]
fn an_unusable_proxy_value_is_refused_naming_the_variable() {
    let (out, dest) = fetch("quay.io/kata/k:1", "quay.io", &[("HTTPS_PROXY", "socks5://proxy:1080")]);
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("HTTPS_PROXY: proxy scheme \"socks5\" is not supported"), "{err}");
    assert!(std::fs::read_dir(dest.path()).expect("dest").next().is_none(), "nothing written");
}
