//! A streaming tar reader with bounded memory: headers are parsed with the `tar` crate's
//! raw header API, and every extension record (GNU long name / long link, PAX) is size
//! checked *before* it is read. The `tar` crate's own iterator reads those records whole,
//! whatever their size, so it is not used here.
//!
//! Memory held at any time: one 512-byte header, at most one pending long name, long link
//! and PAX record (each at most [`MAX_EXT_RECORD`] bytes). Entry data is never buffered:
//! the caller streams it through [`TarStream::data`] or it is skipped.

use std::io::{ErrorKind, Read};

use anyhow::{Context, Result, bail};

/// Longest entry path or link target accepted, in bytes (Linux `PATH_MAX`).
pub use kata_addons_facts::MAX_PATH;

/// Largest GNU long-name / long-link or PAX extended header record accepted, in bytes.
pub const MAX_EXT_RECORD: u64 = 64 * 1024;

const BLOCK: usize = 512;

/// The type of a tar entry, as far as extraction cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A regular file (`0`, `\0`, `7`).
    Regular,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// A hard link.
    Hardlink,
    /// A character device.
    Char,
    /// A block device.
    Block,
    /// A fifo.
    Fifo,
    /// A sparse file, in any of its encodings (GNU `S`, PAX 0.0, 0.1, 1.0).
    Sparse,
    /// Any other type byte.
    Other(u8),
}

/// One tar entry (extension headers already applied).
#[derive(Debug, Clone)]
pub struct Entry {
    /// The path as stored (long name / PAX `path` applied), at most [`MAX_PATH`] bytes.
    pub path: Vec<u8>,
    /// Link target for symlinks and hardlinks, at most [`MAX_PATH`] bytes.
    pub link: Option<Vec<u8>>,
    /// The entry type.
    pub kind: Kind,
    /// Bytes of data that follow the header in the archive.
    pub size: u64,
}

/// Reads tar entries one by one from a stream of (decompressed) tar bytes.
pub struct TarStream<R: Read> {
    r: R,
    /// Data bytes of the current entry not yet read.
    left: u64,
    /// Padding after the current entry's data.
    pad: u64,
    done: bool,
}

/// Fills `buf` completely; `Ok(false)` on a clean end of stream before the first byte.
fn read_block<R: Read>(r: &mut R, buf: &mut [u8]) -> Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => bail!("the tar stream ends inside a header"),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("reading the tar stream"),
        }
    }
    Ok(true)
}

fn skip<R: Read>(r: &mut R, n: u64) -> Result<()> {
    let copied = std::io::copy(&mut r.take(n), &mut std::io::sink()).context("reading the tar stream")?;
    if copied != n {
        bail!("the tar stream ends inside an entry");
    }
    Ok(())
}

fn padding(size: u64) -> u64 {
    (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64
}

fn checksum_ok(block: &[u8; BLOCK]) -> bool {
    let Ok(stored) = tar::Header::from_byte_slice(block).cksum() else { return false };
    let sum: u32 =
        block.iter().enumerate().map(|(i, b)| if (148..156).contains(&i) { 32 } else { u32::from(*b) }).sum();
    sum == stored
}

/// Text of a GNU long name / long link record: up to the first NUL.
fn record_text(mut data: Vec<u8>) -> Vec<u8> {
    if let Some(i) = data.iter().position(|b| *b == 0) {
        data.truncate(i);
    }
    data
}

/// What a PAX extended header says that matters here.
#[derive(Debug, Default)]
struct Pax {
    path: Option<Vec<u8>>,
    linkpath: Option<Vec<u8>>,
    size: Option<u64>,
    sparse: bool,
    sparse_name: Option<Vec<u8>>,
}

/// Parses PAX records `"<len> <key>=<value>\n"`.
fn parse_pax(data: &[u8]) -> Result<Pax> {
    let mut pax = Pax::default();
    let mut rest = data;
    while !rest.is_empty() {
        if rest.iter().all(|b| *b == 0) {
            break;
        }
        let sp = rest.iter().position(|b| *b == b' ').context("malformed PAX record (no length)")?;
        let len: usize = std::str::from_utf8(&rest[..sp])
            .ok()
            .and_then(|s| s.parse().ok())
            .context("malformed PAX record (bad length)")?;
        if len <= sp + 1 || len > rest.len() || rest[len - 1] != b'\n' {
            bail!("malformed PAX record (length {len} does not fit)");
        }
        let rec = &rest[sp + 1..len - 1];
        let eq = rec.iter().position(|b| *b == b'=').context("malformed PAX record (no `=`)")?;
        let (key, value) = (&rec[..eq], &rec[eq + 1..]);
        match key {
            b"path" => pax.path = Some(value.to_vec()),
            b"linkpath" => pax.linkpath = Some(value.to_vec()),
            b"size" => {
                let s = std::str::from_utf8(value).ok().and_then(|s| s.parse().ok());
                pax.size = Some(s.context("malformed PAX size record")?);
            }
            b"GNU.sparse.name" => {
                pax.sparse = true;
                pax.sparse_name = Some(value.to_vec());
            }
            k if k.starts_with(b"GNU.sparse.") => pax.sparse = true,
            _ => {}
        }
        rest = &rest[len..];
    }
    Ok(pax)
}

/// GNU long names and PAX records read before the header they apply to.
#[derive(Default)]
struct Extensions {
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
    pax: Option<Pax>,
}

/// The entry kind of a (non-PAX-sparse) header's type byte.
fn kind_of(type_byte: u8) -> Kind {
    match type_byte {
        b'0' | b'\0' | b'7' => Kind::Regular,
        b'5' => Kind::Dir,
        b'2' => Kind::Symlink,
        b'1' => Kind::Hardlink,
        b'3' => Kind::Char,
        b'4' => Kind::Block,
        b'6' => Kind::Fifo,
        b'S' => Kind::Sparse,
        other => Kind::Other(other),
    }
}

fn check_path(what: &str, p: &[u8]) -> Result<()> {
    if p.len() > MAX_PATH {
        bail!(
            "a tar entry {what} is {} bytes long, more than the {MAX_PATH} byte limit: {}…",
            p.len(),
            String::from_utf8_lossy(&p[..64])
        );
    }
    Ok(())
}

impl<R: Read> TarStream<R> {
    /// A reader over a tar stream.
    pub fn new(r: R) -> Self {
        TarStream { r, left: 0, pad: 0, done: false }
    }

    /// Reads the rest of the current entry's data (all of it must be there) and its
    /// padding. A stream that ends inside the padding of a complete entry has ended, as Go's
    /// archive/tar (containers/storage, umoci) reads it: `umoci insert` writes such layers.
    fn finish_entry(&mut self) -> Result<()> {
        let (left, pad) = (self.left, self.pad);
        self.left = 0;
        self.pad = 0;
        skip(&mut self.r, left)?;
        let copied =
            std::io::copy(&mut (&mut self.r).take(pad), &mut std::io::sink()).context("reading the tar stream")?;
        if copied < pad {
            self.done = true;
        }
        Ok(())
    }

    /// Reads an extension record of `size` bytes (refused above [`MAX_EXT_RECORD`]).
    fn read_record(&mut self, what: &str, size: u64) -> Result<Vec<u8>> {
        if size > MAX_EXT_RECORD {
            bail!("a tar {what} record is {size} bytes, more than the {MAX_EXT_RECORD} byte limit");
        }
        let mut data = vec![0u8; size as usize];
        self.r.read_exact(&mut data).with_context(|| format!("reading a tar {what} record"))?;
        skip(&mut self.r, padding(size))?;
        Ok(data)
    }

    /// The next entry, or `None` at the end of the archive. Unread data of the previous
    /// entry is skipped.
    pub fn next_entry(&mut self) -> Result<Option<Entry>> {
        if self.done {
            return Ok(None);
        }
        self.finish_entry()?;
        if self.done {
            return Ok(None);
        }
        let mut ext = Extensions::default();
        let mut block = [0u8; BLOCK];
        loop {
            if !read_block(&mut self.r, &mut block)? {
                // No end-of-archive marker: accepted, as GNU tar does (with a warning).
                self.done = true;
                return Ok(None);
            }
            if block.iter().all(|b| *b == 0) {
                self.done = true;
                return Ok(None);
            }
            if !checksum_ok(&block) {
                bail!("malformed tar header (bad checksum)");
            }
            let header_size =
                tar::Header::from_byte_slice(&block).entry_size().context("malformed tar header (size)")?;
            if !self.read_extension(block[156], header_size, &mut ext)? {
                return self.entry(&block, header_size, ext).map(Some);
            }
        }
    }

    /// Reads the record of an extension header (GNU long name or link, PAX) of type
    /// `type_byte` into `ext`; `false` when the header is not one (an entry's own).
    fn read_extension(&mut self, type_byte: u8, header_size: u64, ext: &mut Extensions) -> Result<bool> {
        match type_byte {
            b'L' => {
                let v = record_text(self.read_record("GNU long name", header_size)?);
                check_path("path", &v)?;
                ext.long_name = Some(v);
            }
            b'K' => {
                let v = record_text(self.read_record("GNU long link", header_size)?);
                check_path("link target", &v)?;
                ext.long_link = Some(v);
            }
            b'x' | b'X' => {
                let data = self.read_record("PAX extended header", header_size)?;
                ext.pax = Some(parse_pax(&data)?);
            }
            b'g' => {
                // Global PAX header: nothing in it changes what is extracted here.
                let _ = self.read_record("PAX global header", header_size)?;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The entry of header `block` (of size field `header_size`) with the extensions read
    /// before it; its data is what [`Self::data`] reads next.
    fn entry(&mut self, block: &[u8; BLOCK], header_size: u64, ext: Extensions) -> Result<Entry> {
        let h = tar::Header::from_byte_slice(block);
        let type_byte = block[156];
        let pax = ext.pax.unwrap_or_default();
        let path = match (&pax.sparse_name, pax.path, ext.long_name) {
            (Some(n), _, _) => n.clone(),
            (None, Some(p), _) => p,
            (None, None, Some(l)) => l,
            (None, None, None) => h.path_bytes().into_owned(),
        };
        check_path("path", &path)?;
        let link = match (pax.linkpath, ext.long_link) {
            (Some(l), _) => Some(l),
            (None, Some(l)) => Some(l),
            (None, None) => h.link_name_bytes().map(|c| c.into_owned()),
        };
        if let Some(l) = &link {
            check_path("link target", l)?;
        }
        if type_byte == b'S' {
            self.skip_sparse_map(block)?;
        }
        let size = pax.size.unwrap_or(header_size);
        if size.checked_add(padding(size)).is_none() {
            // Data plus padding past u64::MAX: no stream holds it (and skipping it
            // would overflow).
            bail!("malformed tar header (size {size} is out of range)");
        }
        let kind = if pax.sparse { Kind::Sparse } else { kind_of(type_byte) };
        // Only regular files and unknown types carry data; the rest must be skipped
        // by their declared size all the same.
        self.left = size;
        self.pad = padding(size);
        Ok(Entry { path, link, kind, size })
    }

    /// Old GNU sparse: extension blocks of the sparse map follow the header `block`,
    /// outside the size field, while the `isextended` byte is set.
    fn skip_sparse_map(&mut self, block: &[u8; BLOCK]) -> Result<()> {
        let mut extended = block[482] != 0;
        let mut ext = [0u8; BLOCK];
        while extended {
            if !read_block(&mut self.r, &mut ext)? {
                bail!("the tar stream ends inside a sparse header");
            }
            extended = ext[504] != 0;
        }
        Ok(())
    }

    /// The current entry's data (reads at most what is left of it).
    pub fn data(&mut self) -> EntryData<'_, R> {
        EntryData { s: self }
    }

    /// After the end-of-archive marker: the rest of the stream, for draining.
    pub fn into_inner(self) -> R {
        self.r
    }
}

/// A `Read` over the current entry's data.
pub struct EntryData<'a, R: Read> {
    s: &'a mut TarStream<R>,
}

impl<R: Read> Read for EntryData<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.s.left == 0 {
            return Ok(0);
        }
        let want = buf.len().min(usize::try_from(self.s.left).unwrap_or(usize::MAX));
        let n = self.s.r.read(&mut buf[..want])?;
        if n == 0 {
            return Err(std::io::Error::new(ErrorKind::UnexpectedEof, "the tar stream ends inside an entry"));
        }
        self.s.left -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One regular file `f` of `len` bytes, its data cut to `data` bytes and followed by
    /// `pad` bytes of padding, with no end-of-archive blocks (what `umoci insert` writes
    /// with data = len).
    fn unterminated(len: u64, data: usize, pad: usize) -> Vec<u8> {
        let mut h = tar::Header::new_ustar();
        h.set_path("f").expect("path");
        h.set_size(len);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_cksum();
        let mut v = h.as_bytes().to_vec();
        v.extend(std::iter::repeat_n(7u8, data));
        v.extend(std::iter::repeat_n(0u8, pad));
        v
    }

    fn read_all(v: &[u8]) -> Result<Vec<(String, Vec<u8>)>> {
        let mut t = TarStream::new(v);
        let mut out = Vec::new();
        while let Some(e) = t.next_entry()? {
            let mut data = Vec::new();
            t.data().read_to_end(&mut data)?;
            out.push((String::from_utf8_lossy(&e.path).to_string(), data));
        }
        Ok(out)
    }

    #[test]
    fn a_stream_ending_in_the_padding_of_a_complete_entry_has_ended() {
        for pad in [0, 10, 412] {
            let got = read_all(&unterminated(100, 100, pad)).expect("accepted, as Go's archive/tar does");
            assert_eq!(got, vec![("f".to_string(), vec![7u8; 100])], "pad {pad}");
        }
        // Unread data skipped by next_entry, then the end.
        let v = unterminated(100, 100, 0);
        let mut t = TarStream::new(&v[..]);
        assert!(t.next_entry().expect("entry").is_some());
        assert!(t.next_entry().expect("end").is_none());
    }

    #[test]
    fn a_stream_ending_inside_entry_data_is_malformed() {
        let v = unterminated(100, 50, 0);
        assert!(read_all(&v).is_err());
        let mut t = TarStream::new(&v[..]);
        assert!(t.next_entry().expect("entry").is_some());
        let e = t.next_entry().expect_err("truncated data");
        assert!(format!("{e:#}").contains("ends inside an entry"), "{e:#}");
    }

    fn pax_record(key: &str, value: &str) -> String {
        let body = format!(" {key}={value}\n");
        let mut len = body.len() + 1;
        if format!("{len}{body}").len() != len {
            len += 1;
        }
        format!("{len}{body}")
    }

    #[test]
    fn pax_records_parse() {
        let data = format!("{}{}", pax_record("path", "a/b"), pax_record("GNU.sparse.major", "1"));
        let p = parse_pax(data.as_bytes()).expect("parses");
        assert_eq!(p.path.as_deref(), Some(&b"a/b"[..]));
        assert!(p.sparse);
        assert!(parse_pax(b"99 path=x\n").is_err());
        assert!(parse_pax(b"x path=x\n").is_err());
    }

    /// Found by tests/tests/fuzz.rs: a PAX `size` of u64::MAX overflowed the skip
    /// arithmetic (a panic in debug builds, a wrapped skip in release builds).
    #[test]
    fn sizes_near_u64_max_are_malformed() {
        let mut tar = Vec::new();
        let rec = format!("29 size={}\n", u64::MAX);
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::XHeader);
        h.set_size(rec.len() as u64);
        h.set_cksum();
        tar.extend_from_slice(h.as_bytes());
        tar.extend_from_slice(rec.as_bytes());
        tar.resize(1024, 0);
        let mut f = tar::Header::new_gnu();
        f.set_path("f").expect("path");
        f.set_size(3);
        f.set_cksum();
        tar.extend_from_slice(f.as_bytes());
        tar.extend_from_slice(&[b'x'; 512]);
        let mut s = TarStream::new(tar.as_slice());
        let e = s.next_entry().expect_err("refused");
        assert!(format!("{e:#}").contains("out of range"), "{e:#}");
    }

    #[test]
    fn long_records_are_refused_before_reading() {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::GNULongName);
        h.set_size(1 << 40);
        h.set_cksum();
        let mut s = TarStream::new(h.as_bytes().as_slice());
        let e = s.next_entry().expect_err("refused");
        assert!(format!("{e:#}").contains("GNU long name record is 1099511627776 bytes"), "{e:#}");
    }
}
