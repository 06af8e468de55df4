//! Layers written by other tools, read by `kata-addons fetch`: `umoci insert` writes each
//! inserted file as a layer whose tar stream stops right after the file's data (no padding,
//! no end-of-archive blocks). Go's archive/tar — what CRI-O (containers/storage) and umoci
//! read layers with — accepts that; so must we.

use std::path::Path;
use std::process::Command;

use kata_addons_tests::{run_kata, show};

fn umoci(dir: &Path, args: &[&str]) {
    let o = Command::new("umoci").args(args).current_dir(dir).output().expect("run umoci (apt install umoci)");
    assert!(o.status.success(), "umoci {args:?}: {}", show(&o));
}

#[test]
fn files_inserted_by_umoci_are_fetched_byte_for_byte() {
    let tmp = tempfile::tempdir().expect("tmp");
    let t = tmp.path();
    // Sizes that end a layer at every kind of boundary: mid-block (padding missing), exactly
    // on a block, and a multi-MiB file.
    let files: [(&str, Vec<u8>); 3] = [
        ("/boot/vmlinuz", kata_addons_tests::node::noise(3_000_001, 1)),
        ("/boot/initrd.img", kata_addons_tests::node::noise(1024, 2)),
        ("/boot/small", b"a short file: its layer ends mid-block".to_vec()),
    ];
    umoci(t, &["init", "--layout", "lay"]);
    umoci(t, &["new", "--image", "lay:v1"]);
    for (i, (path, data)) in files.iter().enumerate() {
        let src = t.join(format!("src{i}"));
        std::fs::write(&src, data).expect("write source");
        umoci(t, &["insert", "--rootless", "--image", "lay:v1", src.to_str().expect("utf8"), path]);
    }
    let dest = t.join("dest");
    let image = format!("oci:{}:v1", t.join("lay").display());
    let mut args = vec!["fetch", "--image", image.as_str(), "--dest", dest.to_str().expect("utf8")];
    for (path, _) in &files {
        args.extend(["--path", path]);
    }
    let o = run_kata(&args);
    assert!(o.status.success(), "{}", show(&o));
    for (path, data) in &files {
        let name = path.rsplit('/').next().expect("name");
        assert!(std::fs::read(dest.join(name)).expect("fetched file") == *data, "{path} differs");
    }
}
