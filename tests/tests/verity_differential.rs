//! The runner's measured-image check against `veritysetup verify --no-superblock` (Debian's
//! cryptsetup-bin) on a corpus of good and damaged disks built with the real tools
//! (mkfs.erofs, mkfs.ext4, mkfs.xfs, veritysetup format, sfdisk): case for case the same
//! accept/refuse decision, both when the runner reads the file afterwards and when it
//! computed the tree while the file streamed in (docs/design.md#measured-guests).

use std::io::Read;
use std::path::{Path, PathBuf};

use kata_addons::verity::{self, Params, Role, Stream};
use kata_addons_tests::disk::{self, Fs, Label, Verity};

fn params(v: &Verity) -> Params {
    Params::from_hex(&v.root_hash, &v.salt, v.data_blocks, v.data_block_size, v.hash_block_size).expect("params")
}

/// The sha256 of a disk's bytes outside `data_blocks` blocks from partition 1's start (by
/// sfdisk), from the whole file.
fn outside_sha256(path: &Path, v: &Verity) -> String {
    let bytes = std::fs::read(path).expect("read disk");
    let start =
        disk::sfdisk_partitions(path).expect("partition table").iter().find(|p| p.0 == 1).expect("p1").1 as usize;
    let end = (start + (v.data_blocks * u64::from(v.data_block_size)) as usize).min(bytes.len());
    kata_addons_tests::sha256_hex(&[&bytes[..start], &bytes[end..]].concat())
}

/// The runner's decision on a disk, read afterwards and streamed; `Err` carries its message.
fn ours(path: &Path, v: &Verity) -> (Result<verity::Verified, String>, Result<verity::Verified, String>, bool) {
    let p = params(v);
    let f = std::fs::File::open(path).expect("open");
    let after = verity::check(&f, "image.img", Role::Image, Some(&p), None).map_err(|e| format!("{e:#}"));
    let mut s = Stream::new(p.clone());
    let mut r = std::fs::File::open(path).expect("open");
    let mut buf = vec![0u8; 100_000];
    loop {
        let n = r.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        s.update(&buf[..n]);
    }
    let streamed = s.finish();
    let used = streamed.is_some();
    let during = verity::check(&f, "image.img", Role::Image, Some(&p), streamed).map_err(|e| format!("{e:#}"));
    (after, during, used)
}

struct Case {
    name: &'static str,
    disk: PathBuf,
    verity: Verity,
    /// The decision both must reach (the corpus is meant to have both outcomes).
    accept: bool,
    /// The runner's refusal must say this.
    says: &'static str,
}

#[test]
fn agrees_with_veritysetup_case_for_case() {
    if let Some(why) = disk::missing_tools() {
        panic!("{why}");
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let d = tmp.path();
    let mut cases = Vec::new();
    let mut add = |name, disk: PathBuf, verity: Verity, accept, says| {
        cases.push(Case { name, disk, verity, accept, says });
    };

    // Good images: GPT and MBR, erofs, ext4, xfs, block sizes 4096 and 512/1024 (three levels).
    let (gpt, v) = disk::measured(d, "gpt-erofs", Fs::Erofs, Label::Gpt, "5a1f", 4096, 4096);
    add("GPT, erofs, 4096/4096", gpt.clone(), v.clone(), true, "");
    let (mbr, vm) = disk::measured(d, "mbr-ext4", Fs::Ext4, Label::Mbr, "00ff00ff", 4096, 4096);
    add("MBR, ext4, 4096/4096", mbr.clone(), vm.clone(), true, "");
    if disk::on_path("mkfs.xfs") {
        let (x, vx) = disk::measured(d, "gpt-xfs", Fs::Xfs, Label::Gpt, "abcdef", 4096, 4096);
        add("GPT, xfs, 4096/4096", x, vx, true, "");
    }
    let (small, vs) = disk::measured(d, "gpt-512", Fs::Erofs, Label::Gpt, "01", 512, 1024);
    add("GPT, erofs, 512/1024 (three levels)", small.clone(), vs.clone(), true, "");

    let copy = |from: &Path, name: &str| -> PathBuf {
        let to = d.join(name);
        std::fs::copy(from, &to).expect("copy");
        to
    };
    let p1 = 1u64 << 20; // partition 1 starts at 1 MiB (sfdisk's alignment)
    let p2_of = |v: &Verity| p1 + (v.data_blocks * u64::from(v.data_block_size)).div_ceil(1 << 20) * (1 << 20);

    // Damaged data and hash area.
    let f = copy(&gpt, "data-flip.img");
    disk::flip(&f, p1 + 4096 * 3 + 17);
    add("flipped data byte", f, v.clone(), false, "gives root hash");
    let f = copy(&gpt, "hash-flip.img");
    disk::flip(&f, p2_of(&v) + 40);
    add("flipped hash byte", f, v.clone(), false, "hash area on partition 2 differs");
    let f = copy(&gpt, "hash-pad.img");
    disk::flip(&f, p2_of(&v) + 4095);
    add("flipped byte in a hash block's zero padding", f, v.clone(), false, "hash area on partition 2 differs");
    let f = copy(&small, "upper-flip.img");
    disk::flip(&f, p2_of(&vs) + 3);
    add("flipped byte in the top hash level", f, vs.clone(), false, "at level 1");
    let f = copy(&gpt, "slack-flip.img");
    disk::flip(&f, p1 + v.data_blocks * 4096 + 100);
    add("flipped byte after data_blocks in partition 1 (not covered)", f, v.clone(), true, "");

    // Wrong parameters.
    let mut w = v.clone();
    // The last digit changed to another one (appending a fixed "0" left the hash as it was
    // whenever it already ended in 0: one run in 16).
    let last = if v.root_hash.ends_with('0') { '1' } else { '0' };
    w.root_hash = format!("{}{last}", &v.root_hash[..63]);
    assert_ne!(w.root_hash, v.root_hash);
    add("wrong root hash", gpt.clone(), w, false, "not the configured root_hash");
    let mut w = v.clone();
    w.salt = "5a1e".into();
    add("wrong salt", gpt.clone(), w, false, "gives root hash");
    let mut w = v.clone();
    w.data_blocks -= 1;
    add("data_blocks one short", gpt.clone(), w, false, "gives root hash");
    let mut w = v.clone();
    w.data_blocks += 1;
    add("data_blocks one more (inside partition 1)", gpt.clone(), w, false, "gives root hash");
    let mut w = v.clone();
    w.data_blocks = (p2_of(&v) - p1) / 4096 + 1;
    add("data_blocks beyond partition 1", gpt.clone(), w, false, "more than partition 1 holds");
    let mut w = v.clone();
    w.data_block_size = 1024;
    w.data_blocks = v.data_blocks * 4;
    add("wrong data block size", gpt.clone(), w, false, "gives root hash");
    let mut w = v.clone();
    w.hash_block_size = 2048;
    add("wrong hash block size", gpt.clone(), w, false, "gives root hash");
    let mut w = vm.clone();
    w.salt = v.salt.clone();
    add("MBR, wrong salt", mbr.clone(), w, false, "gives root hash");

    // Layouts without a hash partition or partition table.
    let data = disk::filesystem(d, "only", Fs::Erofs, 300 * 1024);
    let hash = d.join("only.hash");
    let vo = disk::format(&data, &hash, "77", 4096, 4096);
    let only = disk::disk(&d.join("no-p2.img"), Label::Gpt, &[&data], 0);
    add("no partition 2", only, vo.clone(), false, "no partition 2");
    let raw = d.join("no-table.img");
    {
        let mut out = std::fs::read(&data).expect("data");
        out.extend(std::fs::read(&hash).expect("hash"));
        std::fs::write(&raw, out).expect("write");
    }
    add("no partition table", raw, vo.clone(), false, "no partition table");
    // Partition 2 too small for the tree: a one-sector partition 2 holding the tree's start.
    let (_, vsm) = disk::measured(d, "sm", Fs::Erofs, Label::Mbr, "01", 512, 512);
    let data_sm = d.join("sm.fs");
    let tiny = d.join("tiny-p2.img");
    {
        let len = std::fs::metadata(&data_sm).expect("data").len();
        let sectors = len.div_ceil(1 << 20) * 2048;
        let script = format!("label: dos\nstart=2048, size={sectors}\nstart={}, size=1\n", 2048 + sectors);
        let f = std::fs::File::create(&tiny).expect("create");
        f.set_len((2048 + sectors + 2048) * 512).expect("size");
        drop(f);
        let mut child = std::process::Command::new(if disk::on_path("sfdisk") { "sfdisk" } else { "/usr/sbin/sfdisk" })
            .args(["--quiet", "--no-reread", "--no-tell-kernel"])
            .arg(&tiny)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("sfdisk");
        std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), script.as_bytes()).expect("script");
        assert!(child.wait().expect("sfdisk").success());
        let mut disk_f = std::fs::OpenOptions::new().write(true).open(&tiny).expect("open");
        std::io::Seek::seek(&mut disk_f, std::io::SeekFrom::Start(1 << 20)).expect("seek");
        std::io::copy(&mut std::fs::File::open(&data_sm).expect("data"), &mut disk_f).expect("copy");
        std::io::Seek::seek(&mut disk_f, std::io::SeekFrom::Start((2048 + sectors) * 512)).expect("seek");
        let h = std::fs::read(d.join("sm.hash")).expect("hash");
        std::io::Write::write_all(&mut disk_f, &h[..512.min(h.len())]).expect("hash");
    }
    add("partition 2 smaller than the hash tree", tiny, vsm.clone(), false, "partition 2 holds 512 bytes");

    // A one-block image: the root is the data block's own digest, the hash area empty.
    let one = d.join("one.data");
    std::fs::write(&one, {
        let mut b = std::fs::read(&data).expect("data");
        b.truncate(4096);
        b
    })
    .expect("write");
    let one_hash = d.join("one.hash");
    let v1 = disk::format(&one, &one_hash, "aa", 4096, 4096);
    assert_eq!(v1.data_blocks, 1);
    let one_disk = disk::disk(&d.join("one.img"), Label::Gpt, &[&one, &one_hash], 4096);
    add("one data block (no hash levels)", one_disk, v1, true, "");

    let mut table = Vec::new();
    let mut failures = Vec::new();
    for c in &cases {
        let scratch = d.join("scratch");
        std::fs::create_dir_all(&scratch).expect("scratch");
        let oracle = disk::veritysetup_verify(&c.disk, &c.verity, &scratch);
        let oracle_ok = matches!(oracle, Ok(true));
        let (after, during, streamed) = ours(&c.disk, &c.verity);
        table.push(format!(
            "{:<60} veritysetup {:<8} kata-addons {:<8} streamed {}",
            c.name,
            match &oracle {
                Ok(true) => "accept".to_string(),
                Ok(false) => "refuse".to_string(),
                Err(why) => format!("n/a ({why})"),
            },
            if after.is_ok() { "accept" } else { "refuse" },
            streamed
        ));
        if oracle_ok != after.is_ok() || oracle_ok != c.accept {
            failures.push(format!(
                "{}: veritysetup {oracle:?}, kata-addons {after:?}, expected accept={}",
                c.name, c.accept
            ));
        }
        if after.is_ok() != during.is_ok() {
            failures.push(format!("{}: read afterwards {after:?} but streamed {during:?}", c.name));
        }
        if let Err(msg) = &after
            && (!msg.contains(c.says) || !msg.contains("image.img"))
        {
            failures.push(format!("{}: the refusal must name the file and say {:?}: {msg}", c.name, c.says));
        }
        // What install records of a measured file besides its tree: the sha256 of its
        // bytes outside the data blocks, here computed from the whole file and sfdisk's
        // partition 1, both ways.
        if let Ok(found) = &after {
            let want = outside_sha256(&c.disk, &c.verity);
            for (how, got) in [("read afterwards", Some(found)), ("streamed", during.as_ref().ok())] {
                if got.and_then(|g| g.outside_sha256.as_deref()) != Some(want.as_str()) {
                    failures.push(format!("{}: {how}, outside_sha256 {got:?}, expected {want}", c.name));
                }
            }
        }
        if c.accept && !streamed {
            failures.push(format!("{}: the tree was not computed while streaming", c.name));
        }
    }
    // An edit the tree does not cover (after data_blocks, accepted by veritysetup too) is
    // still an edit of the file: its outside sha256 differs.
    let named = |n: &str| cases.iter().find(|c| c.name == n).expect("case");
    let (base, slack) =
        (named("GPT, erofs, 4096/4096"), named("flipped byte after data_blocks in partition 1 (not covered)"));
    assert_ne!(outside_sha256(&base.disk, &base.verity), outside_sha256(&slack.disk, &slack.verity));
    // Shown with --nocapture (and on failure): the corpus, decision by decision.
    println!("{}", table.join("\n"));
    assert!(failures.is_empty(), "{}\n\n{}", failures.join("\n"), table.join("\n"));
    assert!(cases.iter().filter(|c| c.accept).count() >= 4 && cases.iter().filter(|c| !c.accept).count() >= 12);
}

#[test]
fn filesystems_and_the_extension_integrity_table() {
    if let Some(why) = disk::missing_tools() {
        panic!("{why}");
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let d = tmp.path();
    let check = |path: &Path, role, p: Option<&Params>| {
        let f = std::fs::File::open(path).expect("open");
        verity::check(&f, "ext.img", role, p, None).map_err(|e| format!("{e:#}"))
    };

    // rootfs_type comes from partition 1's superblock.
    let (gpt, v) = disk::measured(d, "e", Fs::Erofs, Label::Gpt, "01", 4096, 4096);
    let got = check(&gpt, Role::Image, Some(&params(&v))).expect("erofs");
    assert_eq!((got.filesystem.wit_name(), got.table), ("erofs", Some("gpt")));
    assert_eq!(got.root_hash.as_deref(), Some(v.root_hash.as_str()));
    let (mbr, vm) = disk::measured(d, "x4", Fs::Ext4, Label::Mbr, "01", 4096, 4096);
    assert_eq!(check(&mbr, Role::Image, Some(&params(&vm))).expect("ext4").filesystem.wit_name(), "ext4");
    if disk::on_path("mkfs.xfs") {
        let xfs = disk::filesystem(d, "xfs", Fs::Xfs, 4096);
        let xd = disk::disk(&d.join("xfs.img"), Label::Gpt, &[&xfs], 0);
        assert_eq!(check(&xd, Role::Image, None).expect("xfs").filesystem.wit_name(), "xfs");
    }
    // An unmeasured image still needs partition 1 with a known filesystem.
    let junk = d.join("junk.bin");
    std::fs::write(&junk, vec![0x11u8; 1 << 20]).expect("write");
    let jd = disk::disk(&d.join("junk.img"), Label::Gpt, &[&junk], 0);
    let e = check(&jd, Role::Image, None).expect_err("unknown filesystem");
    assert!(e.contains("no ext4, xfs or erofs superblock"), "{e}");

    // Extensions: the guest mount script's table.
    // hash partition + params: verify.
    check(&gpt, Role::Extension, Some(&params(&v))).expect("measured extension");
    // hash partition, no params: refused (the VM would power off).
    let e = check(&gpt, Role::Extension, None).expect_err("stripped verity");
    assert!(e.contains("hash partition 2 but no verity parameters"), "{e}");
    // params, no hash partition: refused.
    let data = disk::filesystem(d, "p1only", Fs::Erofs, 4096);
    let only = disk::disk(&d.join("p1only.img"), Label::Gpt, &[&data], 0);
    let e = check(&only, Role::Extension, Some(&params(&v))).expect_err("no hash partition");
    assert!(e.contains("no partition 2"), "{e}");
    let e = check(&data, Role::Extension, Some(&params(&v))).expect_err("no table");
    assert!(e.contains("no partition table"), "{e}");
    // neither: a raw mount of partition 1, or of the whole disk.
    assert_eq!(check(&only, Role::Extension, None).expect("p1 raw").table, Some("gpt"));
    assert_eq!(check(&data, Role::Extension, None).expect("whole disk raw").table, None);
    // Extensions are mounted as erofs only.
    let e = check(&mbr, Role::Extension, Some(&params(&vm))).expect_err("ext4 extension");
    assert!(e.contains("erofs only"), "{e}");
}
