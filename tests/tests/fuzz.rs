//! A seeded fuzz test (docs/design.md#limits). Thousands of generated layers (valid, wild
//! and mutated tar streams, plain/gzip/zstd, corrupted compressed streams) go through the
//! real extraction in process (`kata_addons::fetch::Pull::files` on an OCI layout) and a
//! sample through the real binary (`fetch`, `install`); thousands of generated ConfigMaps
//! and `ADDON_*` env sets go through the runner's parsing and the policy in process (wasm
//! and native guest side by side) and a sample through `kata-addons preview`.
//!
//! Asserted: no panic anywhere (a panic hook watches every thread), Ok or a clean error,
//! for valid images exactly the bytes a reference model of the layers says (the model is
//! a separate implementation: a filesystem the layers are applied to, as containerd does),
//! no temporary file left behind, the exit-code contract (0/1 for images; 0/2 for
//! configuration content, matching the in-process verdict), peak RSS bounded.
//!
//! Seeds: by default a fixed base seed per test (the same cases every run, as CI needs);
//! `KATA_ADDONS_FUZZ_SEED=random` explores new cases. Reproduce a failure: its message
//! names the case's seed; `KATA_ADDONS_FUZZ_SEED=<seed>` runs that case first.
//! Cases: by default a fixed number per test (the same work every run, whatever the load of
//! the machine); `KATA_ADDONS_FUZZ_CASES=<n>` sets another number, and
//! `KATA_ADDONS_FUZZ_SECS=<s>` runs instead as many cases as fit in `s` seconds (at least the
//! default number), for a longer search.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use kata_addons_tests::hostile::{RawTar, header_block, pad, pax_record};
use kata_addons_tests::image::{Blob, Image, media};
use kata_addons_tests::measure::run_measured;
use kata_addons_tests::{kata_addons_bin, sha256_hex, show};

// ---- seeds, time bounds, panics -----------------------------------------------------------

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// How many cases a fuzz run takes.
enum Bound {
    /// Exactly this many (the default, and `KATA_ADDONS_FUZZ_CASES`).
    Cases(u64),
    /// At least this many, then until the time is up (`KATA_ADDONS_FUZZ_SECS`).
    Time(u64, Duration),
}

/// One fuzz run: a base seed, how many cases, and when it started.
struct Run {
    name: &'static str,
    base: u64,
    bound: Bound,
    start: Instant,
}

impl Run {
    fn new(name: &'static str, default_cases: u64) -> Run {
        let base = match std::env::var("KATA_ADDONS_FUZZ_SEED") {
            // Exploration: a new seed each run (CI uses the fixed default, so that a
            // generator or model gap found by exploration cannot turn CI red at random).
            Ok(s) if s.trim() == "random" => {
                let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock");
                splitmix(t.as_nanos() as u64 ^ u64::from(std::process::id()) ^ name.len() as u64)
            }
            Ok(s) => {
                let s = s.trim();
                let v = match s.strip_prefix("0x") {
                    Some(h) => u64::from_str_radix(h, 16),
                    None => s.parse(),
                };
                v.expect("KATA_ADDONS_FUZZ_SEED: a decimal or 0x-hex u64")
            }
            // Default: a fixed seed per test, the same cases on every run.
            Err(_) => name.bytes().fold(0x6b61_7461_2d61_6464, |h, b| splitmix(h ^ u64::from(b))),
        };
        let env = |n: &str| std::env::var(n).ok().filter(|v| !v.trim().is_empty());
        let bound = match (env("KATA_ADDONS_FUZZ_CASES"), env("KATA_ADDONS_FUZZ_SECS")) {
            (Some(n), _) => Bound::Cases(n.trim().parse().expect("KATA_ADDONS_FUZZ_CASES: a number of cases")),
            (None, Some(s)) => Bound::Time(
                default_cases,
                Duration::from_secs_f64(s.trim().parse::<f64>().expect("KATA_ADDONS_FUZZ_SECS: seconds")),
            ),
            (None, None) => Bound::Cases(default_cases),
        };
        let what = match &bound {
            Bound::Cases(n) => format!("{n} cases (KATA_ADDONS_FUZZ_CASES)"),
            Bound::Time(n, t) => {
                format!("at least {n} cases, then until {} s (KATA_ADDONS_FUZZ_SECS)", t.as_secs_f64())
            }
        };
        eprintln!("fuzz {name}: base seed {base:#x} (KATA_ADDONS_FUZZ_SEED), {what}");
        watch_panics();
        Run { name, base, bound, start: Instant::now() }
    }

    /// The seed of case `i`: case 0 is the base seed itself, so a failing case's seed
    /// given as the base seed runs that case first.
    fn seed(&self, i: u64) -> u64 {
        if i == 0 { self.base } else { splitmix(self.base ^ splitmix(i)) }
    }

    /// Whether to run case `i`.
    fn more(&self, i: u64) -> bool {
        match self.bound {
            Bound::Cases(n) => i < n,
            Bound::Time(n, t) => i < n || self.start.elapsed() < t,
        }
    }

    /// Runs one case; any failure or panic (here or in a thread) names the seed.
    fn case(&self, i: u64, f: impl FnOnce(&mut fastrand::Rng) -> Result<(), String>) {
        let seed = self.seed(i);
        let mut rng = fastrand::Rng::with_seed(seed);
        let res = std::panic::catch_unwind(AssertUnwindSafe(|| f(&mut rng)));
        let panics = take_panics();
        let msg = match res {
            Ok(Ok(())) if panics.is_empty() => return,
            Ok(Ok(())) => format!("a thread panicked: {}", panics.join("\n")),
            Ok(Err(e)) => e,
            Err(p) => {
                let what =
                    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
                format!("the case panicked: {}", what.unwrap_or_default())
            }
        };
        let msg: String =
            if msg.len() > 6000 { format!("{}…", msg.chars().take(6000).collect::<String>()) } else { msg };
        panic!(
            "fuzz {} case {i} failed (seed {seed:#x}; rerun with KATA_ADDONS_FUZZ_SEED={seed:#x}):\n{msg}",
            self.name
        );
    }
}

static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Records every panic outside the test threads themselves (the extraction runs on
/// tokio's blocking threads, where a panic would otherwise become an ordinary "thread
/// failed" error); a test thread's own panics are caught by [`Run::case`].
fn watch_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let test_thread = std::thread::current().name().is_some_and(|n| n.starts_with("fuzz_"));
            if !test_thread && let Ok(mut p) = PANICS.lock() {
                p.push(info.to_string());
            }
            prev(info);
        }));
    });
}

fn take_panics() -> Vec<String> {
    PANICS.lock().map(|mut p| std::mem::take(&mut *p)).unwrap_or_default()
}

/// Resets this process's peak RSS (`VmHWM`) to its current RSS (Linux ≥ 4.0).
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// This process's peak RSS in MiB since the last reset.
fn peak_rss_mib() -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib: f64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// A scratch directory on tmpfs when there is one (fsync is free there).
fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(d) = tempfile::tempdir_in(shm)
    {
        return d;
    }
    tempfile::tempdir().expect("temp dir")
}

/// Peak RSS a `kata-addons` process may reach on any input here (the hostile-input budget).
const RSS_BUDGET_MIB: f64 = 64.0;

// ---- the reference model: a filesystem the layers are applied to --------------------------

/// A node of the model filesystem (hard links are regular files sharing content).
#[derive(Debug, Clone)]
enum M {
    Dir,
    File(Arc<Vec<u8>>),
    Symlink(String),
}

/// Normalised path ("a/b", no leading slash; "" is the root) -> node. Every ancestor of
/// a node is a `Dir` node.
type Tree = BTreeMap<String, M>;

fn under(p: &str, dir: &str) -> bool {
    dir.is_empty() || (p.len() > dir.len() && p.starts_with(dir) && p.as_bytes()[dir.len()] == b'/')
}

fn remove_subtree(t: &mut Tree, p: &str) {
    t.remove(p);
    let prefix = format!("{p}/");
    let below: Vec<String> =
        t.range(prefix.clone()..).take_while(|(k, _)| k.starts_with(&prefix)).map(|(k, _)| k.clone()).collect();
    for k in below {
        t.remove(&k);
    }
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() { name.to_string() } else { format!("{dir}/{name}") }
}

fn parent(p: &str) -> &str {
    p.rfind('/').map_or("", |i| &p[..i])
}

/// What the model says a wanted path is.
#[derive(Debug, Clone)]
enum R {
    /// A regular file with these bytes.
    File(Arc<Vec<u8>>),
    /// No regular file there (missing, a directory, a link loop…).
    NoFile,
    /// Resolution goes past the extraction's documented work caps (64 KiB of path
    /// lookups, 4096-byte paths): either outcome is right.
    Capped,
}

/// Where `/wanted` leads in the model, as a kernel would resolve it (symlinks inside the
/// image root, `..` stopping at the root, at most 40 symlinks, a trailing `/` only after a
/// directory).
fn model_resolve(t: &Tree, wanted: &str) -> R {
    let mut todo: Vec<String> = wanted.split('/').rev().map(str::to_string).collect();
    let mut cur: Vec<String> = Vec::new();
    let (mut hops, mut spent) = (0, 0usize);
    while let Some(c) = todo.pop() {
        match c.as_str() {
            "" | "." => continue,
            ".." => {
                cur.pop();
                continue;
            }
            _ => {}
        }
        cur.push(c);
        let p = cur.join("/");
        spent += p.len();
        if p.len() > 4096 || spent > 64 * 1024 {
            return R::Capped;
        }
        match t.get(&p) {
            None => return R::NoFile,
            Some(M::Dir) => {}
            Some(M::File(data)) => return if todo.is_empty() { R::File(data.clone()) } else { R::NoFile },
            Some(M::Symlink(target)) => {
                hops += 1;
                // An empty target resolves to nothing (ENOENT), as in the kernel.
                if hops > 40 || target.is_empty() {
                    return R::NoFile;
                }
                cur.pop();
                if target.starts_with('/') {
                    cur.clear();
                }
                todo.extend(target.split('/').rev().map(str::to_string));
            }
        }
    }
    R::NoFile
}

// ---- generated layers ---------------------------------------------------------------------

/// One tar entry to write.
#[derive(Debug, Clone)]
enum E {
    Dir(String),
    File(String, Arc<Vec<u8>>),
    Symlink(String, String),
    Hardlink(String, String),
    Whiteout(String),
    Opaque(String),
    /// Raw bytes (whole 512-byte blocks), written as they are.
    Raw(Vec<u8>),
}

const NAMES: &[&str] = &[
    "a",
    "b",
    "c",
    "d",
    "boot",
    "lib",
    "usr",
    "x",
    "vmlinuz",
    "initrd.img",
    "k",
    "ü",
    "日本語",
    "sp ace",
    "dot.ted",
    "-dash",
    "..a",
    "a..",
    "UPPER",
    "wh",
    "~tilde",
];

fn name(rng: &mut fastrand::Rng) -> String {
    match rng.u8(0..100) {
        0..88 => NAMES[rng.usize(0..NAMES.len())].to_string(),
        88..94 => (0..rng.usize(1..12)).map(|_| rng.alphanumeric()).collect(),
        _ => {
            let n = rng.usize(90..240);
            (0..n).map(|i| if i % 10 == 0 { 'L' } else { rng.alphanumeric() }).collect()
        }
    }
}

fn content(rng: &mut fastrand::Rng) -> Arc<Vec<u8>> {
    let v = match rng.u8(0..100) {
        0..10 => Vec::new(),
        10..60 => (0..rng.usize(1..600)).map(|_| rng.u8(..)).collect(),
        60..90 => {
            let n = rng.usize(600..16 << 10);
            let b = rng.u8(..);
            (0..n).map(|i| if i % 97 == 0 { rng.u8(..) } else { b }).collect()
        }
        90..99 => {
            let n = rng.usize(16 << 10..128 << 10);
            (0..n).map(|i| (i / 4096) as u8 ^ (i % 251) as u8).collect()
        }
        _ => {
            // Now and then a file over the tar stream's 1 MiB read chunks.
            let n = rng.usize(1 << 20..(1 << 20) + 100_000);
            vec![rng.u8(..); n]
        }
    };
    Arc::new(v)
}

/// State of the generator while it builds one layer.
struct LayerGen<'a> {
    rng: &'a mut fastrand::Rng,
    tree: &'a mut Tree,
    /// Wild mode: anything goes, the model is not checked.
    wild: bool,
    entries: Vec<E>,
    markers: Vec<E>,
    /// Paths whited out by this layer: nothing is created at or below them.
    dead: Vec<String>,
    /// Opaque directories and ancestors of whiteouts: not replaced in this layer.
    protected: HashSet<String>,
    /// Targets of this layer's hard links: not replaced after the link.
    link_targets: HashSet<String>,
    /// Files written by this layer (their current content is this layer's).
    files_here: Vec<String>,
    /// Every path this layer has an entry for: a path changes kind at most once per
    /// layer, and a directory with entries of this layer below it is not replaced (a tar
    /// writer diffing two trees writes one entry per path).
    emitted: HashSet<String>,
}

impl LayerGen<'_> {
    fn blocked(&self, p: &str) -> bool {
        self.dead.iter().any(|d| d == p || under(p, d))
    }

    fn replaceable(&self, p: &str) -> bool {
        !self.blocked(p) && !self.protected.contains(p) && !self.link_targets.contains(p)
    }

    fn protect_ancestors(&mut self, p: &str) {
        let mut q = parent(p);
        while !q.is_empty() {
            self.protected.insert(q.to_string());
            q = parent(q);
        }
    }

    fn pick<'b>(&mut self, v: &'b [String]) -> Option<&'b String> {
        if v.is_empty() { None } else { Some(&v[self.rng.usize(0..v.len())]) }
    }

    fn dirs(&self) -> Vec<String> {
        let mut v = vec![String::new()];
        v.extend(self.tree.iter().filter(|(k, n)| matches!(n, M::Dir) && !self.blocked(k)).map(|(k, _)| k.clone()));
        v
    }

    fn paths(&self) -> Vec<String> {
        self.tree.keys().filter(|k| !self.blocked(k)).cloned().collect()
    }

    /// Makes room for a new node at `p`: removes what is there (a dir with its subtree).
    fn clear(&mut self, p: &str) -> bool {
        if self.tree.contains_key(p) {
            if !self.replaceable(p) || self.emitted.iter().any(|e| e == p || under(e, p)) {
                return false;
            }
            remove_subtree(self.tree, p);
            self.files_here.retain(|f| f != p && !under(f, p));
        }
        true
    }

    fn new_path(&mut self) -> Option<String> {
        let dirs = self.dirs();
        let d = self.pick(&dirs)?.clone();
        let p = join(&d, &name(self.rng));
        // Paths stay well under the 4096-byte limit of tar entries.
        if self.blocked(&p) || p.len() > 1000 { None } else { Some(p) }
    }

    fn file_at(&mut self, p: String) {
        let rewrite = matches!(self.tree.get(&p), Some(M::File(_)))
            && self.files_here.contains(&p)
            && !self.link_targets.contains(&p);
        if !rewrite && !self.clear(&p) {
            return;
        }
        self.emitted.insert(p.clone());
        let c = content(self.rng);
        self.tree.insert(p.clone(), M::File(c.clone()));
        self.files_here.push(p.clone());
        self.entries.push(E::File(p, c));
    }

    fn dir_at(&mut self, p: String) {
        if !matches!(self.tree.get(&p), Some(M::Dir)) {
            if !self.clear(&p) {
                return;
            }
            self.tree.insert(p.clone(), M::Dir);
        }
        self.emitted.insert(p.clone());
        self.entries.push(E::Dir(p));
    }

    fn symlink_target(&mut self, p: &str) -> String {
        let paths = self.paths();
        let other = self.pick(&paths).cloned().unwrap_or_default();
        match self.rng.u8(0..100) {
            0..35 => format!("/{other}"),
            35..65 => {
                // Relative from the link's directory.
                let depth = parent(p).split('/').filter(|c| !c.is_empty()).count();
                format!("{}{other}", "../".repeat(depth))
            }
            65..75 => format!("/nonexistent/{}", name(self.rng)),
            75..80 => p.rsplit('/').next().unwrap_or("x").to_string(), // itself: a loop
            80..85 => format!("./{}", other.rsplit('/').next().unwrap_or("")),
            85..90 => format!("/../../{other}"),
            90..95 => format!("/{other}/"),
            _ => format!("/{}", other.replace('/', "//")),
        }
    }

    fn op(&mut self) {
        match self.rng.u8(0..100) {
            0..30 => {
                if let Some(p) = self.new_path() {
                    self.file_at(p);
                }
            }
            30..40 => {
                // A chain of new directories (entries sometimes left implicit), then a file.
                let Some(mut p) = self.new_path() else { return };
                for _ in 0..self.rng.usize(1..4) {
                    if self.tree.contains_key(&p) {
                        return;
                    }
                    self.tree.insert(p.clone(), M::Dir);
                    self.emitted.insert(p.clone());
                    if self.rng.u8(0..10) < 7 {
                        self.entries.push(E::Dir(p.clone()));
                    }
                    p = join(&p, &name(self.rng));
                }
                self.file_at(p);
            }
            40..50 => {
                let files: Vec<String> =
                    self.tree.iter().filter(|(_, n)| matches!(n, M::File(_))).map(|(k, _)| k.clone()).collect();
                if let Some(p) = self.pick(&files).cloned()
                    && self.replaceable(&p)
                {
                    self.file_at(p);
                }
            }
            50..60 => {
                if let Some(p) = self.new_path() {
                    self.dir_at(p);
                }
            }
            60..75 => {
                let p = if self.rng.bool() { self.new_path() } else { self.pick(&self.paths()).cloned() };
                if let Some(p) = p
                    && self.clear(&p)
                {
                    let t = self.symlink_target(&p);
                    self.tree.insert(p.clone(), M::Symlink(t.clone()));
                    self.emitted.insert(p.clone());
                    self.entries.push(E::Symlink(p, t));
                }
            }
            75..83 => {
                // A hard link to a file written earlier in this layer.
                let here = self.files_here.clone();
                let Some(target) = self.pick(&here).cloned() else { return };
                let Some(M::File(c)) = self.tree.get(&target).cloned() else { return };
                let Some(p) = self.new_path() else { return };
                if p == target || self.link_targets.contains(&p) || !self.clear(&p) {
                    return;
                }
                self.link_targets.insert(target.clone());
                self.tree.insert(p.clone(), M::File(c));
                self.emitted.insert(p.clone());
                self.files_here.push(p.clone());
                self.entries.push(E::Hardlink(p, target));
            }
            83..93 => {
                // Replace any node by another kind.
                let paths = self.paths();
                let Some(p) = self.pick(&paths).cloned() else { return };
                match self.rng.u8(0..3) {
                    0 => self.file_at(p),
                    // A directory entry over a directory merges with it (tar, containerd):
                    // dir_at clears only a node of another kind.
                    1 => self.dir_at(p),
                    _ => {
                        if self.clear(&p) {
                            let t = self.symlink_target(&p);
                            self.tree.insert(p.clone(), M::Symlink(t.clone()));
                            self.emitted.insert(p.clone());
                            self.entries.push(E::Symlink(p, t));
                        }
                    }
                }
            }
            93..97 => {
                // Noise the extraction must skip: a name that is not UTF-8, under a directory.
                let dirs = self.dirs();
                let d = self.pick(&dirs).cloned().unwrap_or_default();
                let mut n = if d.is_empty() { Vec::new() } else { format!("{d}/").into_bytes() };
                n.extend_from_slice(b"bad\xff\xfename");
                let mut t = RawTar::default();
                if n.len() <= 100 {
                    t.entry_raw(b'0', &n, b"", b"noise");
                } else {
                    t.long_record(b'L', &n).entry_raw(b'0', b"x", b"", b"noise");
                }
                self.entries.push(E::Raw(t.0));
            }
            _ => {
                // Emit an earlier directory entry of this layer again (same meaning).
                let again = self
                    .entries
                    .iter()
                    .rfind(|e| matches!(e, E::Dir(d) if matches!(self.tree.get(d), Some(M::Dir))))
                    .cloned();
                if let Some(e) = again {
                    self.entries.push(e);
                }
            }
        }
    }

    /// Wild operations: tar oddities the model does not describe.
    fn wild_op(&mut self) {
        let paths = self.paths();
        let p = self.pick(&paths).cloned().filter(|p| p.len() <= 80).unwrap_or_else(|| "w".into());
        let mut t = RawTar::default();
        match self.rng.u8(0..16) {
            0 => {
                t.entry(b'1', "wl", &p, b"");
                t.file(&p, b"later");
            }
            1 => {
                t.entry(b'1', &p, &p, b"");
            }
            2 => {
                t.entry(b'S', &p, "", &[7u8; 1024]);
            }
            3 => {
                t.pax(&[("GNU.sparse.size", "999999"), ("GNU.sparse.map", "0,5")]).file(&p, b"packed");
            }
            4 => {
                t.pax(&[("GNU.sparse.major", "1"), ("GNU.sparse.minor", "0"), ("GNU.sparse.name", &p)])
                    .file("sp", b"x");
            }
            5 => {
                t.entry([b'3', b'4', b'6', b'V', b'M', b'N', b'A', b'Z'][self.rng.usize(0..8)], &p, "", b"");
            }
            6 => {
                t.file(&format!("{p}/under"), b"under a file?");
            }
            7 => {
                t.entry(b'2', &p, "/../../../../etc/passwd", b"");
            }
            8 => {
                t.entry(b'2', &p, "../../../../../../../../..", b"");
            }
            9 => {
                let long = "q/".repeat(self.rng.usize(2040..2060)) + "f";
                t.long_name(&long).file("x", b"long");
            }
            10 => {
                t.pax(&[("path", &format!("{p}\u{0}nul")), ("size", "3")]).0.extend_from_slice(&{
                    let mut v = header_block(b'0', b"x", b"", 3, None).to_vec();
                    v.extend_from_slice(b"abc");
                    pad(&mut v);
                    v
                });
            }
            11 => {
                t.file(&format!("{}/.wh..wh..opq", p), b"").file(".wh.", b"").file(".wh..wh.meta", b"");
            }
            12 => {
                t.entry(b'1', "hl-dir", "", b"").entry(b'1', "hl-a", "hl-b", b"").entry(b'1', "hl-b", "hl-a", b"");
            }
            13 => {
                t.file(&format!("{p}/../../../{}", self.rng.alphanumeric()), b"dotdot");
            }
            14 => {
                t.pax(&[("size", &format!("{}", self.rng.u64(..)))]).file(&p, b"abc");
            }
            _ => {
                t.long_record(b'K', &vec![b'k'; 5000]).entry(b'2', &p, "", b"");
            }
        }
        self.entries.push(E::Raw(t.0));
    }
}

/// A generated image: tar streams (bottom first), the model tree after all layers, and
/// every data payload written (the weak oracle of wild images).
struct GenImage {
    tars: Vec<Vec<u8>>,
    tree: Tree,
    payloads: HashSet<Vec<u8>>,
}

fn gen_image(rng: &mut fastrand::Rng, wild: bool, max_ops: usize) -> GenImage {
    let n_layers = match rng.u8(0..10) {
        0..4 => 1,
        4..8 => rng.usize(2..4),
        _ => rng.usize(4..9),
    };
    let mut tree = Tree::new();
    let mut tars = Vec::new();
    let mut payloads = HashSet::new();
    payloads.insert(Vec::new());
    for l in 0..n_layers {
        let mut g = LayerGen {
            rng: &mut *rng,
            tree: &mut tree,
            wild,
            entries: Vec::new(),
            markers: Vec::new(),
            dead: Vec::new(),
            protected: HashSet::new(),
            link_targets: HashSet::new(),
            files_here: Vec::new(),
            emitted: HashSet::new(),
        };
        if l > 0 {
            let before: Vec<String> = g.tree.keys().cloned().collect();
            for _ in 0..g.rng.usize(0..3) {
                let Some(p) = g.pick(&before).cloned() else { break };
                if !g.tree.contains_key(&p) || g.blocked(&p) {
                    continue;
                }
                remove_subtree(g.tree, &p);
                g.markers.push(E::Whiteout(p.clone()));
                g.protect_ancestors(&p);
                g.dead.push(p);
            }
            if g.rng.u8(0..10) < 3 {
                let dirs: Vec<String> = g
                    .tree
                    .iter()
                    .filter(|(k, n)| matches!(n, M::Dir) && !g.blocked(k))
                    .map(|(k, _)| k.clone())
                    .collect();
                if let Some(d) = g.pick(&dirs).cloned() {
                    remove_subtree(g.tree, &d);
                    g.tree.insert(d.clone(), M::Dir);
                    g.emitted.insert(d.clone());
                    g.entries.push(E::Dir(d.clone()));
                    g.markers.push(E::Opaque(d.clone()));
                    g.protect_ancestors(&d);
                    g.protected.insert(d);
                }
            }
        }
        for _ in 0..g.rng.usize(1..=max_ops) {
            if g.wild && g.rng.u8(0..4) == 0 {
                g.wild_op();
            } else {
                g.op();
            }
        }
        let LayerGen { entries, markers, rng: r, .. } = g;
        let mut entries = entries;
        for m in markers {
            let i = r.usize(0..=entries.len());
            entries.insert(i, m);
        }
        for e in &entries {
            match e {
                E::File(_, c) => {
                    payloads.insert(c.as_ref().clone());
                }
                E::Raw(raw) => {
                    // Every data run of a raw entry, as the weak oracle of wild images.
                    for chunk in
                        [b"later".as_ref(), b"packed", b"under a file?", b"long", b"abc", b"dotdot", b"noise", b"x"]
                    {
                        if raw.windows(chunk.len()).any(|w| w == chunk) {
                            payloads.insert(chunk.to_vec());
                        }
                    }
                    payloads.insert([7u8; 1024].to_vec());
                }
                _ => {}
            }
        }
        tars.push(write_tar(r, &entries));
    }
    GenImage { tars, tree, payloads }
}

/// A spelling of normalised path `p` that normalises back to it.
fn spell(rng: &mut fastrand::Rng, p: &str, dir: bool) -> String {
    let mut s = match rng.u8(0..20) {
        0..12 => p.to_string(),
        12..15 => format!("./{p}"),
        15..17 => format!("/{p}"),
        17..18 => p.replace('/', "//"),
        _ => p.replace('/', "/./"),
    };
    if dir && rng.bool() {
        s.push('/');
    }
    s
}

/// Writes header(s) for an entry, encoding long names and link targets in one of the
/// ways tar allows: plain fields, a ustar prefix, GNU long name/link records, PAX records.
fn put_header(rng: &mut fastrand::Rng, t: &mut RawTar, typ: u8, name: &[u8], link: &[u8], size: u64) {
    let mut pax: Vec<u8> = Vec::new();
    let (mut hname, mut hlink): (Vec<u8>, Vec<u8>) = (name.to_vec(), link.to_vec());
    let mut prefix: Option<Vec<u8>> = None;
    if name.len() > 100 || rng.u8(0..10) == 0 {
        let split = name
            .iter()
            .enumerate()
            .filter(|(i, b)| **b == b'/' && *i <= 155 && name.len() - i - 1 <= 100 && name.len() - i > 1)
            .map(|(i, _)| i)
            .next_back();
        match (rng.u8(0..3), split) {
            (0, Some(i)) => {
                prefix = Some(name[..i].to_vec());
                hname = name[i + 1..].to_vec();
            }
            (1, _) => {
                pax.extend(pax_record("path", name));
                hname = b"pax-name".to_vec();
            }
            _ => {
                t.long_record(b'L', name);
                hname = b"././@LongLink".to_vec();
            }
        }
        if hname.len() > 100 {
            t.long_record(b'L', name);
            hname = b"././@LongLink".to_vec();
        }
    }
    if link.len() > 100 || (!link.is_empty() && rng.u8(0..10) == 0) {
        if rng.bool() {
            pax.extend(pax_record("linkpath", link));
        } else {
            t.long_record(b'K', link);
        }
        hlink = b"link".to_vec();
    }
    let mut hsize = size;
    if typ == b'0' && rng.u8(0..15) == 0 {
        pax.extend(pax_record("size", size.to_string().as_bytes()));
        hsize = 0;
    }
    if !pax.is_empty() {
        t.pax_raw(&pax);
    }
    t.0.extend_from_slice(&header_block(typ, &hname, &hlink, hsize, prefix.as_deref()));
}

fn write_tar(rng: &mut fastrand::Rng, entries: &[E]) -> Vec<u8> {
    let mut t = RawTar::default();
    for e in entries {
        match e {
            E::Dir(p) => {
                let n = spell(rng, p, true);
                put_header(rng, &mut t, b'5', n.as_bytes(), b"", 0);
            }
            E::File(p, c) => {
                let n = spell(rng, p, false);
                let typ = [b'0', b'0', b'0', b'\0', b'7'][rng.usize(0..5)];
                put_header(rng, &mut t, typ, n.as_bytes(), b"", c.len() as u64);
                t.0.extend_from_slice(c);
                pad(&mut t.0);
            }
            E::Symlink(p, target) => {
                let n = spell(rng, p, false);
                put_header(rng, &mut t, b'2', n.as_bytes(), target.as_bytes(), 0);
            }
            E::Hardlink(p, target) => {
                let n = spell(rng, p, false);
                let l = spell(rng, target, false);
                put_header(rng, &mut t, b'1', n.as_bytes(), l.as_bytes(), 0);
            }
            E::Whiteout(p) => {
                let n = join(parent(p), &format!(".wh.{}", p.rsplit('/').next().unwrap_or(p)));
                put_header(rng, &mut t, b'0', n.as_bytes(), b"", 0);
            }
            E::Opaque(d) => {
                let n = join(d, ".wh..wh..opq");
                put_header(rng, &mut t, b'0', n.as_bytes(), b"", 0);
            }
            E::Raw(raw) => t.0.extend_from_slice(raw),
        }
    }
    // End of archive: two zero blocks, one, none, or the marker then garbage.
    match rng.u8(0..20) {
        0 => {}
        1 => t.0.extend_from_slice(&[0u8; 512]),
        2 => {
            t.0.extend_from_slice(&[0u8; 1024]);
            t.0.extend((0..rng.usize(1..2000)).map(|_| rng.u8(..)));
        }
        _ => t.0.extend_from_slice(&[0u8; 1024]),
    }
    t.0
}

fn gzip_level(data: &[u8], level: u32) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level));
    e.write_all(data).expect("gzip");
    e.finish().expect("gzip")
}

/// Splits `data` at up to `n` random points.
fn pieces<'d>(rng: &mut fastrand::Rng, data: &'d [u8], n: usize) -> Vec<&'d [u8]> {
    let mut cuts: Vec<usize> = (0..n).map(|_| rng.usize(0..=data.len())).collect();
    cuts.sort();
    let mut out = Vec::new();
    let mut prev = 0;
    for c in cuts.into_iter().chain(std::iter::once(data.len())) {
        out.push(&data[prev..c]);
        prev = c;
    }
    out
}

fn compress(rng: &mut fastrand::Rng, tar: &[u8]) -> Blob {
    match rng.u8(0..10) {
        0..2 => {
            let mt = [media::TAR, "application/vnd.docker.image.rootfs.diff.tar"][rng.usize(0..2)];
            Blob::new(mt, tar.to_vec())
        }
        2..4 => {
            let mt = [media::TAR_GZIP, media::DOCKER_GZIP][rng.usize(0..2)];
            Blob::new(mt, gzip_level(tar, rng.u32(0..10)))
        }
        4..5 => {
            let n = rng.usize(1..4);
            let v: Vec<u8> = pieces(rng, tar, n).iter().flat_map(|p| gzip_level(p, 1)).collect();
            Blob::new(media::TAR_GZIP, v)
        }
        5..9 => Blob::new(media::TAR_ZSTD, zstd::encode_all(tar, rng.i32(1..6)).expect("zstd")),
        _ => {
            let n = rng.usize(1..4);
            let v: Vec<u8> = pieces(rng, tar, n).iter().flat_map(|p| zstd::encode_all(*p, 1).expect("zstd")).collect();
            Blob::new(media::TAR_ZSTD, v)
        }
    }
}

/// Damages a tar stream: bit flips, header fields, type bytes, sizes, truncation,
/// splices; the checksum is usually fixed so the damage reaches past it.
fn mutate_tar(rng: &mut fastrand::Rng, tar: &mut Vec<u8>) {
    let blocks = tar.len() / 512;
    for _ in 0..rng.usize(1..4) {
        if tar.is_empty() {
            tar.extend_from_slice(&[0u8; 512]);
        }
        let b = rng.usize(0..blocks.max(1)) * 512;
        let fix = rng.u8(0..10) < 7;
        match rng.u8(0..12) {
            0 => {
                for _ in 0..rng.usize(1..8) {
                    let i = rng.usize(0..tar.len());
                    tar[i] ^= 1 << rng.u8(0..8);
                }
            }
            1 if b + 512 <= tar.len() => {
                // A random field of a block: name, mode..mtime, type/link, magic/prefix.
                let (lo, hi) = [(0, 100), (100, 156), (156, 257), (257, 512)][rng.usize(0..4)];
                for i in lo..hi {
                    if rng.u8(0..4) == 0 {
                        tar[b + i] = rng.u8(..);
                    }
                }
            }
            2 if b + 512 <= tar.len() => {
                tar[b + 156] = *[
                    b'0', b'1', b'2', b'3', b'5', b'7', b'S', b'x', b'X', b'g', b'L', b'K', b'V', b'M', b'N', 0, 0xff,
                ]
                .get(rng.usize(0..17))
                .unwrap_or(&b'0');
            }
            3 if b + 512 <= tar.len() => {
                // A huge size: octal maximum, base-256, or just larger than the data.
                let field = &mut tar[b + 124..b + 136];
                match rng.u8(0..3) {
                    0 => field.copy_from_slice(b"77777777777\0"),
                    1 => {
                        field.fill(0xff);
                        field[0] = 0x80;
                    }
                    _ => {
                        let s = format!("{:011o}\0", rng.u64(0..1 << 33));
                        field.copy_from_slice(s.as_bytes());
                    }
                }
            }
            4 => {
                let n = rng.usize(0..=tar.len());
                tar.truncate(n);
            }
            5 => {
                let at = rng.usize(0..=tar.len());
                let n = rng.usize(1..1024);
                let junk: Vec<u8> = (0..n).map(|_| rng.u8(..)).collect();
                tar.splice(at..at, junk);
            }
            6 if tar.len() > 1024 => {
                let from = rng.usize(0..tar.len() - 512);
                let n = rng.usize(1..(tar.len() - from).min(4096));
                tar.drain(from..from + n);
            }
            7 => {
                // A copy of some blocks, again.
                let from = b.min(tar.len());
                let to = (from + 512 * rng.usize(1..4)).min(tar.len());
                let copy = tar[from..to].to_vec();
                let at = rng.usize(0..=blocks) * 512;
                let at = at.min(tar.len());
                tar.splice(at..at, copy);
            }
            8 => {
                // A PAX header with hostile records, in front of a block.
                let recs: Vec<(&str, Vec<u8>)> = vec![
                    (
                        "size",
                        ["-1", "99999999999999999999", "", "0x10", "18446744073709551615"][rng.usize(0..5)].into(),
                    ),
                    ("path", vec![b'p'; rng.usize(0..5000)]),
                    ("linkpath", b"../../../etc".to_vec()),
                    ("GNU.sparse.map", b"0,1,2".to_vec()),
                    ("GNU.sparse.realsize", b"1".to_vec()),
                ];
                let mut body = Vec::new();
                for (k, v) in recs.iter().filter(|_| rng.bool()) {
                    body.extend(pax_record(k, v));
                }
                if rng.u8(0..4) == 0 {
                    body.extend_from_slice(b"12 bad\n");
                }
                let mut t = RawTar::default();
                t.pax_raw(&body);
                let at = (rng.usize(0..=blocks) * 512).min(tar.len());
                tar.splice(at..at, t.0);
            }
            9 => {
                // A GNU long name record: huge, over 4096, exactly 4096, or without NUL.
                let mut t = RawTar::default();
                match rng.u8(0..4) {
                    0 => {
                        t.header(b'L', "././@LongLink", "", rng.u64(64 << 10..1 << 40));
                    }
                    1 => {
                        t.long_record(b'L', &vec![b'n'; 4097]);
                    }
                    2 => {
                        t.long_record(b'L', &vec![b'n'; 4096]);
                    }
                    _ => {
                        t.entry(b'L', "././@LongLink", "", &[b'z'; 700]);
                    }
                }
                let at = (rng.usize(0..=blocks) * 512).min(tar.len());
                tar.splice(at..at, t.0);
            }
            10 => {
                // An old GNU sparse header claiming extension blocks.
                let mut h = header_block(b'S', b"boot/vmlinuz", b"", 0, None);
                h[482] = 1;
                let mut ht = tar::Header::new_old();
                ht.as_mut_bytes().copy_from_slice(&h);
                ht.set_cksum();
                let at = (rng.usize(0..=blocks) * 512).min(tar.len());
                tar.splice(at..at, ht.as_bytes().to_vec());
            }
            _ => {}
        }
        if fix {
            // Recompute the checksums of every block that looks like a header.
            for k in 0..tar.len() / 512 {
                let blk = &mut tar[k * 512..(k + 1) * 512];
                if blk[257..262] == *b"ustar" {
                    let mut h = tar::Header::new_old();
                    h.as_mut_bytes().copy_from_slice(blk);
                    h.set_cksum();
                    blk.copy_from_slice(h.as_bytes());
                }
            }
        }
    }
}

/// Damages a compressed stream.
fn mutate_blob(rng: &mut fastrand::Rng, data: &mut Vec<u8>) {
    match rng.u8(0..4) {
        0 => {
            for _ in 0..rng.usize(1..6) {
                if !data.is_empty() {
                    let i = rng.usize(0..data.len());
                    data[i] ^= 1 << rng.u8(0..8);
                }
            }
        }
        1 => {
            let n = rng.usize(0..=data.len());
            data.truncate(n);
        }
        2 => data.extend((0..rng.usize(1..300)).map(|_| rng.u8(..))),
        _ => {
            let junk: Vec<u8> = (0..rng.usize(1..64)).map(|_| rng.u8(..)).collect();
            data.splice(0..0, junk);
        }
    }
}

/// How a case's image was made, and so what may be asserted about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Class {
    /// Valid layers: the model says exactly what comes out.
    Valid,
    /// Wild entries: extracted bytes must be some payload of the layers.
    Wild,
    /// Damaged tar or compressed bytes: only a clean outcome.
    Mutated,
}

/// One generated image with its wanted paths and limits.
struct Scenario {
    class: Class,
    blobs: Vec<Blob>,
    wanted: Vec<String>,
    /// Model verdict per wanted path (valid images only).
    expected: Vec<R>,
    payloads: HashSet<Vec<u8>>,
    limits: kata_addons::extract::Limits,
    /// Limits were lowered: an error naming a limit is acceptable.
    tight: bool,
    /// The same limits as command-line flags.
    limit_args: Vec<String>,
}

fn pick_wanted(rng: &mut fastrand::Rng, tree: &Tree) -> Vec<String> {
    let all: Vec<&String> = tree.keys().collect();
    let files: Vec<&String> = tree.iter().filter(|(_, n)| !matches!(n, M::Dir)).map(|(k, _)| k).collect();
    let mut out: Vec<String> = Vec::new();
    for _ in 0..rng.usize(1..3) {
        let p = match rng.u8(0..10) {
            0..7 if !files.is_empty() => files[rng.usize(0..files.len())].clone(),
            7..9 if !all.is_empty() => {
                // Through a symlinked directory, or a child of anything.
                let a = all[rng.usize(0..all.len())];
                if rng.bool() { a.clone() } else { join(a, NAMES[rng.usize(0..NAMES.len())]) }
            }
            9 => "boot/vmlinuz".to_string(),
            _ => join(&name(rng), &name(rng)),
        };
        let p = format!("/{p}");
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

fn scenario(rng: &mut fastrand::Rng, max_ops: usize) -> Scenario {
    let class = match rng.u8(0..10) {
        0..5 => Class::Valid,
        5..7 => Class::Wild,
        _ => Class::Mutated,
    };
    let img = gen_image(rng, class == Class::Wild, max_ops);
    let mut tars = img.tars;
    if class == Class::Mutated {
        let k = rng.usize(0..tars.len());
        mutate_tar(rng, &mut tars[k]);
    }
    let mut blobs: Vec<Blob> = tars.iter().map(|t| compress(rng, t)).collect();
    if class == Class::Mutated && rng.u8(0..10) < 3 {
        let k = rng.usize(0..blobs.len());
        let mut data = std::mem::take(&mut blobs[k].data);
        mutate_blob(rng, &mut data);
        let mt = blobs[k].media_type.clone();
        blobs[k] = Blob::new(&mt, data);
    }
    let wanted = pick_wanted(rng, &img.tree);
    let expected = wanted.iter().map(|w| model_resolve(&img.tree, w)).collect();
    let mut limits = kata_addons::extract::Limits::default();
    let mut limit_args = Vec::new();
    let tight = rng.u8(0..10) == 0;
    if tight {
        let (flag, v) = match rng.u8(0..7) {
            0 => ("--max-index-entries", rng.u64(1..40)),
            1 => ("--max-index-bytes", rng.u64(100..5000)),
            2 => ("--max-layers", rng.u64(1..4)),
            3 => ("--max-file-bytes", rng.u64(1..5000)),
            4 => ("--max-total-bytes", rng.u64(1..20_000)),
            5 => ("--max-layer-ratio", rng.u64(1..3)),
            _ => ("--max-layer-bytes", rng.u64(1..100_000)),
        };
        match flag {
            "--max-index-entries" => limits.max_index_entries = v,
            "--max-index-bytes" => limits.max_index_bytes = v,
            "--max-layers" => limits.max_layers = v as usize,
            "--max-file-bytes" => limits.max_file_size = v,
            "--max-total-bytes" => limits.max_total_size = v,
            "--max-layer-ratio" => {
                // The ratio only bites above the 64 MiB floor: pair it with a ceiling.
                limits.max_layer_ratio = v;
                limits.max_layer_bytes = 200_000;
                limit_args.extend(["--max-layer-bytes".to_string(), "200000".to_string()]);
            }
            _ => limits.max_layer_bytes = v,
        }
        limit_args.extend([flag.to_string(), v.to_string()]);
    }
    Scenario { class, blobs, wanted, expected, payloads: img.payloads, limits, tight, limit_args }
}

/// Whether an extraction error is one a lowered limit explains.
fn names_a_limit(msg: &str) -> bool {
    ["limit", "decompresses to more than", "--max-"].iter().any(|n| msg.contains(n))
}

/// What a fetch produced, as far as the assertions care.
enum Got {
    Files(Vec<Vec<u8>>),
    Refused(String),
}

/// The in-process extraction: `Pull::files` from an OCI layout written in `dir`.
fn fetch_in_process(rt: &tokio::runtime::Runtime, dir: &Path, s: &Scenario) -> Result<Got, String> {
    use kata_addons::fetch::{Pull, PullOptions, Wanted};
    let layout = dir.join("layout");
    Image::new(s.blobs.clone()).write_layout(&layout, "v1");
    let root = dir.join("root");
    let dest = dir.join("dest");
    std::fs::create_dir_all(&root).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(&dest).map_err(|e| e.to_string())?;
    let dest_dir =
        cap_std::fs::Dir::open_ambient_dir(&dest, cap_std::ambient_authority()).map_err(|e| e.to_string())?;
    let opts =
        PullOptions::for_layouts(kata_addons::trust::TrustOptions { root, ..Default::default() }, s.limits.clone());
    let image = kata_addons::source::ImageRef::Layout { path: layout, tag: Some("v1".into()) };
    let wanted: Vec<Wanted> = s
        .wanted
        .iter()
        .enumerate()
        .map(|(i, p)| Wanted { path: p.clone(), dest_name: format!("w{i}"), verity: None, sha256: true })
        .collect();
    let res = rt.block_on(Pull::new(&opts).files(&image, &wanted, &dest_dir, "the destination directory"));
    let mut left: Vec<String> = std::fs::read_dir(&dest)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    match res {
        Ok(report) => {
            let names: Vec<String> = (0..wanted.len()).map(|i| format!("w{i}")).collect();
            if left != names {
                return Err(format!("after success the destination holds {left:?}, expected {names:?}"));
            }
            let mut files = Vec::new();
            for (i, f) in report.files.iter().enumerate() {
                let data = std::fs::read(dest.join(format!("w{i}"))).map_err(|e| e.to_string())?;
                if Some(sha256_hex(&data)) != f.sha256 || data.len() as u64 != f.size {
                    return Err(format!("{}: the report's sha256/size do not match the file written", f.path));
                }
                files.push(data);
            }
            Ok(Got::Files(files))
        }
        Err(e) => {
            if !left.is_empty() {
                return Err(format!("after an error ({e:#}) the destination holds {left:?}"));
            }
            Ok(Got::Refused(format!("{e:#}")))
        }
    }
}

/// Checks an outcome against what the scenario allows.
fn check_outcome(s: &Scenario, got: &Got) -> Result<(), String> {
    let all_found = s.expected.iter().all(|e| matches!(e, R::File(_)));
    let capped = s.expected.iter().any(|e| matches!(e, R::Capped));
    match (s.class, got) {
        (Class::Valid, Got::Files(files)) => {
            let missing: Vec<&String> =
                s.wanted.iter().zip(&s.expected).filter(|(_, e)| matches!(e, R::NoFile)).map(|(w, _)| w).collect();
            if !missing.is_empty() {
                return Err(format!("extracted {:?}, but the model has no regular file at {missing:?}", s.wanted));
            }
            for ((w, e), f) in s.wanted.iter().zip(&s.expected).zip(files) {
                let R::File(e) = e else { continue };
                if e.as_slice() != f.as_slice() {
                    return Err(format!(
                        "{w}: extracted {} bytes (sha256 {}), the model says {} bytes (sha256 {})",
                        f.len(),
                        sha256_hex(f),
                        e.len(),
                        sha256_hex(e)
                    ));
                }
            }
            Ok(())
        }
        (Class::Valid, Got::Refused(msg)) => {
            if all_found && !capped && !(s.tight && names_a_limit(msg)) {
                return Err(format!("refused a valid image whose wanted paths {:?} are files: {msg}", s.wanted));
            }
            Ok(())
        }
        (Class::Wild, Got::Files(files)) => {
            for (w, f) in s.wanted.iter().zip(files) {
                if !s.payloads.contains(f) {
                    return Err(format!("{w}: extracted {} bytes that no entry of the layers holds", f.len()));
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn describe(s: &Scenario) -> String {
    format!(
        "class {:?}, {} layers ({:?}), wanted {:?}, model {:?}, limits {:?}",
        s.class,
        s.blobs.len(),
        s.blobs
            .iter()
            .map(|b| format!("{} {} bytes", b.media_type.rsplit('.').next().unwrap_or(""), b.data.len()))
            .collect::<Vec<_>>(),
        s.wanted,
        s.expected
            .iter()
            .map(|e| match e {
                R::File(d) => format!("{} bytes", d.len()),
                other => format!("{other:?}"),
            })
            .collect::<Vec<_>>(),
        s.limit_args
    )
}

/// The first line of an error's innermost cause, shortened (for the statistics).
fn error_class(msg: &str) -> String {
    let words: Vec<&str> = msg.split(": ").filter(|w| !w.starts_with('/') && !w.starts_with("layer ")).collect();
    let last = words.last().copied().unwrap_or(msg);
    let s: String =
        last.split_whitespace().filter(|w| !w.starts_with('/') && !w.starts_with('"')).collect::<Vec<_>>().join(" ");
    s.chars().filter(|c| !c.is_ascii_digit()).take(60).collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime")
}

/// Thousands of generated layers through the real extraction, in process.
#[test]
fn fuzz_layers_in_process() {
    let run = Run::new("layers_in_process", 600);
    let rt = runtime();
    reset_peak_rss();
    let mut stats: HashMap<(Class, bool), u64> = HashMap::new();
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let mut i = 0;
    while run.more(i) {
        run.case(i, |rng| {
            let s = scenario(rng, 12);
            let dir = scratch();
            let got = fetch_in_process(&rt, dir.path(), &s).map_err(|e| format!("{e}\n{}", describe(&s)))?;
            *stats.entry((s.class, matches!(got, Got::Files(_)))).or_default() += 1;
            if let Got::Refused(m) = &got {
                *errors.entry(error_class(m)).or_default() += 1;
            }
            check_outcome(&s, &got).map_err(|e| format!("{e}\n{}", describe(&s)))
        });
        i += 1;
    }
    let peak = peak_rss_mib();
    eprintln!(
        "fuzz layers_in_process: {i} cases in {:.1} s, peak RSS of the test process {peak:.1} MiB",
        run.start.elapsed().as_secs_f64()
    );
    let mut st: Vec<_> = stats.iter().collect();
    st.sort_by_key(|(k, _)| format!("{k:?}"));
    for ((class, ok), n) in st {
        eprintln!("  {class:?} {}: {n}", if *ok { "extracted" } else { "refused" });
    }
    let mut top: Vec<_> = errors.into_iter().collect();
    top.sort_by_key(|e| std::cmp::Reverse(e.1));
    for (e, n) in top.iter().take(25) {
        eprintln!("  {n:6}  {e}");
    }
    // The generator must keep reaching every outcome, or it stopped testing anything.
    for (class, ok) in [
        (Class::Valid, true),
        (Class::Valid, false),
        (Class::Wild, true),
        (Class::Mutated, true),
        (Class::Mutated, false),
    ] {
        assert!(stats.get(&(class, ok)).copied().unwrap_or(0) > 0, "no {class:?} case ended {ok}: {stats:?}");
    }
    // Every input here is at most a few MiB: the whole process (tokio, the other tests of
    // this file) stays far below what one tar bomb used to cost (4.7 GB).
    assert!(peak < 400.0, "peak RSS of the fuzzing process {peak:.1} MiB");
}

/// A sample of generated layers through the real binary (`fetch`, and `install` for some
/// valid ones): the exit-code contract, the same verdict as in process, bounded RSS.
#[test]
fn fuzz_layers_through_the_binary() {
    let run = Run::new("layers_through_the_binary", 40);
    let rt = runtime();
    let bin = kata_addons_bin();
    let cache = policy_cache();
    let mut i = 0;
    let mut installs = 0;
    let mut worst = (0.0f64, Duration::ZERO);
    while run.more(i) {
        run.case(i, |rng| {
            let s = scenario(rng, 8);
            let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
            let inproc = fetch_in_process(&rt, &dir.path().join("inproc"), &s)?;
            check_outcome(&s, &inproc).map_err(|e| format!("in process: {e}\n{}", describe(&s)))?;
            let layout = dir.path().join("layout");
            Image::new(s.blobs.clone()).write_layout(&layout, "v1");
            let image = format!("oci:{}:v1", layout.display());
            let dest = dir.path().join("dest");
            let dest_s = dest.display().to_string();
            let mut args: Vec<&str> = vec!["fetch", "--image", &image, "--dest", &dest_s];
            for w in &s.wanted {
                args.extend(["--path", w]);
            }
            args.extend(s.limit_args.iter().map(String::as_str));
            let m = run_measured(&bin, &args, Duration::from_secs(120));
            let ctx = || format!("{}\n{}", describe(&s), m.summary());
            worst = (worst.0.max(m.peak_rss_mib()), worst.1.max(m.cpu));
            if m.signal.is_some() || !matches!(m.code, Some(0 | 1)) {
                return Err(format!("fetch must exit 0 or 1\n{}", ctx()));
            }
            if m.peak_rss_mib() > RSS_BUDGET_MIB {
                return Err(format!("fetch peak RSS over {RSS_BUDGET_MIB} MiB\n{}", ctx()));
            }
            // Same file names the binary writes (base names): compare through the in-process verdict.
            match (&inproc, m.code) {
                (Got::Files(files), Some(0)) => {
                    let mut by_base: HashMap<String, &Vec<u8>> = HashMap::new();
                    for (w, f) in s.wanted.iter().zip(files) {
                        by_base.insert(w.rsplit('/').next().unwrap_or_default().to_string(), f);
                    }
                    if by_base.len() == s.wanted.len() {
                        for (b, f) in by_base {
                            let got = std::fs::read(dest.join(&b)).map_err(|e| format!("{b}: {e}\n{}", ctx()))?;
                            if &got != f {
                                return Err(format!("{b}: the binary wrote other bytes than in process\n{}", ctx()));
                            }
                        }
                    }
                }
                (Got::Refused(_), Some(1)) => {}
                (Got::Files(_), Some(1))
                    if ["same file name", "given twice", "invalid destination file name"]
                        .iter()
                        .any(|n| m.stderr.contains(n)) => {}
                (Got::Refused(e), _) => {
                    return Err(format!("in process: refused ({e}); the binary: exit {:?}\n{}", m.code, ctx()));
                }
                (Got::Files(_), _) => {
                    return Err(format!("in process: extracted; the binary: exit {:?}\n{}", m.code, ctx()));
                }
            }
            // `install` of the first wanted path as the kernel, for valid images.
            let w0 = &s.wanted[0];
            if s.class == Class::Valid && !s.tight && !w0.chars().any(char::is_control) && installs < 8 {
                installs += 1;
                let node = kata_addons_tests::node::Node::new();
                let cm = dir.path().join("cm.json");
                let text = serde_json::json!({"addonImage": image, "kernelPath": w0}).to_string();
                std::fs::write(&cm, text).map_err(|e| e.to_string())?;
                let root = node.root().display().to_string();
                let (cm_s, cache_s) = (cm.display().to_string(), cache.display().to_string());
                let m = run_measured(
                    &bin,
                    &["--cache-dir", &cache_s, "install", "--configmap", &cm_s, "--root", &root],
                    Duration::from_secs(120),
                );
                let ctx = || format!("install {w0}\n{}\n{}", describe(&s), m.summary());
                if m.peak_rss_mib() > RSS_BUDGET_MIB {
                    return Err(format!("install peak RSS over {RSS_BUDGET_MIB} MiB\n{}", ctx()));
                }
                match (&s.expected[0], m.code) {
                    (R::Capped, _) => {}
                    (R::File(k), Some(0)) => {
                        let installed = installed_files(&node.path("/etc/kata-containers/addons"));
                        if !installed.iter().any(|f| f == k.as_ref()) {
                            return Err(format!(
                                "install exit 0, but no installed file holds the model's bytes\n{}",
                                ctx()
                            ));
                        }
                    }
                    (R::NoFile, Some(1)) => {}
                    // An empty file is nothing Kata can boot: install refuses it naming the key.
                    (R::File(k), Some(1)) if k.is_empty() && m.stderr.contains("kernelPath") => {}
                    // The policy refuses some paths the extraction would take (e.g. over its grammar).
                    (_, Some(2)) if m.stderr.contains("kernelPath") => {}
                    (e, code) => {
                        return Err(format!(
                            "install exit {code:?}, the model says {}\n{}",
                            if matches!(e, R::File(_)) { "a file" } else { "no file" },
                            ctx()
                        ));
                    }
                }
            }
            Ok(())
        });
        i += 1;
    }
    eprintln!(
        "fuzz layers_through_the_binary: {i} fetch and {installs} install runs, worst peak RSS {:.1} MiB, worst CPU {:.2} s",
        worst.0,
        worst.1.as_secs_f64()
    );
}

fn installed_files(dir: &Path) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else { return out };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(installed_files(&p));
        } else if p.file_name().is_some_and(|n| n != "state.json")
            && let Ok(d) = std::fs::read(&p)
        {
            out.push(d);
        }
    }
    out
}

// ---- ConfigMaps and env sets ------------------------------------------------------------------

/// At most 40 characters of `s`, for messages.
fn short(s: &str) -> String {
    if s.chars().count() > 40 { format!("{}…", s.chars().take(40).collect::<String>()) } else { s.to_string() }
}

/// A policy compile cache shared by the tests of this file and kept between runs.
fn policy_cache() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fuzz-policy-cache");
    std::fs::create_dir_all(&p).expect("policy cache dir");
    p
}

const KEYS: &[&str] = &[
    "addonImage",
    "provider",
    "kernelPath",
    "initrdPath",
    "imagePath",
    "version",
    "kernelSha256",
    "initrdSha256",
    "imageSha256",
];

const ENV_KEYS: &[&str] = &[
    "ADDON_IMAGE",
    "ADDON_PROVIDER",
    "ADDON_KERNEL_PATH",
    "ADDON_INITRD_PATH",
    "ADDON_IMAGE_PATH",
    "ADDON_VERSION",
    "ADDON_KERNEL_SHA256",
    "ADDON_INITRD_SHA256",
    "ADDON_IMAGE_SHA256",
];

fn hex64(rng: &mut fastrand::Rng) -> String {
    (0..64).map(|_| char::from(b"0123456789abcdef"[rng.usize(0..16)])).collect()
}

fn cm_key(rng: &mut fastrand::Rng) -> String {
    match rng.u8(0..100) {
        0..70 => KEYS[rng.usize(0..KEYS.len())].to_string(),
        70..76 => {
            let k = KEYS[rng.usize(0..KEYS.len())];
            [k.to_lowercase(), k.to_uppercase(), format!("{k} "), format!("{k}s"), k.replace('P', "_p")]
                [rng.usize(0..5)]
            .clone()
        }
        76..80 => ENV_KEYS[rng.usize(0..ENV_KEYS.len())].to_string(),
        80..86 => (0..rng.usize(1..20)).map(|_| rng.alphanumeric()).collect(),
        86..90 => ["ключ", "鍵", "🔑", "clé"][rng.usize(0..4)].to_string(),
        90..93 => String::new(),
        93..96 => "k".repeat(rng.usize(240..300)),
        _ => ["..data", ".hidden", "a/b", "-", "a b", "null", "~", "1"][rng.usize(0..8)].to_string(),
    }
}

fn cm_value(rng: &mut fastrand::Rng, key: &str) -> String {
    let k = key.to_lowercase();
    let good: String = if k.contains("image") && !k.contains("path") && !k.contains("sha") {
        [
            "quay.io/org/kernel:v1".to_string(),
            format!("localhost:5000/a/b@sha256:{}", hex64(rng)),
            "oci:/var/lib/addons/layout:v1".to_string(),
            "[::1]:5000/k:tag".to_string(),
            format!("registry.example.com/x/y:t@sha256:{}", hex64(rng)),
        ][rng.usize(0..5)]
        .clone()
    } else if k.contains("path") {
        ["/boot/vmlinuz", "/boot/initrd.img", "/usr/share/kata/image.img", "/a/b/c"][rng.usize(0..4)].to_string()
    } else if k.contains("sha") {
        hex64(rng)
    } else if k.contains("provider") {
        ["se", "tdx", "snp"][rng.usize(0..3)].to_string()
    } else {
        ["1.0", "v2.3.4", "6.1.0-rc1+build", "sha256-abc"][rng.usize(0..4)].to_string()
    };
    match rng.u8(0..100) {
        0..55 => good,
        55..62 => String::new(),
        62..68 => format!("  {good}\t\n"),
        68..74 => ["relative/path", "/a/../b", "/a//b", "/a/./b", "/", "/a/", "SE", "Tdx", "quay.io/UPPER/x:v"]
            [rng.usize(0..9)]
        .to_string(),
        74..80 => (0..rng.usize(1..40)).map(|_| char::from(rng.u8(1..127))).collect(),
        80..85 => ["ü/ß", "日本/語", "\u{202e}evil", "a\u{0}b", "\u{feff}bom", "🦀"][rng.usize(0..6)].to_string(),
        85..90 => format!("/{}", "p/".repeat(rng.usize(1000..2500))),
        90..93 => "x".repeat(rng.usize(5000..200_000)),
        93..94 => "y".repeat(rng.usize(900_000..1_100_000)),
        94..97 => format!("{good}\n{good}"),
        _ => ["true", "null", "~", "1.0", "0x10", "[a, b]", "{a: b}", "&a x", "*a", "!!binary aGk=", "- x", "? k", "|"]
            [rng.usize(0..13)]
        .to_string(),
    }
}

/// A valid configuration (ConfigMap keys), sometimes with one key spoiled or one added.
fn base_pairs(rng: &mut fastrand::Rng) -> Vec<(String, String)> {
    let image = cm_value(rng, "addonImage");
    let image = if image.is_empty() || rng.bool() { "quay.io/org/kernel:v1".to_string() } else { image };
    let mut v: Vec<(&str, String)> = match rng.u8(0..3) {
        0 => vec![("addonImage", image), ("kernelPath", "/boot/vmlinuz".into())],
        1 => vec![
            ("addonImage", image),
            ("provider", "tdx".into()),
            ("kernelPath", "/boot/vmlinuz".into()),
            ("imagePath", "/usr/share/kata/rootfs.img".into()),
            ("kernelSha256", hex64(rng)),
        ],
        _ => vec![("addonImage", image), ("provider", " snp ".into()), ("initrdPath", "/boot/initrd.img".into())],
    };
    if rng.bool() {
        v.push(("version", ["v1.2.3", "6.1.0+tee", "1"][rng.usize(0..3)].into()));
    }
    let mut out: Vec<(String, String)> = v.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    match rng.u8(0..4) {
        0 => {
            let i = rng.usize(0..out.len());
            out[i].1 = cm_value(rng, &out[i].0.clone());
        }
        1 => {
            let k = cm_key(rng);
            let val = cm_value(rng, &k);
            out.push((k, val));
        }
        _ => {}
    }
    out
}

fn yaml_scalar(rng: &mut fastrand::Rng, s: &str) -> String {
    match rng.u8(0..10) {
        0..4 => s.to_string(),
        4..6 => format!("'{}'", s.replace('\'', "''")),
        6..9 => serde_json::to_string(s).expect("json string"),
        _ => {
            let ind = "  ";
            let body: Vec<String> = s.lines().map(|l| format!("{ind}{ind}{l}")).collect();
            format!("{}\n{}", ["|", "|-", ">", ">-"][rng.usize(0..4)], body.join("\n"))
        }
    }
}

/// A generated ConfigMap document (bytes: sometimes not UTF-8).
fn cm_doc(rng: &mut fastrand::Rng) -> Vec<u8> {
    let n = if rng.u8(0..20) == 0 { rng.usize(100..200) } else { rng.usize(0..10) };
    let pairs: Vec<(String, String)> = if rng.u8(0..10) < 5 {
        base_pairs(rng)
    } else {
        (0..n)
            .map(|_| {
                let k = cm_key(rng);
                let v = cm_value(rng, &k);
                (k, v)
            })
            .collect()
    };
    let yaml_map = |rng: &mut fastrand::Rng, indent: &str| -> String {
        pairs.iter().map(|(k, v)| format!("{indent}{}: {}\n", yaml_scalar(rng, k), yaml_scalar(rng, v))).collect()
    };
    let json_map = || {
        let m: serde_json::Map<String, serde_json::Value> =
            pairs.iter().map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone()))).collect();
        serde_json::Value::Object(m)
    };
    let mut doc = match rng.u8(0..20) {
        0..7 => yaml_map(rng, ""),
        7..11 => {
            let kind = ["ConfigMap", "ConfigMap", "ConfigMap", "Secret", "configmap", ""][rng.usize(0..6)];
            format!(
                "apiVersion: v1\nkind: {kind}\nmetadata:\n  name: kata-addon-artifacts\n  namespace: x\ndata:\n{}",
                yaml_map(rng, "  ")
            )
        }
        11..13 => json_map().to_string(),
        13..15 => {
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": json_map()})
                .to_string()
        }
        15 => format!("{}---\n{}", yaml_map(rng, ""), yaml_map(rng, "")),
        16 => {
            // An alias bomb: each level refers to the one before nine times.
            let mut s = String::from("a0: &a0 [\"lol\"]\n");
            for i in 1..rng.usize(2..12) {
                let refs: Vec<String> = (0..9).map(|_| format!("*a{}", i - 1)).collect();
                s.push_str(&format!("a{i}: &a{i} [{}]\n", refs.join(",")));
            }
            s
        }
        17 => [
            "",
            "~",
            "null",
            "[]",
            "- a\n- b\n",
            "42",
            "\"str\"",
            "{",
            "data: [1, 2]\nkind: ConfigMap\n",
            "kind: ConfigMap\n",
        ][rng.usize(0..10)]
        .to_string(),
        18 => format!("apiVersion: v1\nkind: ConfigMap\nbinaryData:\n  k: aGk=\ndata:\n{}", yaml_map(rng, "  ")),
        _ => format!(
            "{{{}}}",
            pairs
                .iter()
                .map(|(k, v)| format!("{}: {}", yaml_scalar(rng, k), serde_json::to_string(v).unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
    .into_bytes();
    if rng.u8(0..10) == 0 {
        match rng.u8(0..5) {
            0 => {
                let n = rng.usize(0..=doc.len());
                doc.truncate(n);
            }
            1 if !doc.is_empty() => {
                let i = rng.usize(0..doc.len());
                doc[i] = rng.u8(..);
            }
            2 => doc.splice(0..0, b"\xef\xbb\xbf".iter().copied()).for_each(drop),
            3 => doc.extend_from_slice(b"\n\t bad: indent\n"),
            _ => doc.extend_from_slice(b"\xff\xfe"),
        }
    }
    doc
}

/// The runner's verdict on some configuration input, computed in process.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// preview exits 0.
    Ok,
    /// Invalid configuration: exit 2.
    Invalid(String),
    /// Anything else: exit 1. Never right for configuration content.
    Operational(String),
}

fn verdict_of(policy: &kata_addons::policy::Policy, input: anyhow::Result<kata_addons::configmap::Input>) -> Verdict {
    use kata_addons::error::is_invalid_config;
    use kata_addons::policy::PolicyError;
    let input = match input {
        Ok(i) => i,
        Err(e) if is_invalid_config(&e) => return Verdict::Invalid(format!("{e:#}")),
        Err(e) => return Verdict::Operational(format!("{e:#}")),
    };
    match kata_addons::preview::compute(policy, &input) {
        Ok(_) => Verdict::Ok,
        Err(PolicyError::Rejected(v)) => Verdict::Invalid(kata_addons::policy::format_violations(&v)),
        Err(e) => Verdict::Operational(format!("{e:#}")),
    }
}

/// A ConfigMap file's text as `Input::load` reads it (size, UTF-8, parse, counts).
fn input_from_file_bytes(bytes: &[u8]) -> anyhow::Result<kata_addons::configmap::Input> {
    use kata_addons::configmap::{Input, MAX_BYTES, check_counts, parse_configmap};
    use kata_addons::error::ConfigError;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(ConfigError("too large".into()).into());
    }
    let text = String::from_utf8(bytes.to_vec()).map_err(|_| ConfigError("not UTF-8".into()))?;
    let data = parse_configmap(&text).map_err(|e| ConfigError(format!("{e:#}")))?;
    check_counts("fuzz", &data)?;
    Ok(Input::ConfigMap { origin: "fuzz".into(), data })
}

fn env_set(rng: &mut fastrand::Rng) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    use std::os::unix::ffi::OsStringExt;
    let n = if rng.u8(0..30) == 0 { rng.usize(120..140) } else { rng.usize(0..8) };
    let mut out = Vec::new();
    let mut total = 0;
    if rng.bool() {
        for (k, v) in base_pairs(rng) {
            let name = KEYS.iter().zip(ENV_KEYS).find(|(c, _)| **c == k).map_or(k.clone(), |(_, e)| e.to_string());
            let v: String = v.replace('\0', "").chars().take(100_000).collect();
            out.push((name.into(), v.into()));
        }
        return out;
    }
    for _ in 0..n {
        let name = match rng.u8(0..10) {
            0..7 => ENV_KEYS[rng.usize(0..ENV_KEYS.len())].to_string(),
            7 => format!(
                "ADDON_{}",
                (0..rng.usize(1..10)).map(|_| rng.alphanumeric().to_ascii_uppercase()).collect::<String>()
            ),
            8 => ["ADDON_ACTION", "addon_image", "ADDON_", "ADDON_KERNEL_PATH_"][rng.usize(0..4)].to_string(),
            _ => "ADDON_".to_string() + &"K".repeat(rng.usize(240..300)),
        };
        let key = KEYS.iter().zip(ENV_KEYS).find(|(_, e)| **e == name).map_or("version", |(k, _)| k);
        let mut v = cm_value(rng, key).replace('\0', "").into_bytes();
        if v.len() > 100_000 {
            v.truncate(100_000);
        }
        if rng.u8(0..30) == 0 {
            v.extend_from_slice(b"\xff\xfe");
        }
        // What exec(2) can pass: at most 128 KiB per variable, 2 MiB in all.
        total += name.len() + v.len() + 2;
        if total > 1 << 20 {
            break;
        }
        out.push((name.into(), std::ffi::OsString::from_vec(v)));
    }
    out
}

/// Writes pairs as a ConfigMap directory (kubelet's `..data` layout half the time).
fn write_cm_dir(rng: &mut fastrand::Rng, dir: &Path, pairs: &[(String, Vec<u8>)]) {
    let kubelet = rng.bool();
    let files = if kubelet { dir.join("..2026_11_30_gen") } else { dir.to_path_buf() };
    std::fs::create_dir_all(&files).expect("mkdir");
    for (k, v) in pairs {
        if k.is_empty() || k.contains('/') || k.contains('\0') || k == "." || k == ".." || k.len() > 200 {
            continue;
        }
        std::fs::write(files.join(k), v).expect("write key file");
        if kubelet && !k.starts_with('.') {
            let _ = std::os::unix::fs::symlink(format!("..data/{k}"), dir.join(k));
        }
    }
    if kubelet {
        std::os::unix::fs::symlink("..2026_11_30_gen", dir.join("..data")).expect("..data");
    }
}

fn cm_pairs(rng: &mut fastrand::Rng) -> Vec<(String, Vec<u8>)> {
    if rng.bool() {
        return base_pairs(rng).into_iter().map(|(k, v)| (k, v.into_bytes())).collect();
    }
    (0..rng.usize(0..10))
        .map(|_| {
            let k = cm_key(rng);
            let mut v = cm_value(rng, &k).into_bytes();
            if rng.u8(0..40) == 0 {
                v.push(0xff);
            }
            (k, v)
        })
        .collect()
}

fn load_policy() -> kata_addons::policy::Policy {
    kata_addons::policy::Policy::embedded(kata_addons::policy::PolicyOptions {
        // Generous: a loaded debug build must not turn a slow call into a finding.
        timeout: Duration::from_secs(20),
        memory_limit: 64 << 20,
        cache_dir: Some(policy_cache()),
    })
    .expect("load the embedded policy")
}

/// Compares the wasm policy's `env` with the native guest's on the same data.
fn same_env_native(policy: &kata_addons::policy::Policy, data: &[kata_addons::policy::KeyValue]) -> Result<(), String> {
    use kata_addons::policy::PolicyError;
    let native: Vec<kata_addons_guest::KeyValue> =
        data.iter().map(|kv| kata_addons_guest::KeyValue::new(kv.name.clone(), kv.value.clone())).collect();
    let n = kata_addons_guest::env(&native);
    let w = policy.env(data);
    let same = match (&n, &w) {
        (Ok(a), Ok(b)) => a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.name == y.name && x.value == y.value),
        (Err(a), Err(PolicyError::Rejected(b))) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.key == y.key && x.message == y.message)
        }
        // The host refuses some guest answers (too many violations, too long): checked apart.
        (Err(_), Err(_)) => true,
        _ => false,
    };
    if same { Ok(()) } else { Err(format!("native env {n:?}\nwasm env {w:?}")) }
}

/// Thousands of ConfigMaps, directories and env sets through the runner's parsing and
/// the policy in process: never an operational error, native and wasm guests agree.
#[test]
fn fuzz_configmaps_in_process() {
    let run = Run::new("configmaps_in_process", 1000);
    let policy = load_policy();
    reset_peak_rss();
    let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
    let mut i = 0;
    while run.more(i) {
        run.case(i, |rng| {
            let (what, verdict, data) = match rng.u8(0..10) {
                0..6 => {
                    let doc = cm_doc(rng);
                    let input = input_from_file_bytes(&doc);
                    let data = match &input {
                        Ok(kata_addons::configmap::Input::ConfigMap { data, .. }) => Some(data.clone()),
                        _ => None,
                    };
                    let v = verdict_of(&policy, input);
                    (format!("file {:?}", String::from_utf8_lossy(&doc[..doc.len().min(600)])), v, data)
                }
                6..8 => {
                    let dir = scratch();
                    let pairs = cm_pairs(rng);
                    write_cm_dir(rng, dir.path(), &pairs);
                    let input = kata_addons::configmap::read_configmap_dir(dir.path()).and_then(|d| {
                        kata_addons::configmap::check_counts("dir", &d)?;
                        Ok(kata_addons::configmap::Input::ConfigMap { origin: "dir".into(), data: d })
                    });
                    let v = verdict_of(&policy, input);
                    (
                        format!("directory {:?}", pairs.iter().map(|(k, v)| (short(k), v.len())).collect::<Vec<_>>()),
                        v,
                        None,
                    )
                }
                _ => {
                    let env = env_set(rng);
                    let input = kata_addons::configmap::from_env(env.clone().into_iter()).and_then(|e| {
                        kata_addons::configmap::check_counts("env", &e)?;
                        Ok(kata_addons::configmap::Input::Env(e))
                    });
                    let v = verdict_of(&policy, input);
                    (
                        format!(
                            "env {:?}",
                            env.iter().map(|(k, v)| (short(&k.to_string_lossy()), v.len())).collect::<Vec<_>>()
                        ),
                        v,
                        None,
                    )
                }
            };
            *counts
                .entry(match &verdict {
                    Verdict::Ok => "ok",
                    Verdict::Invalid(_) => "invalid",
                    Verdict::Operational(_) => "operational",
                })
                .or_default() += 1;
            if let Verdict::Operational(e) = &verdict {
                return Err(format!("configuration content ended in an operational error (exit 1): {e}\n{what}"));
            }
            if let Some(d) = data {
                same_env_native(&policy, &d).map_err(|e| format!("{e}\n{what}"))?;
            }
            Ok(())
        });
        i += 1;
    }
    eprintln!(
        "fuzz configmaps_in_process: {i} inputs in {:.1} s: {counts:?}; peak RSS {:.1} MiB",
        run.start.elapsed().as_secs_f64(),
        peak_rss_mib()
    );
    assert!(
        counts.get("ok").copied().unwrap_or(0) > 0 && counts.get("invalid").copied().unwrap_or(0) > 0,
        "{counts:?}"
    );
}

/// A sample of the same inputs through `kata-addons preview`: exit 0 or 2 only, and the
/// same verdict as in process; never a panic or a signal.
#[test]
fn fuzz_configmaps_through_preview() {
    let run = Run::new("configmaps_through_preview", 60);
    let policy = load_policy();
    let cache = policy_cache().display().to_string();
    let bin = kata_addons_bin();
    let root = tempfile::tempdir().expect("empty root");
    let root_s = root.path().display().to_string();
    let mut i = 0;
    let mut codes: BTreeMap<i32, u64> = BTreeMap::new();
    while run.more(i) {
        run.case(i, |rng| {
            let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
            let home = tmp.path().join("home");
            std::fs::create_dir(&home).map_err(|e| e.to_string())?;
            let out = ["text", "json", "env", "yaml"][rng.usize(0..4)];
            let mut cmd = std::process::Command::new(&bin);
            cmd.env_clear().env("HOME", &home).args([
                "--cache-dir",
                cache.as_str(),
                "preview",
                "--root",
                root_s.as_str(),
                "-o",
                out,
            ]);
            let (what, verdict) = match rng.u8(0..10) {
                0..6 => {
                    let doc = cm_doc(rng);
                    let f = tmp.path().join("cm.yaml");
                    std::fs::write(&f, &doc).map_err(|e| e.to_string())?;
                    cmd.arg("--configmap").arg(&f);
                    (
                        format!("file {:?}", String::from_utf8_lossy(&doc[..doc.len().min(600)])),
                        verdict_of(&policy, input_from_file_bytes(&doc)),
                    )
                }
                6..8 => {
                    let d = tmp.path().join("cm");
                    let pairs = cm_pairs(rng);
                    write_cm_dir(rng, &d, &pairs);
                    cmd.arg("--configmap-dir").arg(&d);
                    let input = kata_addons::configmap::read_configmap_dir(&d).and_then(|data| {
                        kata_addons::configmap::check_counts("dir", &data)?;
                        Ok(kata_addons::configmap::Input::ConfigMap { origin: "dir".into(), data })
                    });
                    (
                        format!("directory {:?}", pairs.iter().map(|(k, v)| (short(k), v.len())).collect::<Vec<_>>()),
                        verdict_of(&policy, input),
                    )
                }
                _ => {
                    let env = env_set(rng);
                    for (k, v) in &env {
                        cmd.env(k, v);
                    }
                    let input = kata_addons::configmap::from_env(env.clone().into_iter()).and_then(|e| {
                        kata_addons::configmap::check_counts("env", &e)?;
                        Ok(kata_addons::configmap::Input::Env(e))
                    });
                    (
                        format!(
                            "env {:?}",
                            env.iter().map(|(k, v)| (short(&k.to_string_lossy()), v.len())).collect::<Vec<_>>()
                        ),
                        verdict_of(&policy, input),
                    )
                }
            };
            let o = cmd.output().map_err(|e| e.to_string())?;
            let code = o.status.code();
            *codes.entry(code.unwrap_or(-1)).or_default() += 1;
            let want = match &verdict {
                Verdict::Ok => 0,
                Verdict::Invalid(_) => 2,
                Verdict::Operational(_) => 1,
            };
            if code != Some(want) || want == 1 {
                return Err(format!("preview -o {out}: in process {verdict:?}, the binary {}\n{what}", show(&o)));
            }
            if want == 0 && out == "json" {
                serde_json::from_slice::<serde_json::Value>(&o.stdout)
                    .map_err(|e| format!("preview -o json printed no JSON ({e})\n{}", show(&o)))?;
            }
            if want == 2 && o.stderr.is_empty() {
                return Err(format!("exit 2 without a word on stderr\n{what}"));
            }
            Ok(())
        });
        i += 1;
    }
    eprintln!(
        "fuzz configmaps_through_preview: {i} runs in {:.1} s, exit codes {codes:?}",
        run.start.elapsed().as_secs_f64()
    );
}

// ---- GPT headers --------------------------------------------------------------------------

/// A value for a GPT header field of `width` bytes: the edges of the count and size checks,
/// what the crash used, the disk's own geometry, or anything.
fn gpt_value(rng: &mut fastrand::Rng, width: usize, original: u64, sectors: u64) -> u64 {
    let pick = [
        0,
        1,
        2,
        34,
        127,
        128,
        129,
        256,
        4095,
        4096,
        4097,
        1_000_000,
        20_000_000,
        0xFFFF_FFFF,
        u64::MAX,
        u64::MAX / 512,
        sectors.saturating_sub(1),
        sectors,
        sectors + 1,
        original.wrapping_add(1),
        original.wrapping_sub(1),
        original.wrapping_mul(2),
        rng.u64(..),
    ];
    let v = pick[rng.usize(..pick.len())];
    if width == 4 { v & 0xFFFF_FFFF } else { v }
}

/// Generated GPT headers on a real measured disk (mkfs.erofs + veritysetup + sfdisk): one
/// to three of the count, size and LBA fields mutated, the header CRC32 recomputed so the
/// header reads as intact, through the image check in process (`verity::check`, which
/// `install`, `status` and the daemon's drift checks call) and through the stream that reads
/// the table from the first bytes while the image is written. Asserted: no panic or abort,
/// an answer within a bound, bounded memory; the intact disk still verifies.
#[test]
fn fuzz_gpt_headers_in_process() {
    use kata_addons::verity::{Params, Role, Stream, check};
    use kata_addons_tests::disk::{self, Fs, GptField, Label};
    if let Some(why) = disk::missing_tools() {
        panic!("{why}");
    }
    watch_panics();
    let run = Run::new("gpt_headers_in_process", 250);
    let dir = scratch();
    let (path, v) = disk::measured(dir.path(), "guest", Fs::Erofs, Label::Gpt, "5eed", 4096, 4096);
    let good = std::fs::read(&path).expect("disk");
    let params = Params::from_hex(&v.root_hash, &v.salt, v.data_blocks, v.data_block_size, v.hash_block_size)
        .expect("parameters");
    let f = std::fs::File::open(&path).expect("open");
    check(&f, "guest.img", Role::Image, Some(&params), None).expect("the intact disk verifies");
    let sectors = good.len() as u64 / 512;
    let bound = Duration::from_secs(5);
    let mutated = dir.path().join("mutated.img");
    reset_peak_rss();
    let (mut ok, mut refused) = (0u64, 0u64);
    let mut i = 0;
    while run.more(i) {
        run.case(i, |rng| {
            let mut d = good.clone();
            let mut edits = Vec::new();
            for _ in 0..rng.usize(1..=3) {
                let field = GptField::ALL[rng.usize(..GptField::ALL.len())];
                let width = field.place().1;
                edits.push((field, gpt_value(rng, width, disk::gpt_header_field(&d, field), sectors)));
            }
            disk::set_gpt_header(&mut d, &edits);
            std::fs::write(&mutated, &d).map_err(|e| e.to_string())?;
            let file = std::fs::File::open(&mutated).map_err(|e| e.to_string())?;
            let started = Instant::now();
            let res = check(&file, "guest.img", Role::Image, Some(&params), None);
            let mut stream = Stream::new(params.clone());
            for chunk in d.chunks(rng.usize(1..=256) << 10) {
                stream.update(chunk);
            }
            let _ = stream.finish();
            let took = started.elapsed();
            if took > bound {
                return Err(format!("{edits:?}: took {took:?}"));
            }
            match res {
                Ok(_) => ok += 1,
                Err(_) => refused += 1,
            }
            Ok(())
        });
        i += 1;
    }
    let peak = peak_rss_mib();
    eprintln!(
        "fuzz gpt_headers_in_process: {i} cases in {:.1} s ({ok} verified, {refused} refused), peak RSS of the test \
         process {peak:.1} MiB",
        run.start.elapsed().as_secs_f64()
    );
    assert!(refused > 0, "no mutated header was refused: the mutator stopped reaching the checks");
    assert!(peak < 200.0, "peak RSS of the fuzzing process {peak:.1} MiB");
}
