//! Building test images: tar layers with any entry (including hostile ones), compressed
//! blobs, config, manifest and index JSON, and OCI layout directories.

use std::io::Write;
use std::path::Path;

use serde_json::{Value, json};

use crate::sha256_hex;

/// OCI media types.
pub mod media {
    /// Uncompressed OCI layer.
    pub const TAR: &str = "application/vnd.oci.image.layer.v1.tar";
    /// gzip OCI layer.
    pub const TAR_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
    /// zstd OCI layer.
    pub const TAR_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
    /// Docker gzip layer.
    pub const DOCKER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
    /// OCI manifest.
    pub const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
    /// OCI index.
    pub const INDEX: &str = "application/vnd.oci.image.index.v1+json";
    /// OCI config.
    pub const CONFIG: &str = "application/vnd.oci.image.config.v1+json";
}

/// Some content with its digest.
#[derive(Debug, Clone)]
pub struct Blob {
    /// Media type.
    pub media_type: String,
    /// Bytes.
    pub data: Vec<u8>,
    /// `sha256:<hex>`.
    pub digest: String,
}

impl Blob {
    /// A blob of `data` with `media_type`.
    pub fn new(media_type: &str, data: Vec<u8>) -> Self {
        Blob { media_type: media_type.to_string(), digest: format!("sha256:{}", sha256_hex(&data)), data }
    }

    /// The OCI descriptor of this blob.
    pub fn descriptor(&self) -> Value {
        json!({"mediaType": self.media_type, "digest": self.digest, "size": self.data.len()})
    }
}

/// How to compress a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compress {
    /// Plain tar.
    None,
    /// One gzip member.
    Gzip,
    /// Several gzip members concatenated (as `pigz`/some tools produce).
    MultiGzip,
    /// zstd.
    Zstd,
}

/// Builds one layer tar, entry by entry, with raw names (no sanitising).
pub struct LayerBuilder {
    tar: tar::Builder<Vec<u8>>,
}

impl Default for LayerBuilder {
    fn default() -> Self {
        Self::new()
    }
}

fn header(kind: tar::EntryType, name: &str, size: u64, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode);
    h.set_mtime(1_700_000_000);
    h.set_uid(0);
    h.set_gid(0);
    set_name(&mut h, name);
    h
}

fn set_name(h: &mut tar::Header, name: &str) {
    let b = name.as_bytes();
    assert!(b.len() < 100, "test entry names must be < 100 bytes");
    let field = &mut h.as_old_mut().name;
    field.fill(0);
    field[..b.len()].copy_from_slice(b);
}

fn set_link(h: &mut tar::Header, target: &str) {
    let b = target.as_bytes();
    assert!(b.len() < 100, "test link targets must be < 100 bytes");
    let field = &mut h.as_old_mut().linkname;
    field.fill(0);
    field[..b.len()].copy_from_slice(b);
}

impl LayerBuilder {
    /// An empty layer.
    pub fn new() -> Self {
        LayerBuilder { tar: tar::Builder::new(Vec::new()) }
    }

    fn append(&mut self, mut h: tar::Header, data: &[u8]) -> &mut Self {
        h.set_cksum();
        self.tar.append(&h, data).expect("append tar entry");
        self
    }

    /// A regular file (name as given, e.g. `boot/vmlinuz`, `../x`, `/abs`).
    pub fn file(&mut self, name: &str, data: &[u8]) -> &mut Self {
        self.file_mode(name, data, 0o644)
    }

    /// A regular file with a mode (e.g. setuid `0o4755`).
    pub fn file_mode(&mut self, name: &str, data: &[u8], mode: u32) -> &mut Self {
        let h = header(tar::EntryType::Regular, name, data.len() as u64, mode);
        self.append(h, data)
    }

    /// A regular file of `size` bytes of a repeating pattern, streamed (no big buffer).
    pub fn big_file(&mut self, name: &str, size: u64, seed: u8) -> &mut Self {
        let mut h = header(tar::EntryType::Regular, name, size, 0o644);
        h.set_cksum();
        let reader = PatternReader { left: size, state: seed as u32 | 1 };
        self.tar.append(&h, reader).expect("append big file");
        self
    }

    /// A directory.
    pub fn dir(&mut self, name: &str) -> &mut Self {
        let h = header(tar::EntryType::Directory, name, 0, 0o755);
        self.append(h, &[])
    }

    /// A symbolic link.
    pub fn symlink(&mut self, name: &str, target: &str) -> &mut Self {
        let mut h = header(tar::EntryType::Symlink, name, 0, 0o777);
        set_link(&mut h, target);
        self.append(h, &[])
    }

    /// A hard link to an earlier entry.
    pub fn hardlink(&mut self, name: &str, target: &str) -> &mut Self {
        let mut h = header(tar::EntryType::Link, name, 0, 0o644);
        set_link(&mut h, target);
        self.append(h, &[])
    }

    /// A character device.
    pub fn char_device(&mut self, name: &str) -> &mut Self {
        let mut h = header(tar::EntryType::Char, name, 0, 0o600);
        h.set_device_major(1).expect("major");
        h.set_device_minor(3).expect("minor");
        self.append(h, &[])
    }

    /// A whiteout for `dir/name` (`dir/.wh.name`).
    pub fn whiteout(&mut self, path: &str) -> &mut Self {
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        let wh = if dir.is_empty() { format!(".wh.{name}") } else { format!("{dir}/.wh.{name}") };
        self.file(&wh, &[])
    }

    /// An opaque marker for `dir` (`dir/.wh..wh..opq`).
    pub fn opaque(&mut self, dir: &str) -> &mut Self {
        self.file(&format!("{dir}/.wh..wh..opq"), &[])
    }

    /// The uncompressed tar bytes.
    pub fn tar_bytes(&mut self) -> Vec<u8> {
        let b = std::mem::replace(&mut self.tar, tar::Builder::new(Vec::new()));
        b.into_inner().expect("finish tar")
    }

    /// The layer blob, compressed as asked.
    pub fn build(&mut self, c: Compress) -> Blob {
        let tar = self.tar_bytes();
        compress(&tar, c)
    }
}

/// Compresses a tar into a layer blob with the matching OCI media type.
pub fn compress(tar: &[u8], c: Compress) -> Blob {
    match c {
        Compress::None => Blob::new(media::TAR, tar.to_vec()),
        Compress::Gzip => Blob::new(media::TAR_GZIP, gzip(tar)),
        Compress::MultiGzip => {
            let mid = tar.len() / 3;
            let mut v = gzip(&tar[..mid]);
            v.extend(gzip(&tar[mid..2 * mid]));
            v.extend(gzip(&tar[2 * mid..]));
            Blob::new(media::TAR_GZIP, v)
        }
        Compress::Zstd => Blob::new(media::TAR_ZSTD, zstd::encode_all(tar, 3).expect("zstd")),
    }
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).expect("gzip");
    e.finish().expect("gzip")
}

struct PatternReader {
    left: u64,
    state: u32,
}

impl std::io::Read for PatternReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = (self.left.min(buf.len() as u64)) as usize;
        for b in &mut buf[..n] {
            // xorshift: incompressible enough to make real-sized blobs.
            self.state ^= self.state << 13;
            self.state ^= self.state >> 17;
            self.state ^= self.state << 5;
            *b = self.state as u8;
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// An image: config, layers (bottom first) and the layer descriptors the manifest lists
/// (editable, to make lying manifests).
#[derive(Debug, Clone)]
pub struct Image {
    /// Config blob.
    pub config: Blob,
    /// Layer blobs, bottom first.
    pub layers: Vec<Blob>,
    /// Layer descriptors written into the manifest (default: those of `layers`).
    pub descriptors: Vec<Value>,
}

impl Image {
    /// An image for linux/amd64-like `os`/`arch` with these layers (bottom first).
    pub fn with_platform(layers: Vec<Blob>, os: &str, arch: &str) -> Self {
        let config = json!({
            "architecture": arch, "os": os,
            "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| l.digest.clone()).collect::<Vec<_>>()},
            "config": {}
        });
        let config = Blob::new(media::CONFIG, serde_json::to_vec(&config).expect("json"));
        let descriptors = layers.iter().map(Blob::descriptor).collect();
        Image { config, layers, descriptors }
    }

    /// An image for this machine's platform.
    pub fn new(layers: Vec<Blob>) -> Self {
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "powerpc64" => "ppc64le",
            a => a,
        };
        Self::with_platform(layers, "linux", arch)
    }

    /// The manifest JSON bytes.
    pub fn manifest(&self) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": media::MANIFEST,
            "config": self.config.descriptor(),
            "layers": self.descriptors,
        }))
        .expect("json")
    }

    /// `sha256:` digest of the manifest.
    pub fn digest(&self) -> String {
        format!("sha256:{}", sha256_hex(&self.manifest()))
    }

    /// Writes this image as an OCI image layout in `dir`, tagged `tag`.
    pub fn write_layout(&self, dir: &Path, tag: &str) {
        let blobs = dir.join("blobs/sha256");
        std::fs::create_dir_all(&blobs).expect("mkdir layout");
        let put = |data: &[u8]| {
            std::fs::write(blobs.join(sha256_hex(data)), data).expect("write blob");
        };
        for l in &self.layers {
            put(&l.data);
        }
        put(&self.config.data);
        let m = self.manifest();
        put(&m);
        std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).expect("oci-layout");
        let index = json!({"schemaVersion": 2, "mediaType": media::INDEX, "manifests": [{
            "mediaType": media::MANIFEST, "digest": self.digest(), "size": m.len(),
            "annotations": {"org.opencontainers.image.ref.name": tag}
        }]});
        std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).expect("json")).expect("index.json");
    }
}

/// An image index over `(os, arch, variant, image)` entries; returns the index JSON bytes.
pub fn index(entries: &[(&str, &str, Option<&str>, &Image)]) -> Vec<u8> {
    let manifests: Vec<Value> = entries
        .iter()
        .map(|(os, arch, variant, img)| {
            let mut p = json!({"os": os, "architecture": arch});
            if let Some(v) = variant {
                p["variant"] = json!(v);
            }
            json!({"mediaType": media::MANIFEST, "digest": img.digest(), "size": img.manifest().len(), "platform": p})
        })
        .collect();
    serde_json::to_vec(&json!({"schemaVersion": 2, "mediaType": media::INDEX, "manifests": manifests})).expect("json")
}
