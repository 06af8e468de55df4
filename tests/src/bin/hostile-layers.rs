//! Writes the catalogue of hostile layers (`kata_addons_tests::hostile::catalogue`) as OCI
//! layouts for `bench/hostile`: one layout per case under DIR, and DIR/cases.json listing
//! each case's id, description, image reference, wanted paths, extra arguments, expected
//! outcome and largest layer size; then the GPT cases (`hostile_gpt::install_cases`), whose
//! `argv` is the whole argument list (an `install` on a node root under DIR/gpt).
//!
//! It also writes the node-configuration cases (`node_catalogue`: nested ConfigMaps, an
//! import fan-out, CRI-O symlink loops, 20,000 handlers) under DIR/node, listed with the
//! `kata-addons` arguments (`argv`) and the expected exit code.
//!
//!   hostile-layers DIR [ID...]

use kata_addons_tests::hostile::{Expect, catalogue, node_catalogue};
use serde_json::json;

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(dir) = args.next() else {
        eprintln!("usage: hostile-layers DIR [ID...]");
        std::process::exit(64);
    };
    let only: Vec<String> = args.collect();
    let dir = std::path::PathBuf::from(dir);
    std::fs::create_dir_all(&dir).expect("create the output directory");
    let mut list = Vec::new();
    for c in catalogue() {
        if !only.is_empty() && !only.iter().any(|o| o == c.id) {
            continue;
        }
        let image = c.write_layout(&dir.join(c.id));
        let (expect, needle) = match &c.expect {
            Expect::Extracted => ("extracted", ""),
            Expect::Refused(n) => ("refused", *n),
        };
        list.push(json!({
            "id": c.id, "what": c.what, "image": image, "paths": c.paths, "args": c.args,
            "expect": expect, "needle": needle, "largest_layer": c.largest_layer(), "layers": c.layers.len(),
        }));
        eprintln!("wrote {} ({} layers, largest {} bytes)", c.id, c.layers.len(), c.largest_layer());
    }
    // Node configuration and ConfigMaps: a command on files written under DIR/node.
    let node_dir = dir.join("node");
    if only.is_empty() || node_catalogue_ids().iter().any(|id| only.iter().any(|o| o == id)) {
        std::fs::create_dir_all(&node_dir).expect("create the node case directory");
        for c in node_catalogue(&node_dir) {
            if !only.is_empty() && !only.iter().any(|o| o == c.id) {
                continue;
            }
            list.push(json!({
                "id": c.id, "what": c.what, "argv": c.args, "expect": "refused", "code": c.code,
                "needle": c.needle, "largest_layer": 0, "layers": 0,
            }));
            eprintln!("wrote {}", c.id);
        }
    }
    // The cases that install a measured guest disk on a node root (`argv`: the whole argument list).
    match kata_addons_tests::hostile_gpt::install_cases(&dir.join("gpt"), &only) {
        Some(cases) => {
            for c in cases {
                list.push(json!({
                    "id": c.id, "what": c.what, "argv": c.args, "expect": "refused", "code": 1, "needle": c.needle,
                    "largest_layer": c.layer, "layers": 1,
                }));
                eprintln!("wrote {} (install on a node root)", c.id);
            }
        }
        None => eprintln!("skipped the GPT cases: {}", kata_addons_tests::disk::missing_tools().unwrap_or_default()),
    }
    let text = serde_json::to_string_pretty(&list).expect("json");
    std::fs::write(dir.join("cases.json"), text).expect("write cases.json");
}

/// The ids [`node_catalogue`] writes (so `--only` can skip writing them).
fn node_catalogue_ids() -> [&'static str; 5] {
    ["yaml-20000", "yaml-520000", "import-fan-out", "crio-loops", "handlers-20000"]
}
