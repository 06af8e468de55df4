//! The `bench/hostile` cases that run `install` on a node root instead of `fetch`: a
//! measured guest disk (mkfs.erofs + veritysetup + sfdisk) whose GPT header sizes the
//! partition-table read as an attacker sets it (`disk::HOSTILE_GPT_HEADERS`, header CRC32
//! recomputed), shipped in an OCI layout and installed as a ConfigMap change on a fresh
//! node root. Written by the `hostile-layers` bin next to the layer catalogue.

use std::path::Path;

use crate::disk::{self, Fs, GptField, HOSTILE_GPT_HEADERS, Label};
use crate::image::{Compress, Image, LayerBuilder};

/// One `install` case: its id, what it is, the arguments after the binary, and the text
/// the refusal must contain.
pub struct InstallCase {
    /// Short id (`gpt-…`).
    pub id: String,
    /// What the case is, for the table.
    pub what: String,
    /// Arguments after the binary.
    pub args: Vec<String>,
    /// Text the refusal (exit 1) must contain.
    pub needle: &'static str,
    /// Size of the image's one layer, in bytes.
    pub layer: usize,
}

/// The id of the hostile header `i` of [`HOSTILE_GPT_HEADERS`].
fn id(i: usize) -> String {
    ["gpt-entries-ffffffff", "gpt-entry-size-0", "gpt-1e6-entries-size-0", "gpt-2e7-entries"][i].to_string()
}

/// Writes the GPT cases under `dir` (the layouts, a fresh node root with a TDX runtime
/// configuration, one ConfigMap per case); only the ids in `only` when it is not empty.
/// `None` when the disk tools are missing.
pub fn install_cases(dir: &Path, only: &[String]) -> Option<Vec<InstallCase>> {
    if disk::missing_tools().is_some() {
        return None;
    }
    if !only.is_empty() && !(0..HOSTILE_GPT_HEADERS.len()).any(|i| only.contains(&id(i))) {
        return Some(Vec::new());
    }
    std::fs::create_dir_all(dir).expect("create the GPT case directory");
    let (path, v) = disk::measured(dir, "guest", Fs::Erofs, Label::Gpt, "5eed", 4096, 4096);
    let good = std::fs::read(path).expect("disk");
    let root = dir.join("node");
    let config = root.join("etc/kata-containers/kata-tdx/configuration.toml");
    std::fs::create_dir_all(config.parent().expect("parent")).expect("mkdir");
    std::fs::write(&config, crate::node::BASE_CONFIG).expect("write the runtime configuration");
    let mut out = Vec::new();
    for (i, (what, entries, size)) in HOSTILE_GPT_HEADERS.iter().enumerate() {
        let id = id(i);
        if !only.is_empty() && !only.contains(&id) {
            continue;
        }
        let mut d = good.clone();
        disk::set_gpt_header(&mut d, &[(GptField::Entries, *entries), (GptField::EntrySize, *size)]);
        let layer = LayerBuilder::new().file("images/guest.img", &d).build(Compress::Gzip);
        let size_of_layer = layer.data.len();
        let layout = dir.join(&id);
        Image::new(vec![layer]).write_layout(&layout, "v1");
        let cm = dir.join(format!("{id}.json"));
        let data = serde_json::json!({
            "addonImage": format!("oci:{}:v1", layout.display()),
            "provider": "tdx",
            "imagePath": "/images/guest.img",
            "imageVerityParams": v.kata_params(),
        });
        std::fs::write(&cm, serde_json::to_vec(&data).expect("json")).expect("write the ConfigMap");
        out.push(InstallCase {
            id,
            what: format!("measured guest disk ({} KiB), GPT header with {what}", good.len() >> 10),
            args: vec![
                "install".into(),
                "--configmap".into(),
                cm.display().to_string(),
                "--root".into(),
                root.display().to_string(),
            ],
            needle: "GPT header",
            layer: size_of_layer,
        });
    }
    Some(out)
}
