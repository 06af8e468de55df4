//! Hostile layers (docs/design.md#limits): a raw tar writer that can write any header (any
//! type byte, any declared size, GNU long names, PAX records, bytes that are not UTF-8),
//! compression helpers for bombs, and the catalogue of the costliest layers of at most 1
//! MiB that `bench/hostile` measures with the release binary (built by the `hostile-layers`
//! bin).

use std::io::Write;
use std::path::Path;

use crate::image::{Blob, Compress, Image, LayerBuilder, media};

/// A raw tar writer: any type byte, any declared size, any extension record, any name bytes.
#[derive(Default, Clone)]
pub struct RawTar(pub Vec<u8>);

/// Pads `v` with zeros to a multiple of 512 bytes.
pub fn pad(v: &mut Vec<u8>) {
    let rem = v.len() % 512;
    if rem != 0 {
        v.resize(v.len() + 512 - rem, 0);
    }
}

/// A 512-byte GNU header (ustar `00` magic and the `prefix` field when `prefix` is given)
/// with a correct checksum. `name` and `link` must fit their 100-byte fields.
pub fn header_block(typ: u8, name: &[u8], link: &[u8], size: u64, prefix: Option<&[u8]>) -> [u8; 512] {
    let mut h = if prefix.is_some() { tar::Header::new_ustar() } else { tar::Header::new_gnu() };
    h.as_mut_bytes()[156] = typ;
    h.set_size(size);
    h.set_mode(0o644);
    h.set_mtime(1_700_000_000);
    assert!(name.len() <= 100 && link.len() <= 100, "header fields are 100 bytes");
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    h.as_old_mut().linkname[..link.len()].copy_from_slice(link);
    if let Some(p) = prefix {
        let u = h.as_ustar_mut().expect("ustar header");
        assert!(p.len() <= 155, "ustar prefix is 155 bytes");
        u.prefix[..p.len()].copy_from_slice(p);
    }
    h.set_cksum();
    let mut out = [0u8; 512];
    out.copy_from_slice(h.as_bytes());
    out
}

/// One PAX record `"<len> <key>=<value>\n"` (the length counts itself).
pub fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let rest = key.len() + value.len() + 3; // ' ', '=', '\n'
    let mut len = rest + 1;
    while format!("{len}").len() + rest != len {
        len += 1;
    }
    let mut r = format!("{len} {key}=").into_bytes();
    r.extend_from_slice(value);
    r.push(b'\n');
    r
}

impl RawTar {
    /// A header only (the caller appends the data, or not).
    pub fn header(&mut self, typ: u8, name: &str, link: &str, size: u64) -> &mut Self {
        self.0.extend_from_slice(&header_block(typ, name.as_bytes(), link.as_bytes(), size, None));
        self
    }

    /// A header with raw name and link bytes.
    pub fn header_raw(&mut self, typ: u8, name: &[u8], link: &[u8], size: u64) -> &mut Self {
        self.0.extend_from_slice(&header_block(typ, name, link, size, None));
        self
    }

    /// A whole entry: header, data, padding.
    pub fn entry(&mut self, typ: u8, name: &str, link: &str, data: &[u8]) -> &mut Self {
        self.entry_raw(typ, name.as_bytes(), link.as_bytes(), data)
    }

    /// A whole entry with raw name and link bytes.
    pub fn entry_raw(&mut self, typ: u8, name: &[u8], link: &[u8], data: &[u8]) -> &mut Self {
        self.header_raw(typ, name, link, data.len() as u64);
        self.0.extend_from_slice(data);
        pad(&mut self.0);
        self
    }

    /// A regular file.
    pub fn file(&mut self, name: &str, data: &[u8]) -> &mut Self {
        self.entry(b'0', name, "", data)
    }

    /// A PAX extended header (`x`) with these records.
    pub fn pax(&mut self, records: &[(&str, &str)]) -> &mut Self {
        let body: Vec<u8> = records.iter().flat_map(|(k, v)| pax_record(k, v.as_bytes())).collect();
        self.entry(b'x', "PaxHeaders/x", "", &body)
    }

    /// A PAX extended header with raw record bytes.
    pub fn pax_raw(&mut self, body: &[u8]) -> &mut Self {
        self.entry(b'x', "PaxHeaders/x", "", body)
    }

    /// A GNU long name record (`L`) for the next entry.
    pub fn long_name(&mut self, name: &str) -> &mut Self {
        self.long_record(b'L', name.as_bytes())
    }

    /// A GNU long name (`L`) or long link (`K`) record with raw bytes.
    pub fn long_record(&mut self, typ: u8, text: &[u8]) -> &mut Self {
        let mut d = text.to_vec();
        d.push(0);
        self.entry(typ, "././@LongLink", "", &d)
    }

    /// The archive with its end-of-archive marker (two zero blocks).
    pub fn finish(&mut self) -> Vec<u8> {
        let mut v = std::mem::take(&mut self.0);
        v.extend_from_slice(&[0u8; 1024]);
        v
    }
}

/// A zstd stream of `n` bytes `b`: one frame of up to 32 MiB compressed once and
/// repeated (frames concatenate), so that even an unoptimised build makes it quickly.
pub fn zstd_repeat(b: u8, n: u64) -> Vec<u8> {
    repeat_frames(n, 32 << 20, |k| zstd::encode_all(std::io::Read::take(std::io::repeat(b), k), 1).expect("zstd"))
}

fn repeat_frames(n: u64, chunk: u64, encode: impl Fn(u64) -> Vec<u8>) -> Vec<u8> {
    let full = encode(chunk.min(n));
    let mut out = Vec::new();
    for _ in 0..n / chunk {
        out.extend_from_slice(&full);
    }
    if !n.is_multiple_of(chunk) {
        out.extend(encode(n % chunk));
    }
    out
}

/// zstd at level 3.
pub fn zstd(data: &[u8]) -> Vec<u8> {
    zstd::encode_all(data, 3).expect("zstd")
}

/// gzip at the best compression.
pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(data).expect("gzip");
    e.finish().expect("gzip")
}

/// gzip members holding `n` bytes `b` in all: one member of up to 8 MiB compressed once
/// and repeated (members concatenate; gzip's ratio is about 1:1032 whatever the size).
pub fn gzip_repeat(b: u8, n: u64) -> Vec<u8> {
    repeat_frames(n, 8 << 20, |k| gzip(&vec![b; k as usize]))
}

/// The kernel every catalogue image carries in its base layer.
pub const KERNEL: &[u8] = b"\x7fELF-kernel-bytes";

/// A small base layer with `/boot/vmlinuz`.
pub fn base_layer() -> Blob {
    LayerBuilder::new().dir("boot").file("boot/vmlinuz", KERNEL).build(Compress::Gzip)
}

/// What a catalogue case is expected to end in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// Exit 0: the wanted files are extracted.
    Extracted,
    /// Exit 1 with this text on stderr.
    Refused(&'static str),
}

/// One hostile image of the catalogue.
pub struct Case {
    /// Short identifier (command-line friendly).
    pub id: &'static str,
    /// What the layer holds, for the benchmark table.
    pub what: String,
    /// Layers, bottom first.
    pub layers: Vec<Blob>,
    /// Wanted in-image paths.
    pub paths: Vec<String>,
    /// Extra `kata-addons fetch` arguments.
    pub args: Vec<String>,
    /// Expected outcome.
    pub expect: Expect,
}

impl Case {
    /// Size of the largest layer blob (the catalogue keeps each at most 1 MiB).
    pub fn largest_layer(&self) -> usize {
        self.layers.iter().map(|b| b.data.len()).max().unwrap_or(0)
    }

    /// Writes the image as an OCI layout in `dir` (tag `v1`); returns its `oci:` reference.
    pub fn write_layout(&self, dir: &Path) -> String {
        Image::new(self.layers.clone()).write_layout(dir, "v1");
        format!("oci:{}:v1", dir.display())
    }
}

fn case(id: &'static str, what: impl Into<String>, layers: Vec<Blob>, expect: Expect) -> Case {
    Case { id, what: what.into(), layers, paths: vec!["/boot/vmlinuz".into()], args: Vec::new(), expect }
}

/// The header of one regular file of `size` bytes (no end marker), zstd-compressed.
fn lone_header(typ: u8, name: &str, size: u64) -> Vec<u8> {
    zstd(&header_block(typ, name.as_bytes(), b"", size, None))
}

/// The catalogue of the costliest layers of at most 1 MiB (each case's largest layer is
/// at most 1 MiB; a few cases are images of many such layers).
pub fn catalogue() -> Vec<Case> {
    let mut out = Vec::new();
    let mib = 1u64 << 20;

    // Extension records far over their cap: refused before they are read.
    let mut blob = lone_header(b'L', "././@LongLink", 128 * mib);
    blob.extend(zstd_repeat(b'a', 128 * mib));
    blob.extend(zstd(&[0u8; 1024]));
    out.push(case(
        "long-name-record",
        "GNU long name record of 128 MiB (zstd)",
        vec![base_layer(), Blob::new(media::TAR_ZSTD, blob)],
        Expect::Refused("GNU long name record is 134217728 bytes"),
    ));
    let mut blob = lone_header(b'x', "PaxHeaders/x", 128 * mib);
    blob.extend(zstd_repeat(b'a', 128 * mib));
    blob.extend(zstd(&[0u8; 1024]));
    out.push(case(
        "pax-record",
        "PAX header record of 128 MiB (zstd)",
        vec![base_layer(), Blob::new(media::TAR_ZSTD, blob)],
        Expect::Refused("PAX extended header record is 134217728 bytes"),
    ));

    // The largest PAX records accepted (64 KiB each, thousands of small keys), back to
    // back up to the decompression cap.
    let mut rec = Vec::new();
    while rec.len() < (64 << 10) - 40 {
        rec.extend(pax_record("SCHILY.xattr.user.k", b"v"));
    }
    let mut t = RawTar::default();
    for i in 0..900 {
        t.pax_raw(&rec).file(&format!("p{i}"), b"");
    }
    let tar = t.finish();
    out.push(case(
        "pax-records",
        format!("900 PAX headers of {} KiB of tiny records each (zstd)", rec.len() >> 10),
        vec![base_layer(), Blob::new(media::TAR_ZSTD, zstd(&tar))],
        Expect::Extracted,
    ));

    // Deep, distinct paths: the index byte cap.
    let deep = "a/".repeat(2000);
    let mut t = RawTar::default();
    for i in 0..12_000 {
        t.long_name(&format!("{i:05}/{deep}f")).file("x", b"");
    }
    out.push(case(
        "deep-paths",
        "12,000 distinct 4 KiB-deep paths (GNU long names, zstd)",
        vec![base_layer(), Blob::new(media::TAR_ZSTD, zstd(&t.finish()))],
        Expect::Refused("--max-index-bytes"),
    ));

    // Nearly as many entries as the index accepts (24 MiB at 96 bytes + the path per
    // entry: about 249,000 short paths), in one layer, and more than that.
    for (id, n, expect) in [
        ("max-entries", 240_000u32, Expect::Extracted),
        ("over-max-entries", 250_001, Expect::Refused("limit --max-index-")),
    ] {
        let mut t = RawTar::default();
        for i in 0..n {
            t.header(b'0', &format!("{i:x}"), "", 0);
        }
        out.push(case(
            id,
            format!("{n} empty files in one layer (zstd)"),
            vec![base_layer(), Blob::new(media::TAR_ZSTD, zstd(&t.finish()))],
            expect,
        ));
    }

    // Decompression bombs, cut at the cap.
    let mut blob = lone_header(b'0', "zeros", 20 << 30);
    let chunk = zstd_repeat(0, 256 * mib);
    for _ in 0..80 {
        blob.extend_from_slice(&chunk);
    }
    blob.extend(zstd(&[0u8; 1024]));
    out.push(case(
        "zstd-bomb",
        "20 GiB of zeros in one entry (zstd)",
        vec![base_layer(), Blob::new(media::TAR_ZSTD, blob)],
        Expect::Refused("decompresses to more than"),
    ));
    let mut t = RawTar::default();
    t.header(b'0', "zeros", "", 2 << 30);
    let mut head = t.0.clone();
    head.truncate(512);
    let mut blob = gzip(&head);
    blob.extend(gzip_repeat(0, 960 * mib));
    out.push(case(
        "gzip-bomb",
        "960 MiB of zeros in one entry (gzip)",
        vec![base_layer(), Blob::new(media::TAR_GZIP, blob)],
        Expect::Refused("decompresses to more than"),
    ));

    // The largest accepted extractions: a wanted file as large as the cap allows.
    out.push(largest_zstd());
    out.push(largest_gzip());

    // The wanted file again and again: every copy is extracted over the previous one.
    // 900 KiB of noise (not wanted) raises the decompression cap above the index caps.
    let mut t = RawTar::default();
    t.entry(b'5', "boot", "", b"").file("noise", &crate::node::noise(900 << 10, 3));
    for _ in 0..230_000 {
        t.header(b'0', "boot/vmlinuz", "", 0);
    }
    out.push(case(
        "duplicates",
        "the wanted file 230,000 times (empty, zstd; the index byte cap allows about 233,000)",
        vec![Blob::new(media::TAR_ZSTD, zstd(&t.finish()))],
        Expect::Extracted,
    ));

    // Links.
    let mut t = RawTar::default();
    t.entry(b'5', "boot", "", b"").file("boot/k0", KERNEL);
    for i in 1..=39 {
        t.entry(b'2', &format!("boot/k{i}"), &format!("k{}", i - 1), b"");
    }
    t.entry(b'2', "boot/vmlinuz", "k39", b"");
    out.push(case(
        "symlink-chain",
        "a chain of 40 symlinks (the most followed)",
        vec![Blob::new(media::TAR_GZIP, gzip(&t.finish()))],
        Expect::Extracted,
    ));
    let mut t = RawTar::default();
    t.entry(b'5', "boot", "", b"");
    for i in 0..100_000u32 {
        // Every link lies on the wanted path (each one makes the candidates recomputed),
        // and the last one points at itself.
        t.entry(b'2', "boot/vmlinuz", &format!("../boot/{}vmlinuz", "./".repeat(i as usize % 7)), b"");
    }
    out.push(case(
        "symlink-rewrites",
        "the wanted path rewritten 100,000 times by symlinks (zstd)",
        vec![base_layer(), Blob::new(media::TAR_ZSTD, zstd(&t.finish()))],
        Expect::Refused("too many levels of symbolic links"),
    ));
    let mut t = RawTar::default();
    t.entry(b'5', "boot", "", b"").file("boot/h0", KERNEL);
    for i in 1..40 {
        t.entry(b'1', &format!("boot/h{i}"), &format!("boot/h{}", i - 1), b"");
    }
    t.entry(b'1', "boot/vmlinuz", "boot/h39", b"");
    out.push(case(
        "hardlink-chain",
        "a chain of 40 hard links",
        vec![Blob::new(media::TAR_GZIP, gzip(&t.finish()))],
        Expect::Extracted,
    ));
    out.push(symlink_storm());

    // Many layers.
    for (id, n, expect) in [
        ("256-layers", 255usize, Expect::Extracted),
        ("257-layers", 256, Expect::Refused("more than the limit of 256 (--max-layers)")),
    ] {
        let mut layers = vec![base_layer()];
        for i in 0..n {
            let mut t = LayerBuilder::new();
            t.dir("boot").whiteout(&format!("boot/old{i}"));
            for j in 0..100 {
                t.symlink(&format!("boot/l{i}-{j}"), "vmlinuz");
            }
            layers.push(t.build(Compress::Gzip));
        }
        out.push(case(id, format!("{} layers, 100 symlinks and a whiteout each", n + 1), layers, expect));
    }

    // Sparse files (refused) and a declared size far past the end of the stream.
    let mut t = RawTar::default();
    t.entry(b'5', "boot", "", b"")
        .pax(&[("GNU.sparse.major", "1"), ("GNU.sparse.minor", "0"), ("GNU.sparse.realsize", "8589934592")])
        .entry(b'0', "boot/vmlinuz", "", &vec![7u8; 512 << 10]);
    out.push(case(
        "sparse",
        "PAX 1.0 sparse file of 8 GiB",
        vec![Blob::new(media::TAR_GZIP, gzip(&t.finish()))],
        Expect::Refused("sparse files are not supported"),
    ));
    let mut blob = zstd(&header_block(b'5', b"boot", b"", 0, None));
    blob.extend(lone_header(b'0', "boot/other", 1 << 40));
    blob.extend(zstd_repeat(0, 50 * mib));
    out.push(case(
        "truncated-entry",
        "a 1 TiB entry whose data ends after 50 MiB",
        vec![Blob::new(media::TAR_ZSTD, blob)],
        Expect::Refused("ends inside an entry"),
    ));
    for c in &out {
        assert!(c.largest_layer() <= 1 << 20, "{}: a layer of {} bytes", c.id, c.largest_layer());
    }
    out
}

/// A wanted file as large as the decompression cap of a 1 MiB zstd layer allows:
/// 1000 KiB of noise then zeros, just under `256 × blob size`.
fn largest_zstd() -> Case {
    let noise = crate::node::noise(1000 << 10, 7);
    let zeros: u64 = 249 << 20;
    let size = noise.len() as u64 + zeros;
    let mut blob = zstd(&header_block(b'5', b"boot", b"", 0, None));
    blob.extend(lone_header(b'0', "boot/vmlinuz", size));
    blob.extend(zstd(&noise));
    blob.extend(zstd_repeat(0, zeros));
    let mut tail = vec![0u8; (512 - (size % 512) as usize) % 512];
    tail.extend_from_slice(&[0u8; 1024]);
    blob.extend(zstd(&tail));
    case(
        "largest-zstd",
        "largest accepted: 250 MiB file (1000 KiB noise + zeros, zstd)",
        vec![Blob::new(media::TAR_ZSTD, blob)],
        Expect::Extracted,
    )
}

/// The same with gzip: its 1:1032 ratio makes 1 MiB of zeros-gzip about 1 GiB, so the
/// file is sized to the cap (256 × blob size).
fn largest_gzip() -> Case {
    let noise = crate::node::noise(700 << 10, 9);
    let zeros: u64 = 180 << 20;
    let size = noise.len() as u64 + zeros;
    let mut blob = gzip(&header_block(b'5', b"boot", b"", 0, None));
    blob.extend(gzip(&header_block(b'0', b"boot/vmlinuz", b"", size, None)));
    blob.extend(gzip(&noise));
    blob.extend(gzip_repeat(0, zeros));
    let mut tail = vec![0u8; (512 - (size % 512) as usize) % 512];
    tail.extend_from_slice(&[0u8; 1024]);
    blob.extend(gzip(&tail));
    case(
        "largest-gzip",
        "largest accepted: 180.7 MiB file (700 KiB noise + zeros, gzip)",
        vec![Blob::new(media::TAR_GZIP, blob)],
        Expect::Extracted,
    )
}

/// 40 layers of 2,000 symlinks each over a 45-deep wanted path; each layer repeats the
/// directory chain, so resolving the wanted path walks all 45 levels through every layer.
pub fn symlink_storm() -> Case {
    let dirs: Vec<String> = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRS".chars().map(String::from).collect();
    let deep = dirs.join("/");
    let mut base = LayerBuilder::new();
    for i in 1..=dirs.len() {
        base.dir(&dirs[..i].join("/"));
    }
    base.file(&format!("{deep}/vmlinuz"), KERNEL);
    let mut layers = vec![base.build(Compress::Gzip)];
    for l in 0..40 {
        let mut t = LayerBuilder::new();
        for i in 1..=dirs.len() {
            t.dir(&dirs[..i].join("/"));
        }
        for i in 0..2000 {
            t.symlink(&format!("s{l}-{i}"), "a/b");
        }
        layers.push(t.build(Compress::Gzip));
    }
    let mut c =
        case("symlink-storm", "40 layers × 2,000 symlinks over a 45-deep wanted path", layers, Expect::Extracted);
    c.paths = vec![format!("/{deep}/vmlinuz")];
    c
}

// ---- hostile node configuration and ConfigMaps ------------------------------------------

/// The kata-deploy shim the node-configuration cases target, and its handler.
pub const NODE_SHIM: (&str, &str) = ("qemu-snp", "kata-qemu-snp");

/// Writes `text` at a node path beneath `root`, creating its directories.
fn write_node(root: &Path, node_path: &str, text: &str) {
    let p = root.join(node_path.trim_start_matches('/'));
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(&p, text).expect("write node file");
}

/// Five links `loopN -> .` in `/etc/crio/crio.conf.d` beneath `root` (CRI-O reads each as
/// a file and fails; a walk that follows them grows as 5^depth).
pub fn crio_loops(root: &Path) {
    let dir = root.join("etc/crio/crio.conf.d");
    std::fs::create_dir_all(&dir).expect("mkdir crio.conf.d");
    for i in 0..5 {
        std::os::unix::fs::symlink(".", dir.join(format!("loop{i}"))).expect("loop link");
    }
}

/// containerd's main file beneath `root` importing `files` files of about `size` bytes
/// each (in `/etc/containerd/conf.d`), every one importing all the others.
pub fn containerd_fan_out(root: &Path, files: usize, size: usize) {
    let paths: Vec<String> = (0..files).map(|i| format!("/etc/containerd/conf.d/f{i:03}.toml")).collect();
    let imports = serde_json::to_string(&paths).expect("json");
    write_node(root, "/etc/containerd/config.toml", &format!("version = 3\nimports = {imports}\n"));
    let pad = "x".repeat(size.saturating_sub(imports.len() + 64));
    for p in &paths {
        write_node(root, p, &format!("version = 3\nimports = {imports}\npad = \"{pad}\"\n"));
    }
}

/// A YAML ConfigMap (bare map) whose `addonImage` is `levels` nested flow sequences.
pub fn nested_configmap(levels: usize) -> String {
    format!("addonImage: {}{}\nkernelPath: /boot/vmlinuz\n", "[".repeat(levels), "]".repeat(levels))
}

/// One node-configuration case of `bench/hostile`: a command run on files written under
/// the case's directory, and how it must end.
pub struct NodeCase {
    /// Short id.
    pub id: &'static str,
    /// What it is.
    pub what: &'static str,
    /// The `kata-addons` arguments.
    pub args: Vec<String>,
    /// Expected exit code.
    pub code: i32,
    /// Expected in stderr.
    pub needle: &'static str,
}

/// Writes the node-configuration cases under `dir` (a node root with kata-deploy's SNP
/// shim for CRI-O, an addon layout, ConfigMaps) and returns them.
pub fn node_catalogue(dir: &Path) -> Vec<NodeCase> {
    let (shim, handler) = NODE_SHIM;
    let layout = dir.join("addon");
    let mut top = LayerBuilder::new();
    top.file("boot/vmlinuz", &[7u8; 60_000]);
    Image::new(vec![base_layer(), top.build(Compress::Gzip)]).write_layout(&layout, "v1");
    let image = format!("oci:{}:v1", layout.display());
    let node = |name: &str| -> String {
        let root = dir.join(name);
        let defaults = "/opt/kata/share/defaults/kata-containers";
        write_node(
            &root,
            &format!("{defaults}/runtimes/{shim}/configuration-{shim}.toml"),
            &crate::cri::shim_config(shim),
        );
        std::fs::create_dir_all(root.join(format!("{}/runtimes/{shim}/config.d", &defaults[1..]))).expect("config.d");
        write_node(
            &root,
            "/etc/crio/crio.conf.d/99-kata-deploy",
            &format!(
                "[crio.runtime.runtimes.{handler}]\nruntime_path = \"/opt/kata/bin/containerd-shim-kata-v2\"\n\
                 runtime_type = \"vm\"\nruntime_config_path = \"{defaults}/runtimes/{shim}/configuration-{shim}.toml\"\n"
            ),
        );
        root.display().to_string()
    };
    let cm = |name: &str, extra: &str| -> String {
        let p = dir.join(name);
        std::fs::write(&p, format!("addonImage: \"{image}\"\nprovider: snp\nkernelPath: /boot/vmlinuz\n{extra}"))
            .expect("write ConfigMap");
        p.display().to_string()
    };
    let mut out = Vec::new();
    for (id, what, levels) in [
        ("yaml-20000", "ConfigMap `addonImage: [[[…]]]` nested 20,000 levels (40 KB), `preview`", 20_000),
        ("yaml-520000", "ConfigMap `addonImage: [[[…]]]` nested 520,000 levels (1,040,013 bytes), `preview`", 520_000),
    ] {
        let p = dir.join(format!("{id}.yaml"));
        std::fs::write(&p, nested_configmap(levels)).expect("write ConfigMap");
        out.push(NodeCase {
            id,
            what,
            args: vec!["preview".into(), "--configmap".into(), p.display().to_string()],
            code: 2,
            needle: "nested more than 64 deep",
        });
    }
    let rc = cm("rc.yaml", &format!("runtimeClass: {handler}\n"));
    let root = node("fan-out");
    containerd_fan_out(Path::new(&root), 255, 1_000_000);
    out.push(NodeCase {
        id: "import-fan-out",
        what: "containerd: 255 files of ~1 MB each importing all the others, `install` with `runtimeClass`",
        args: vec!["install".into(), "--configmap".into(), rc.clone(), "--root".into(), root],
        code: 1,
        needle: "the most kata-addons reads",
    });
    let root = node("crio-loops");
    crio_loops(Path::new(&root));
    out.push(NodeCase {
        id: "crio-loops",
        what: "five links `loopN -> .` in /etc/crio/crio.conf.d, `install` with `runtimeClass`",
        args: vec!["install".into(), "--configmap".into(), rc, "--root".into(), root],
        code: 1,
        needle: "is a symlink to a directory",
    });
    let handlers: Vec<String> = (0..20_000).map(|i| format!("kata-{i}")).collect();
    let many = cm("handlers.yaml", &format!("runtimeClass: \"{}\"\n", handlers.join(",")));
    let root = node("handlers");
    out.push(NodeCase {
        id: "handlers-20000",
        what: "`runtimeClass` with 20,000 handlers, `install`",
        args: vec!["install".into(), "--configmap".into(), many, "--root".into(), root],
        code: 2,
        needle: "at most 64",
    });
    out
}
