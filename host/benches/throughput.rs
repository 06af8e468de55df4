//! Throughput of the per-byte stages of an install (BENCHMARKS.md, "SHA-256 and inflate
//! throughput"): SHA-256 by aws-lc-rs (what `kata_addons::hash` uses) and by
//! sha2 0.11 (SHA-NI intrinsics, detected at run time), and gzip inflate by flate2 +
//! zlib-rs (what the layer walker uses, CRC-32 included) of incompressible data as the
//! bench/compare images hold and of compressible data.
//!
//! `cargo bench -p kata-addons --bench throughput -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::io::{Read, Write};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};

/// Bytes per measured iteration.
const LEN: usize = 32 << 20;
/// Update size: the HTTP chunks and the walker's copy buffer are up to 64 KiB.
const CHUNK: usize = 64 << 10;

/// `n` bytes from a xorshift generator (incompressible).
fn noise(n: usize) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(n);
    v
}

/// `n` bytes of words from a small vocabulary (compresses about 3×, as text does).
fn text(n: usize) -> Vec<u8> {
    let words = ["kernel ", "initrd ", "confidential ", "guest ", "0x7f3a ", "sha256 ", "layer\n", "qemu "];
    let r = noise(n);
    let mut v = Vec::with_capacity(n + 16);
    let mut i = 0;
    while v.len() < n {
        v.extend_from_slice(words[(r[i % n] & 7) as usize].as_bytes());
        i += 1;
    }
    v.truncate(n);
    v
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(6));
    e.write_all(data).expect("gzip");
    e.finish().expect("gzip")
}

fn sha256(c: &mut Criterion) {
    let data = noise(LEN);
    let mut g = c.benchmark_group("sha256");
    g.throughput(Throughput::Bytes(LEN as u64));
    g.sample_size(20);
    // "32 MiB": every byte comes from memory (a blob as large as the cache or larger);
    // "hot 64 KiB": one chunk hashed over and over from the cache, as `openssl speed` does
    // and as a chunk just received from the socket is.
    for (name, hot) in [("32 MiB", false), ("hot 64 KiB", true)] {
        let chunks = || -> Box<dyn Iterator<Item = &[u8]>> {
            if hot { Box::new(std::iter::repeat_n(&data[..CHUNK], LEN / CHUNK)) } else { Box::new(data.chunks(CHUNK)) }
        };
        g.bench_function(format!("aws-lc-rs {name}"), |b| {
            b.iter(|| {
                let mut h = kata_addons::hash::Sha256::new();
                for ch in chunks() {
                    h.update(ch);
                }
                black_box(h.finish_hex())
            })
        });
        g.bench_function(format!("sha2 {name}"), |b| {
            use sha2::Digest;
            b.iter(|| {
                let mut h = sha2::Sha256::new();
                for ch in chunks() {
                    h.update(ch);
                }
                black_box(h.finalize())
            })
        });
    }
    g.finish();
}

fn inflate(c: &mut Criterion) {
    let mut g = c.benchmark_group("inflate");
    g.sample_size(20);
    for (name, plain) in [("gzip-6 noise", noise(LEN)), ("gzip-6 text", text(LEN))] {
        let z = gzip(&plain);
        // Throughput in compressed bytes: what a layer's size and the blob digest count.
        g.throughput(Throughput::Bytes(z.len() as u64));
        let mut buf = vec![0u8; CHUNK];
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut d = flate2::read::MultiGzDecoder::new(z.as_slice());
                let mut n = 0usize;
                loop {
                    let k = d.read(&mut buf).expect("inflate");
                    if k == 0 {
                        break;
                    }
                    n += k;
                }
                assert_eq!(n, plain.len());
                black_box(n)
            })
        });
    }
    g.finish();
}

criterion_group!(benches, sha256, inflate);
criterion_main!(benches);
