//! The tree computed while an image streams in, so that a large image is not read twice:
//! the first bytes are held until the partition table can be read from them, then the
//! data partition's bytes go through the [`TreeBuilder`] as they pass. Verification later
//! re-reads the partition table from the written file and uses this tree only when
//! partition 1 and the parameters are the same; otherwise it reads partition 1 again.

use super::Params;
use super::partition::{self, Part};
use super::tree::{Tree, TreeBuilder};

/// Bytes held before the partition table is read (a GPT's header and its 128 entries of
/// 128 bytes end at 17 KiB with 512-byte sectors).
const PREFIX: usize = 64 * 1024;

enum State {
    /// Holding the first bytes.
    Prefix(Vec<u8>),
    /// Feeding partition 1 (from byte `p1.start`) to the builder.
    Data { p1: Part, builder: Box<TreeBuilder> },
    /// The layout is not one this can follow; verification reads the file.
    Off,
}

/// Computes the dm-verity tree of partition 1 from the bytes of an image as they pass.
pub struct Stream {
    params: Params,
    state: State,
    /// Bytes seen so far.
    offset: u64,
}

/// A tree computed while streaming, and the partition it was computed over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Streamed {
    pub(crate) p1: Part,
    pub(crate) tree: Tree,
}

impl Stream {
    /// Starts a stream for an image that must verify against `params`.
    pub fn new(params: Params) -> Stream {
        Stream { params, state: State::Prefix(Vec::with_capacity(PREFIX)), offset: 0 }
    }

    /// Takes the next bytes of the image.
    pub fn update(&mut self, mut data: &[u8]) {
        if let State::Prefix(buf) = &mut self.state {
            let take = (PREFIX - buf.len()).min(data.len());
            buf.extend_from_slice(&data[..take]);
            data = &data[take..];
            if buf.len() < PREFIX {
                self.offset += take as u64;
                return;
            }
            let prefix = std::mem::take(buf);
            self.start(&prefix);
            self.offset = PREFIX as u64;
        }
        if let State::Data { p1, builder } = &mut self.state {
            let here = self.offset;
            let end = here + data.len() as u64;
            if end > p1.start && builder.wanted() > 0 {
                let from = p1.start.saturating_sub(here) as usize;
                builder.update(&data[from..]);
            }
        }
        self.offset += data.len() as u64;
    }

    /// Reads the partition table from the held prefix and starts on partition 1.
    fn start(&mut self, prefix: &[u8]) {
        // The table may name partitions past the prefix; their bounds are checked later
        // against the written file, so only the layout is wanted here.
        let table = partition::read(&mut std::io::Cursor::new(prefix), u64::MAX);
        let (Ok(Some(table)), Ok(mut builder)) = (table, TreeBuilder::new(&self.params)) else {
            self.state = State::Off;
            return;
        };
        let Some(p1) = table.p1 else {
            self.state = State::Off;
            return;
        };
        if p1.start < prefix.len() as u64 {
            builder.update(&prefix[p1.start as usize..]);
        }
        self.state = State::Data { p1, builder: Box::new(builder) };
    }

    /// The tree, when the stream covered partition 1's `data_blocks` blocks.
    pub fn finish(self) -> Option<Streamed> {
        match self.state {
            State::Data { p1, builder } => builder.finish().ok().map(|tree| Streamed { p1, tree }),
            _ => None,
        }
    }
}
