//! The files of an OCI artifact (docs/design.md#oci-artifacts,
//! [`crate::source::artifact`]): a raw-file layer is copied to its file as it streams
//! ([`super::raw`]), an unpack layer is read as a one-layer gzip image whose entries must
//! all sit under its title.

use std::collections::HashMap;

use anyhow::{Context, Result, bail};

use super::LayerIndex;
use super::bridge::{Pass, stream_verified};
use super::layers::{Captured, capture_in_layers};
use super::sink::Capture;
use crate::source::artifact::{Artifact, ArtifactFile, Located, check_unpacked};
use crate::source::{Descriptor, ResolvedImage};

/// The media type an unpack layer is read as, whatever its descriptor says.
const GZIP_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// Copies a raw-file layer of an artifact (the whole blob is the file `/<path>`) into a
/// temporary file as it streams: no decompression, and its verified digest is its sha256.
async fn read_raw(pass: &Pass<'_>, desc: &Descriptor, path: &str) -> Result<Capture> {
    let limits = pass.limits;
    if desc.size > limits.max_blob_size {
        bail!("layer {} is {} bytes, more than the {} byte limit", desc.digest, desc.size, limits.max_blob_size);
    }
    if desc.size > limits.max_file_size {
        bail!("/{path} is {} bytes, more than the per-file limit of {} bytes", desc.size, limits.max_file_size);
    }
    let total = pass.total.fetch_add(desc.size, std::sync::atomic::Ordering::Relaxed) + desc.size;
    if total > limits.max_total_size {
        bail!("extracted files exceed the total limit of {} bytes", limits.max_total_size);
    }
    pass.temps.check_space(path, desc.size)?;
    let (tmp, file) = pass.temps.create()?;
    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(8);
    let (name, size) = (tmp.clone(), desc.size);
    let stream = pass.streams.get(path).map(|m| crate::verity::Stream::new(m.params.clone()));
    let thread = tokio::task::spawn_blocking(move || super::raw::write_stream(file, &name, size, stream, rx));
    let streamed = match pass.source.open(desc).await {
        Ok(mut blob) => stream_verified(&mut *blob, desc, tx).await,
        Err(e) => Err(e),
    };
    let written = thread.await.context("file writer thread failed")?;
    let res = match (streamed, written) {
        (Err(e), _) | (Ok(()), Err(e)) => Err(e),
        (Ok(()), Ok((n, streamed))) => {
            let sha256 = Some(desc.digest["sha256:".len()..].to_string());
            Ok(Capture { tmp: tmp.clone(), sha256, size: n, streamed })
        }
    };
    if res.is_err() {
        pass.temps.remove(&tmp);
    }
    res.with_context(|| format!("artifact layer {} (the file /{path})", desc.digest))
}

/// The wanted paths of an OCI artifact: each raw-file blob read once, each unpack layer
/// read as a one-layer gzip image.
pub async fn extract(
    pass: &Pass<'_>,
    resolved: &ResolvedImage,
    artifact: &Artifact,
    paths: &[String],
) -> Result<Captured> {
    let origin = &resolved.origin;
    let layer_of = |f: &ArtifactFile| {
        resolved.layers.get(f.layer).with_context(|| format!("{origin}: artifact layer {} is missing", f.layer + 1))
    };
    // Decide every path before reading anything.
    let mut missing = Vec::new();
    let mut located = Vec::new();
    for p in paths {
        match artifact.locate(p) {
            Located::Missing(why) => missing.push(format!("/{p}: {why}")),
            l => located.push(l),
        }
    }
    if !missing.is_empty() {
        bail!("{origin}: not a file of the OCI artifact: {}", missing.join("; "));
    }
    let mut files: Vec<Option<Capture>> = vec![None; paths.len()];
    let mut layers_read = Vec::new();
    let mut raw: HashMap<usize, Capture> = HashMap::new();
    let mut unpack: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
    for (i, l) in located.iter().enumerate() {
        match l {
            Located::Raw(f) => {
                let c = match raw.get(&f.layer) {
                    Some(c) => c.clone(),
                    None => {
                        let desc = layer_of(f)?;
                        let c = read_raw(pass, desc, &f.title).await?;
                        layers_read.push(desc.digest.clone());
                        raw.insert(f.layer, c.clone());
                        c
                    }
                };
                files[i] = Some(c);
            }
            Located::Unpacked(f) => unpack.entry(f.layer).or_default().push(i),
            Located::Missing(_) => {}
        }
    }
    for (layer, which) in unpack {
        let Some(f) = artifact.files.iter().find(|f| f.layer == layer) else { continue };
        let desc = layer_of(f)?;
        let sub: Vec<String> = which.iter().map(|&i| paths[i].clone()).collect();
        // oras-go gunzips an unpack layer whatever its media type says.
        let gz = Descriptor { media_type: GZIP_LAYER.to_string(), ..desc.clone() };
        let check = |d: &Descriptor, index: &LayerIndex| check_unpacked(f, &d.digest, index.first_outside(&f.title));
        let c = capture_in_layers(pass, &[&gz], &sub, origin, &check).await?;
        layers_read.extend(c.layers_read);
        for (&i, capture) in which.iter().zip(c.files) {
            files[i] = Some(capture);
        }
    }
    let files = files
        .into_iter()
        .zip(paths)
        .map(|(c, p)| c.with_context(|| format!("{origin}: /{p} was not captured")))
        .collect::<Result<Vec<_>>>()?;
    Ok(Captured { files, layers_read })
}
