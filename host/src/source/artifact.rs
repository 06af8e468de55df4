//! OCI artifacts as `oras push` writes them (docs/design.md#oci-artifacts): recognising
//! one, and mapping its titled layers to the paths they are addressed by.
//!
//! Conventions (oras-go `content/file`): a layer annotated [`TITLE`] is the file named by
//! the title, its blob the file's raw bytes whatever the layer media type says (oras gives
//! plain files `application/vnd.oci.image.layer.v1.tar`); a layer also annotated
//! [`UNPACK`]` = "true"` is a gzip tar of a directory whose entries all sit under
//! `<title>/`. Layers without a title are not files (oras keeps them out of the file store).

use std::collections::HashMap;

use anyhow::{Result, bail};
use kata_addons_facts::Escaped;
use oci_spec::image::ImageManifest;

/// Annotation naming a layer's file (`org.opencontainers.image.title`).
pub(crate) const TITLE: &str = "org.opencontainers.image.title";
/// Annotation marking a layer as a gzip tar of a directory to unpack (oras-go `AnnotationUnpack`).
pub(crate) const UNPACK: &str = "io.deis.oras.content.unpack";
/// Config media types of container images: any other config makes the manifest an artifact.
const IMAGE_CONFIGS: [&str; 2] =
    ["application/vnd.oci.image.config.v1+json", "application/vnd.docker.container.image.v1+json"];

/// One titled layer of an artifact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ArtifactFile {
    /// The title: a clean relative path, the file (or directory) at `/<title>`.
    pub title: String,
    /// The layer is a gzip tar of the directory `<title>/` ([`UNPACK`]).
    pub unpack: bool,
    /// Position of the layer in the manifest (`ResolvedImage::layers`).
    pub layer: usize,
}

/// The addressable content of an artifact manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Artifact {
    /// The manifest's `artifactType`, if any.
    pub artifact_type: Option<String>,
    /// The config descriptor's media type.
    pub config_media_type: String,
    /// The titled layers, in manifest order.
    pub files: Vec<ArtifactFile>,
    /// How many layers have no title (not addressable).
    pub untitled: usize,
}

/// Where a wanted path of an artifact is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Located<'a> {
    /// The whole blob of this layer is the file.
    Raw(&'a ArtifactFile),
    /// A file inside this layer's unpacked directory (its tar entry path is the wanted path).
    Unpacked(&'a ArtifactFile),
    /// Not a file of the artifact: why.
    Missing(String),
}

/// Whether a manifest is an artifact: it has `artifactType`, or its config is not an image config.
pub(crate) fn is_artifact(m: &ImageManifest) -> bool {
    m.artifact_type().is_some() || !IMAGE_CONFIGS.contains(&m.config().media_type().to_string().as_str())
}

/// Checks that a title is one clean relative path (non-empty, no leading `/`, no `.`, `..`
/// or empty components, no control or bidirectional characters, `/<title>` at most 4096
/// bytes).
fn check_title(title: &str) -> Result<()> {
    if title.starts_with('/') {
        bail!("is absolute; a title is a relative path such as \"vmlinuz\" or \"boot/vmlinuz\"");
    }
    let clean = title.split('/').all(|c| !c.is_empty() && c != "." && c != "..");
    if !clean || title.is_empty() {
        bail!("is not a clean relative path (no empty, `.` or `..` components, no trailing `/`)");
    }
    if title.len() + 1 > 4096 || title.chars().any(kata_addons_facts::is_unsafe_char) {
        bail!("is longer than 4095 bytes or has control or bidirectional-override characters");
    }
    Ok(())
}

/// Whether one path is the other or lies beneath it.
fn overlaps(a: &str, b: &str) -> bool {
    let below = |x: &str, y: &str| x.len() > y.len() && x.starts_with(y) && x.as_bytes()[y.len()] == b'/';
    a == b || below(a, b) || below(b, a)
}

/// Reads the titled layers of an artifact manifest. A title that is not one clean relative path, or one that repeats
/// or contains another title, refuses the whole artifact naming the layer.
pub(crate) fn parse(m: &ImageManifest) -> Result<Artifact> {
    let mut files: Vec<ArtifactFile> = Vec::new();
    let mut untitled = 0;
    for (i, l) in m.layers().iter().enumerate() {
        let empty = HashMap::new();
        let ann = l.annotations().as_ref().unwrap_or(&empty);
        let digest = l.digest().to_string();
        // An empty title is no title (oras-go keeps such layers out of its file store).
        let Some(title) = ann.get(TITLE).filter(|t| !t.is_empty()) else {
            untitled += 1;
            continue;
        };
        if let Err(e) = check_title(title) {
            bail!("artifact layer {} ({digest}): title \"{}\" {e:#}", i + 1, Escaped(title));
        }
        if let Some(other) = files.iter().find(|f| overlaps(&f.title, title)) {
            let what = if other.title == *title { "repeats" } else { "overlaps" };
            bail!(
                "artifact layer {} ({digest}): title \"{}\" {what} the title \"{}\" of layer {}: each file of an \
                 artifact must have one title of its own",
                i + 1,
                Escaped(title),
                Escaped(&other.title),
                other.layer + 1
            );
        }
        files.push(ArtifactFile {
            title: title.clone(),
            unpack: ann.get(UNPACK).is_some_and(|v| v == "true"),
            layer: i,
        });
    }
    Ok(Artifact {
        artifact_type: m.artifact_type().as_ref().map(|t| t.to_string()),
        config_media_type: m.config().media_type().to_string(),
        files,
        untitled,
    })
}

impl Artifact {
    /// Where the normalised in-artifact path `path` (no leading `/`) is.
    pub(crate) fn locate(&self, path: &str) -> Located<'_> {
        for f in &self.files {
            if f.title == path {
                return if f.unpack {
                    Located::Missing(format!("layer {} unpacks a directory there, not a file", f.layer + 1))
                } else {
                    Located::Raw(f)
                };
            }
            if f.unpack && overlaps(&f.title, path) {
                return Located::Unpacked(f);
            }
            if overlaps(&f.title, path) {
                return Located::Missing(format!("/{} is the file of layer {}, not a directory", f.title, f.layer + 1));
            }
        }
        let mut names: Vec<String> = self
            .files
            .iter()
            .map(|f| if f.unpack { format!("/{}/", f.title) } else { format!("/{}", f.title) })
            .collect();
        if names.is_empty() {
            names.push("none".into());
        }
        let untitled = match self.untitled {
            0 => String::new(),
            n => format!("; {n} untitled layer(s), not addressable"),
        };
        Located::Missing(format!(
            "no layer of the artifact is titled so; its titled files: {}{untitled}",
            names.join(", ")
        ))
    }
}

/// Refuses an unpack layer holding an entry outside `<title>/` (oras-go refuses to extract
/// it); `first_outside` is the first such entry the layer's index holds.
pub(crate) fn check_unpacked(file: &ArtifactFile, digest: &str, first_outside: Option<&str>) -> Result<()> {
    if let Some(p) = first_outside {
        bail!(
            "artifact layer {} ({digest}), the directory {:?}: entry /{p} lies outside {}/ (an unpacked directory \
             holds only entries under its title): the artifact is refused",
            file.layer + 1,
            file.title,
            file.title
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(config_mt: &str, artifact_type: Option<&str>, layers: &[(&str, Option<&str>, bool)]) -> ImageManifest {
        let layers: Vec<serde_json::Value> = layers
            .iter()
            .enumerate()
            .map(|(i, (mt, title, unpack))| {
                let mut ann = serde_json::Map::new();
                if let Some(t) = title {
                    ann.insert(TITLE.into(), (*t).into());
                }
                if *unpack {
                    ann.insert(UNPACK.into(), "true".into());
                }
                serde_json::json!({"mediaType": mt, "digest": format!("sha256:{:064x}", i), "size": 1, "annotations": ann})
            })
            .collect();
        let mut doc = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": config_mt, "digest": format!("sha256:{:064x}", 99), "size": 2},
            "layers": layers,
        });
        if let Some(t) = artifact_type {
            doc["artifactType"] = t.into();
        }
        serde_json::from_value(doc).expect("manifest")
    }

    const TAR: &str = "application/vnd.oci.image.layer.v1.tar";
    const EMPTY: &str = "application/vnd.oci.empty.v1+json";

    #[test]
    fn recognised_by_artifact_type_or_config() {
        assert!(is_artifact(&manifest(EMPTY, None, &[])));
        assert!(is_artifact(&manifest("application/vnd.unknown.config.v1+json", None, &[])));
        assert!(is_artifact(&manifest(IMAGE_CONFIGS[0], Some("application/x.kernel"), &[])));
        assert!(!is_artifact(&manifest(IMAGE_CONFIGS[0], None, &[])));
        assert!(!is_artifact(&manifest(IMAGE_CONFIGS[1], None, &[])));
    }

    #[test]
    fn titles_locate_files_and_directories() {
        let m = manifest(
            EMPTY,
            Some("t"),
            &[(TAR, Some("vmlinuz"), false), (TAR, None, false), (TAR, Some("ext"), true), (TAR, Some(""), false)],
        );
        let a = parse(&m).expect("parses");
        assert_eq!(a.untitled, 2);
        assert!(matches!(a.locate("vmlinuz"), Located::Raw(f) if f.layer == 0));
        assert!(matches!(a.locate("ext/x/y"), Located::Unpacked(f) if f.layer == 2));
        assert!(matches!(a.locate("ext"), Located::Missing(_)));
        assert!(matches!(a.locate("vmlinuz/x"), Located::Missing(_)));
        let Located::Missing(why) = a.locate("initrd") else { panic!("found") };
        assert!(why.contains("/vmlinuz, /ext/") && why.contains("2 untitled"), "{why}");
    }

    #[test]
    fn bad_or_duplicate_titles_refuse_the_artifact() {
        for bad in ["/abs", "a/../b", "..", ".", "a//b", "a/", "./a", "a\nb"] {
            let m = manifest(EMPTY, None, &[(TAR, Some("ok"), false), (TAR, Some(bad), false)]);
            let e = format!("{:#}", parse(&m).expect_err(bad));
            assert!(e.contains("artifact layer 2") && e.contains(&format!("{bad:?}")), "{bad:?}: {e}");
        }
        for (a, b) in [("k", "k"), ("d", "d/k"), ("d/k", "d")] {
            let m = manifest(EMPTY, None, &[(TAR, Some(a), false), (TAR, Some(b), true)]);
            let e = format!("{:#}", parse(&m).expect_err(b));
            assert!(e.contains("artifact layer 2") && e.contains("layer 1"), "{e}");
        }
        let long = "a".repeat(4095);
        let m = manifest(EMPTY, None, &[(TAR, Some(&long), false)]);
        assert!(parse(&m).is_ok());
        let longer = "a".repeat(4096);
        let m = manifest(EMPTY, None, &[(TAR, Some(&longer), false)]);
        assert!(parse(&m).is_err());
    }
}
