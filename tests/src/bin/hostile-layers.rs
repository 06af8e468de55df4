//! Writes the catalogue of hostile layers (`kata_addons_tests::hostile::catalogue`) as OCI
//! layouts for `bench/hostile`: one layout per case under DIR, and DIR/cases.json listing
//! each case's id, description, image reference, wanted paths, extra arguments, expected
//! outcome and largest layer size.
//!
//!   hostile-layers DIR [ID...]

use kata_addons_tests::hostile::{Expect, catalogue};
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
    let text = serde_json::to_string_pretty(&list).expect("json");
    std::fs::write(dir.join("cases.json"), text).expect("write cases.json");
}
