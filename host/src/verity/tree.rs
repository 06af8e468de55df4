//! The dm-verity hash tree, format 1 (as `veritysetup format --no-superblock` writes it):
//! each block's digest is `sha256(salt || block)`; the digests of one level are packed
//! `2^floor(log2(hash_block_size / 32))` per hash block, each hash block zero-padded; the
//! hash area holds the levels top first (the level below the root at hash block 0, the
//! level over the data last); the root hash is the digest of the single top block, or of
//! the only data block when there is one.
//!
//! The tree is computed from the data alone, in one pass, keeping one hash block per
//! level: [`TreeBuilder`] takes the data partition's bytes in order (as the file streams
//! in, or read back), and [`Tree`] holds the root and a sha256 of each level's bytes,
//! which is compared with the same range of the hash partition ([`Tree::compare`]).

use sha2::{Digest, Sha256};

use super::Params;

/// Size of a sha256 digest.
const DIGEST: usize = 32;

/// Where one level of the tree sits in the hash area, in hash blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Level {
    /// First hash block of the level.
    pub(crate) start: u64,
    /// Hash blocks of the level.
    pub(crate) blocks: u64,
}

/// The shape of the tree for `data_blocks` data blocks: its levels, bottom (over the
/// data) first, and the hash area's size in hash blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// Levels, index 0 over the data.
    pub(crate) levels: Vec<Level>,
    /// Hash blocks of the whole hash area.
    pub(crate) hash_blocks: u64,
    /// log2 of the digests per hash block.
    per_block_bits: u32,
}

/// Most levels a tree may have (cryptsetup's `VERITY_MAX_LEVELS`).
const MAX_LEVELS: usize = 63;

impl Geometry {
    /// The tree shape for these parameters, or why it cannot exist.
    pub(crate) fn new(data_blocks: u64, hash_block_size: u32) -> Result<Geometry, String> {
        let per_block = u64::from(hash_block_size) / DIGEST as u64;
        if per_block < 2 {
            return Err(format!("hash_block_size {hash_block_size} holds fewer than two sha256 digests"));
        }
        if data_blocks == 0 {
            return Err("data_blocks is 0".to_string());
        }
        let bits = 63 - per_block.leading_zeros();
        let mut count = 0usize;
        while (bits as usize) * count < 64 && (data_blocks - 1) >> (bits as usize * count) != 0 {
            count += 1;
        }
        if count > MAX_LEVELS {
            return Err(format!("a tree over {data_blocks} data blocks would have more than {MAX_LEVELS} levels"));
        }
        // Level i holds ceil(data_blocks / 2^((i+1)·bits)) hash blocks.
        let mut sizes = Vec::with_capacity(count);
        for i in 0..count {
            let shift = (i as u32 + 1) * bits;
            let size = if shift >= 64 { 1 } else { data_blocks.div_ceil(1u64 << shift) };
            sizes.push(size);
        }
        let mut levels = vec![Level { start: 0, blocks: 0 }; count];
        let mut pos = 0u64;
        for i in (0..count).rev() {
            levels[i] = Level { start: pos, blocks: sizes[i] };
            pos = pos.checked_add(sizes[i]).ok_or("the hash area size overflows")?;
        }
        Ok(Geometry { levels, hash_blocks: pos, per_block_bits: bits })
    }
}

/// One level being built: its current hash block and a digest of the blocks emitted.
struct LevelState {
    block: Vec<u8>,
    filled: usize,
    emitted: u64,
    bytes: Sha256,
}

/// Computes the tree from the data partition's bytes, fed in order.
pub(crate) struct TreeBuilder {
    salt: Vec<u8>,
    salted: Sha256,
    data_block_size: usize,
    hash_block_size: usize,
    per_block: usize,
    data_blocks: u64,
    geometry: Geometry,
    levels: Vec<LevelState>,
    /// Data blocks hashed so far.
    done: u64,
    /// Bytes of an incomplete data block.
    partial: Vec<u8>,
    /// The digest of data block 0 (the root of a one-block tree).
    first: Option<[u8; DIGEST]>,
    /// The root, once the top level emitted its block.
    root: Option<[u8; DIGEST]>,
}

/// The computed tree: its root and, per level, the sha256 of the bytes the hash area
/// must hold there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tree {
    /// Root hash.
    pub(crate) root: [u8; DIGEST],
    /// sha256 of each level's hash blocks, level 0 first.
    pub(crate) level_digests: Vec<[u8; DIGEST]>,
    /// The tree's shape.
    pub(crate) geometry: Geometry,
    /// The parameters the tree was computed with (root hash aside).
    pub(crate) salt: Vec<u8>,
    /// Data block size it was computed with.
    pub(crate) data_block_size: u32,
    /// Hash block size it was computed with.
    pub(crate) hash_block_size: u32,
    /// Data blocks it covers.
    pub(crate) data_blocks: u64,
}

impl TreeBuilder {
    /// A builder for these parameters (their root hash is not used here).
    pub(crate) fn new(p: &Params) -> Result<TreeBuilder, String> {
        let geometry = Geometry::new(p.data_blocks, p.hash_block_size)?;
        let hash_block_size = p.hash_block_size as usize;
        let per_block = 1usize << geometry.per_block_bits;
        let mut salted = Sha256::new();
        salted.update(&p.salt);
        let levels = (0..geometry.levels.len())
            .map(|_| LevelState { block: vec![0u8; hash_block_size], filled: 0, emitted: 0, bytes: Sha256::new() })
            .collect();
        Ok(TreeBuilder {
            salt: p.salt.clone(),
            salted,
            data_block_size: p.data_block_size as usize,
            hash_block_size,
            per_block,
            data_blocks: p.data_blocks,
            geometry,
            levels,
            done: 0,
            partial: Vec::new(),
            first: None,
            root: None,
        })
    }

    /// Bytes of data the tree still needs.
    pub(crate) fn wanted(&self) -> u64 {
        (self.data_blocks - self.done) * self.data_block_size as u64 - self.partial.len() as u64
    }

    /// Takes the next bytes of the data partition; bytes past `data_blocks` blocks are ignored.
    pub(crate) fn update(&mut self, mut data: &[u8]) {
        let wanted = self.wanted();
        if (data.len() as u64) > wanted {
            data = &data[..wanted as usize];
        }
        let bs = self.data_block_size;
        if !self.partial.is_empty() {
            let take = (bs - self.partial.len()).min(data.len());
            self.partial.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.partial.len() == bs {
                let block = std::mem::take(&mut self.partial);
                self.data_block(&block);
            }
        }
        let mut blocks = data.chunks_exact(bs);
        for block in &mut blocks {
            self.data_block(block);
        }
        self.partial.extend_from_slice(blocks.remainder());
    }

    fn digest(&self, block: &[u8]) -> [u8; DIGEST] {
        let mut h = self.salted.clone();
        h.update(block);
        h.finalize().into()
    }

    fn data_block(&mut self, block: &[u8]) {
        let d = self.digest(block);
        if self.done == 0 {
            self.first = Some(d);
        }
        self.done += 1;
        if !self.levels.is_empty() {
            self.push(0, d);
        }
    }

    /// Appends a digest to level `i`, emitting its block when full.
    fn push(&mut self, i: usize, d: [u8; DIGEST]) {
        let l = &mut self.levels[i];
        l.block[l.filled * DIGEST..(l.filled + 1) * DIGEST].copy_from_slice(&d);
        l.filled += 1;
        if l.filled == self.per_block {
            self.emit(i);
        }
    }

    /// Emits level `i`'s current (zero-padded) block and hashes it into the level above.
    fn emit(&mut self, i: usize) {
        let l = &mut self.levels[i];
        l.block[l.filled * DIGEST..].fill(0);
        l.bytes.update(&l.block);
        l.emitted += 1;
        l.filled = 0;
        let block = std::mem::take(&mut l.block);
        let d = self.digest(&block);
        self.levels[i].block = block;
        if i + 1 < self.levels.len() {
            self.push(i + 1, d);
        } else {
            self.root = Some(d);
        }
    }

    /// The tree, once `data_blocks` blocks went in; otherwise how many bytes were missing.
    pub(crate) fn finish(mut self) -> Result<Tree, u64> {
        let missing = self.wanted();
        if missing > 0 {
            return Err(missing);
        }
        for i in 0..self.levels.len() {
            if self.levels[i].filled > 0 {
                self.emit(i);
            }
        }
        let root = if self.levels.is_empty() { self.first } else { self.root };
        // Unreachable for data_blocks ≥ 1: the top level always emits exactly one block.
        let root = root.ok_or(0u64)?;
        let level_digests = self.levels.into_iter().map(|l| l.bytes.finalize().into()).collect();
        Ok(Tree {
            root,
            level_digests,
            geometry: self.geometry,
            salt: self.salt,
            data_block_size: self.data_block_size as u32,
            hash_block_size: self.hash_block_size as u32,
            data_blocks: self.data_blocks,
        })
    }
}

impl Tree {
    /// Whether this tree was computed with these parameters (root hash aside).
    pub(crate) fn computed_with(&self, p: &Params) -> bool {
        self.salt == p.salt
            && self.data_block_size == p.data_block_size
            && self.hash_block_size == p.hash_block_size
            && self.data_blocks == p.data_blocks
    }

    /// Bytes of the hash area.
    pub(crate) fn hash_area_bytes(&self) -> u64 {
        self.geometry.hash_blocks * u64::from(self.hash_block_size)
    }

    /// Compares the hash area (`read(offset, buf)` reads the hash partition) level by
    /// level; the first level whose bytes differ, as a message.
    pub(crate) fn compare(
        &self,
        mut read: impl FnMut(u64, &mut [u8]) -> std::io::Result<()>,
    ) -> std::io::Result<Option<String>> {
        let hbs = u64::from(self.hash_block_size);
        let mut buf = vec![0u8; 256 * 1024];
        for (i, (level, want)) in self.geometry.levels.iter().zip(&self.level_digests).enumerate() {
            let mut h = Sha256::new();
            let mut off = level.start * hbs;
            let end = off + level.blocks * hbs;
            while off < end {
                let n = (end - off).min(buf.len() as u64) as usize;
                read(off, &mut buf[..n])?;
                h.update(&buf[..n]);
                off += n as u64;
            }
            let got: [u8; DIGEST] = h.finalize().into();
            if got != *want {
                return Ok(Some(format!(
                    "the hash area on partition 2 differs from the tree computed from partition 1 at level {i} \
                     (hash blocks {}..{} of {} bytes)",
                    level.start,
                    level.start + level.blocks,
                    self.hash_block_size
                )));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(data_blocks: u64, dbs: u32, hbs: u32) -> Params {
        Params { root_hash: [0; 32], salt: vec![0x00], data_blocks, data_block_size: dbs, hash_block_size: hbs }
    }

    #[test]
    fn geometry_matches_veritysetup() {
        // 600 blocks of 512 bytes, 1024-byte hash blocks (32 digests each): veritysetup
        // format writes 156 hash blocks in three levels of 150, 5 and 1.
        let g = Geometry::new(600 * 8, 1024).expect("geometry");
        assert_eq!(g.levels.iter().map(|l| l.blocks).collect::<Vec<_>>(), vec![150, 5, 1]);
        assert_eq!(g.levels.iter().map(|l| l.start).collect::<Vec<_>>(), vec![6, 1, 0]);
        assert_eq!(g.hash_blocks, 156);
        assert_eq!(Geometry::new(1, 4096).expect("one block").levels.len(), 0);
        assert_eq!(Geometry::new(128, 4096).expect("one level").hash_blocks, 1);
        assert_eq!(Geometry::new(129, 4096).expect("two levels").hash_blocks, 3);
    }

    #[test]
    fn feeding_in_pieces_gives_the_same_tree() {
        let data: Vec<u8> = (0..300 * 512u32).map(|i| (i * 7 % 251) as u8).collect();
        let p = params(300, 512, 1024);
        let mut whole = TreeBuilder::new(&p).expect("builder");
        whole.update(&data);
        let whole = whole.finish().expect("tree");
        let mut pieces = TreeBuilder::new(&p).expect("builder");
        for c in data.chunks(333) {
            pieces.update(c);
        }
        pieces.update(b"beyond data_blocks: ignored");
        assert_eq!(pieces.finish().expect("tree"), whole);
        let mut short = TreeBuilder::new(&p).expect("builder");
        short.update(&data[..1000]);
        assert_eq!(short.finish().expect_err("short"), 300 * 512 - 1000);
    }
}
