//! Finding wanted paths in the merged view of an image's layers, shared by images
//! ([`super::image`]) and OCI artifacts ([`super::artifact`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use anyhow::{Context, Result, bail};

use super::bridge::{Pass, read_layer};
use super::layer::Mode;
use super::sink::Capture;
use super::{LayerIndex, Resolution, View};
use crate::source::Descriptor;

/// The files found for the wanted paths, and what was read to find them.
pub struct Captured {
    /// One per wanted path, in order (two paths may share one capture).
    pub files: Vec<Capture>,
    /// Digests of the blobs read, in order (a blob read twice appears twice).
    pub layers_read: Vec<String>,
}

/// Finds `paths` (normalised) in the merged view of `layers` (bottom first): reads layers top
/// first until every path is decided, then a second pass over layers whose file was not
/// copied in the first. `check` sees each layer's index as soon as it is read.
pub async fn capture_in_layers(
    pass: &Pass<'_>,
    layers: &[&Descriptor],
    paths: &[String],
    origin: &str,
    check: &dyn Fn(&Descriptor, &LayerIndex) -> Result<()>,
) -> Result<Captured> {
    let temps = pass.temps;
    let n = layers.len();
    let top_first: Vec<&Descriptor> = layers.iter().rev().copied().collect();
    let mut indexes: Vec<Arc<LayerIndex>> = Vec::new();
    let mut captures: HashMap<(usize, String), Capture> = HashMap::new();
    let mut layers_read = Vec::new();
    let mut results: Vec<Resolution> = Vec::new();
    for (k, desc) in top_first.iter().enumerate() {
        let out = read_layer(pass, desc, k, indexes.clone(), Mode::Discover(paths.to_vec())).await?;
        layers_read.push(desc.digest.clone());
        tracing::debug!("layer {k} {}: {} entries", desc.digest, out.index.len());
        if let Err(e) = check(desc, &out.index) {
            for c in out.captures.values() {
                temps.remove(&c.tmp);
            }
            return Err(e);
        }
        indexes.push(Arc::new(out.index));
        for (p, c) in out.captures {
            captures.insert((k, p), c);
        }
        let view = View { layers: indexes.iter().map(|a| a.as_ref()).collect(), all_read: k + 1 == n };
        results = paths.iter().map(|p| view.resolve(p)).collect();
        if results.iter().all(|r| !matches!(r, Resolution::Unknown { .. })) {
            break;
        }
    }
    // Every wanted path is decided.
    let mut missing = Vec::new();
    let mut targets = Vec::new();
    for (p, r) in paths.iter().zip(&results) {
        match r {
            Resolution::File { layer, path, .. } => targets.push((*layer, path.clone())),
            Resolution::Missing(why) => missing.push(format!("/{p}: {why}")),
            Resolution::Unknown { .. } => missing.push(format!("/{p}: undecided")),
        }
    }
    if !missing.is_empty() {
        bail!("{origin}: not a regular file in the image: {}", missing.join("; "));
    }
    // Second pass over layers whose needed file was not copied in the first pass.
    let mut reread: HashMap<usize, HashSet<String>> = HashMap::new();
    for (layer, path) in &targets {
        if !captures.contains_key(&(*layer, path.clone())) {
            reread.entry(*layer).or_default().insert(path.clone());
        }
    }
    let mut keys: Vec<usize> = reread.keys().copied().collect();
    keys.sort();
    for k in keys {
        let set = reread.remove(&k).unwrap_or_default();
        let desc = top_first[k];
        tracing::debug!("reading layer {} again for {:?}", desc.digest, set);
        let out = read_layer(pass, desc, k, indexes[..k].to_vec(), Mode::Exact(set)).await?;
        layers_read.push(desc.digest.clone());
        for (p, c) in out.captures {
            if let Some(old) = captures.insert((k, p), c) {
                temps.remove(&old.tmp);
            }
        }
    }
    let mut files = Vec::new();
    for (p, (layer, path)) in paths.iter().zip(&targets) {
        let c = captures
            .get(&(*layer, path.clone()))
            .with_context(|| format!("/{p}: /{path} was not captured from layer {layer}"))?;
        files.push(c.clone());
    }
    Ok(Captured { files, layers_read })
}
