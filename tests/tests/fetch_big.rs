//! A 250 MB image: only the top layer is downloaded for a kernel in the top layer, and peak
//! RSS stays under 64 MiB even when the whole image must be read.

use kata_addons_tests::image::{Compress, Image, LayerBuilder};
use kata_addons_tests::proxy::{Proxy, Rules};
use kata_addons_tests::registry::Registry;
use kata_addons_tests::{kata_addons_bin, show};

fn size_mb() -> u64 {
    std::env::var("KATA_ADDONS_BIG_MB").ok().and_then(|v| v.parse().ok()).unwrap_or(250)
}

/// Runs the binary under `/usr/bin/time -f %M`; returns (output, peak RSS KiB).
fn fetch_timed(host: &str, image: &str, path: &str) -> (std::process::Output, u64) {
    let dest = tempfile::tempdir().unwrap();
    let out = std::process::Command::new("/usr/bin/time")
        .args(["-f", "PEAK_RSS_KB=%M"])
        .arg(kata_addons_bin())
        .args(["fetch", "--image", &format!("{host}/{image}"), "--path", path, "--dest"])
        .arg(dest.path())
        .args(["--insecure-registry", host])
        .env("HOME", dest.path())
        .output()
        .expect("run /usr/bin/time (apt install time)");
    let err = String::from_utf8_lossy(&out.stderr);
    let rss = err
        .lines()
        .filter_map(|l| l.strip_prefix("PEAK_RSS_KB="))
        .next_back()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(u64::MAX);
    (out, rss)
}

#[test]
fn big_image_top_layer_only_and_bounded_memory() {
    let mb = size_mb();
    let reg = Registry::start();
    // Two big layers below; the kernel in a small top layer. Uncompressed tar keeps the
    // test's own build fast; the blobs are still `mb` MB on the wire.
    let half = (mb << 20) / 2;
    let l1 = LayerBuilder::new().dir("usr").big_file("usr/blob1", half, 1).build(Compress::None);
    let l2 = LayerBuilder::new()
        .dir("opt")
        .big_file("opt/blob2", half, 2)
        .dir("lowboot")
        .big_file("lowboot/image", 8 << 20, 4)
        .build(Compress::None);
    let top = LayerBuilder::new().dir("boot").big_file("boot/vmlinuz", 12 << 20, 3).build(Compress::Gzip);
    let img = Image::new(vec![l1.clone(), l2.clone(), top.clone()]);
    reg.push("big", "1", &img);
    drop(img);
    let proxy = Proxy::start(reg.addr, Rules::default());
    let h = proxy.host();
    let (out, rss) = fetch_timed(&h, "big:1", "/boot/vmlinuz");
    assert!(out.status.success(), "{}", show(&out));
    let blob_requests = proxy.requests_matching("/blobs/");
    eprintln!("top-layer fetch: peak RSS {rss} KiB; blob requests: {blob_requests:#?}");
    assert_eq!(blob_requests.len(), 1, "{blob_requests:?}");
    assert!(blob_requests[0].contains(&top.digest));
    assert!(rss < 64 * 1024, "peak RSS {rss} KiB");
    // A file in the bottom-most big layer: every layer streamed, memory still bounded.
    let (out, rss) = fetch_timed(&h, "big:1", "/usr/blob1");
    assert!(out.status.success(), "{}", show(&out));
    eprintln!("whole-image fetch: peak RSS {rss} KiB; stdout {}", String::from_utf8_lossy(&out.stdout));
    assert!(rss < 64 * 1024, "peak RSS {rss} KiB");
}
