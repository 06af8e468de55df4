//! The host's SHA-256 of data: layer blobs, extracted files, manifests, installed files.
//!
//! aws-lc's digest (through `aws-lc-rs`), the library already linked for TLS: its
//! assembly uses SHA-NI where the CPU has it, the code `openssl speed -evp sha256`
//! measures. The blob digest is on the critical path of an install from a big layer, so
//! every hot-path hash goes through here (BENCHMARKS.md "SHA-256 and inflate
//! throughput", `cargo bench -p kata-addons --bench throughput`, compares it with sha2).

/// A running SHA-256.
pub struct Sha256(aws_lc_rs::digest::Context);

impl Default for Sha256 {
    fn default() -> Self {
        Self::new()
    }
}

impl Sha256 {
    /// An empty hash.
    pub fn new() -> Self {
        Sha256(aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256))
    }

    /// Adds `data`.
    pub fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }

    /// The digest as 64 lowercase hex digits.
    pub fn finish_hex(self) -> String {
        hex::encode(self.0.finish())
    }
}

/// SHA-256 of `data` as 64 lowercase hex digits.
pub(crate) fn sha256_hex(data: &[u8]) -> String {
    hex::encode(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, data))
}

/// SHA-256 of `data` as an OCI digest, `sha256:` + 64 lowercase hex digits.
pub(crate) fn sha256_digest(data: &[u8]) -> String {
    format!("sha256:{}", sha256_hex(data))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::Digest;

    /// The same digests as the RustCrypto implementation, for every split of the input.
    #[test]
    fn agrees_with_sha2() {
        let data: Vec<u8> = (0..200_003u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for len in [0usize, 1, 55, 56, 63, 64, 65, 4096, 200_003] {
            let d = &data[..len];
            let want = hex::encode(sha2::Sha256::digest(d));
            assert_eq!(sha256_hex(d), want, "one shot, {len} bytes");
            let mut h = Sha256::new();
            for c in d.chunks(977) {
                h.update(c);
            }
            assert_eq!(h.finish_hex(), want, "chunked, {len} bytes");
        }
        assert_eq!(sha256_digest(b"abc"), "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
