//! The compile cache: a compiled component is stored beside a manifest naming the component,
//! the engine and the artifact's sha256, and loaded only when all three match.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use wasmtime::Engine;
use wasmtime::component::Component;

/// Largest compiled artifact the cache will read back.
const MAX_CACHE_ENTRY: u64 = 256 << 20;
/// First line of a cache entry's checksum file.
const CACHE_FORMAT: &str = "kata-addons policy cache v1";

/// How a component was obtained, for logs and benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadedFrom {
    /// Compiled now (no cache, or cache miss).
    Compiled,
    /// Deserialized from a verified cache entry.
    Cache,
}

pub(super) fn compile(engine: &Engine, bytes: &[u8]) -> Result<Component> {
    Component::new(engine, bytes).map_err(anyhow::Error::from).context("compiling the policy component")
}

/// The engine compatibility hash, as 16 hex digits.
fn engine_hash(engine: &Engine) -> String {
    let mut h = std::hash::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    format!("{:016x}", h.finish())
}

/// The checksum file of a cache entry: format line, what the entry was compiled from and
/// for, and the sha256 of the compiled bytes. All four must match before the entry is used.
fn cache_manifest(component_sha256: &str, engine_hash: &str, cwasm_sha256: &str) -> String {
    format!("{CACHE_FORMAT}\ncomponent-sha256 {component_sha256}\nengine {engine_hash}\ncwasm-sha256 {cwasm_sha256}\n")
}

/// A compiled component waiting to be written to the cache (after it passed validation).
pub(super) struct PendingEntry {
    dir: PathBuf,
    artifact: PathBuf,
    checksum: PathBuf,
    compiled: Vec<u8>,
    manifest: String,
}

impl PendingEntry {
    /// Writes the entry; a cache that cannot be written is not an error.
    pub(super) fn store(self) {
        if let Err(e) = store_cache_entry(&self) {
            tracing::debug!(dir = %self.dir.display(), error = %format!("{e:#}"), "policy cache not written");
        }
    }
}

/// Reads a verified cache entry, or says why there is none.
fn read_cache_entry(engine: &Engine, artifact: &Path, checksum: &Path, expected: &str) -> Result<Option<Component>> {
    let Ok(manifest) = std::fs::read_to_string(checksum) else { return Ok(None) };
    let Ok(meta) = std::fs::metadata(artifact) else { return Ok(None) };
    if !meta.is_file() || meta.len() > MAX_CACHE_ENTRY {
        bail!("not a regular file of at most {MAX_CACHE_ENTRY} bytes");
    }
    let data = std::fs::read(artifact).context("reading")?;
    let actual = cache_manifest_lines(&manifest);
    let wanted = cache_manifest_lines(expected);
    // Format, component and engine lines first: a foreign entry is refused before hashing.
    if actual.len() != 4 || actual[..3] != wanted[..3] {
        bail!("checksum file is for another component, engine or format");
    }
    if crate::hash::sha256_hex(&data) != actual[3].strip_prefix("cwasm-sha256 ").unwrap_or_default() {
        bail!("compiled bytes do not match their checksum (corrupt or truncated)");
    }
    // SAFETY: the bytes match the sha256 recorded when this program wrote them (by
    // `precompile_component` below) for this exact component and an engine with the same
    // compatibility hash; wasmtime further checks the header and that the embedded version
    // string names this component (see `new_engine`). What runs is still checked: the
    // import check and the typed exports are verified on the loaded component.
    let component = unsafe { Component::deserialize(engine, &data) }.map_err(anyhow::Error::from)?;
    Ok(Some(component))
}

/// The lines of a checksum file, trimmed.
fn cache_manifest_lines(text: &str) -> Vec<&str> {
    text.lines().map(str::trim).filter(|l| !l.is_empty()).collect()
}

/// Loads a precompiled component from `dir` if a verified entry exists, else compiles it
/// and returns the entry to write once the component passed validation.
pub(super) fn load_cached(
    engine: &Engine,
    bytes: &[u8],
    sha256: &str,
    dir: &Path,
) -> Result<(Component, LoadedFrom, Option<PendingEntry>)> {
    let hash = engine_hash(engine);
    let key = format!("{sha256}-{hash}");
    let artifact = dir.join(format!("{key}.cwasm"));
    let checksum = dir.join(format!("{key}.cwasm.sha256"));
    // The expected manifest, minus the cwasm digest (which only the entry itself knows).
    let expected = cache_manifest(sha256, &hash, "");
    match read_cache_entry(engine, &artifact, &checksum, &expected) {
        Ok(Some(c)) => return Ok((c, LoadedFrom::Cache, None)),
        Ok(None) => {}
        Err(e) => tracing::warn!(
            path = %artifact.display(), error = %format!("{e:#}"), "discarding policy cache entry; recompiling"
        ),
    }
    let compiled =
        engine.precompile_component(bytes).map_err(anyhow::Error::from).context("compiling the policy component")?;
    // SAFETY: `compiled` was produced just now by `precompile_component` on this engine.
    let component = unsafe { Component::deserialize(engine, &compiled) }
        .map_err(anyhow::Error::from)
        .context("loading the freshly compiled policy component")?;
    let manifest = cache_manifest(sha256, &hash, &crate::hash::sha256_hex(&compiled));
    let pending = PendingEntry { dir: dir.to_path_buf(), artifact, checksum, compiled, manifest };
    Ok((component, LoadedFrom::Compiled, Some(pending)))
}

pub(super) fn store_cache_entry(e: &PendingEntry) -> Result<()> {
    std::fs::create_dir_all(&e.dir).with_context(|| format!("creating {}", e.dir.display()))?;
    // Checksum file last: until it is in place, the entry is incomplete and ignored.
    write_atomic(&e.dir, &e.artifact, &e.compiled)?;
    write_atomic(&e.dir, &e.checksum, e.manifest.as_bytes())?;
    Ok(())
}

fn write_atomic(dir: &Path, path: &Path, data: &[u8]) -> Result<()> {
    let tmp =
        dir.join(format!(".tmp-{}-{}", std::process::id(), path.file_name().and_then(|n| n.to_str()).unwrap_or("x")));
    std::fs::write(&tmp, data).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| {
        let _ = std::fs::remove_file(&tmp);
        format!("renaming into {}", path.display())
    })
}
