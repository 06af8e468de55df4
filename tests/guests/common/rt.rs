// Shared pieces of the test guests, pulled in with `include!`: the real guest's no_std
// runtime (guest/src/rt.rs), so they import nothing exactly like it, and small helpers.

extern crate alloc;

include!("../../../guest/src/rt.rs");

wit_bindgen::generate!({
    path: "../../../wit",
    world: "policy",
});

use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;

struct Component;
export!(Component);

#[allow(dead_code)]
fn has(data: &[KeyValue], key: &str) -> bool {
    data.iter().any(|kv| kv.name == key)
}

#[allow(dead_code)]
fn kv(name: &str, value: &str) -> KeyValue {
    KeyValue { name: name.to_string(), value: value.to_string() }
}

#[allow(dead_code)]
fn violation(key: &str, message: &str) -> Violation {
    Violation { key: key.to_string(), code: ViolationCode::Inconsistent, message: message.to_string() }
}

/// A plan the host accepts (a tdx kernel), to be spoiled by the bad-output guest.
#[allow(dead_code)]
fn good_plan(kernel: &str) -> Plan {
    Plan {
        image: "quay.io/example/addon:v1".to_string(),
        source: ImageSource::Registry(RegistryRef {
            registry: "quay.io".to_string(),
            repository: "example/addon".to_string(),
            tag: Some("v1".to_string()),
            digest: None,
        }),
        provider: Provider::Tdx,
        version: "v1".to_string(),
        runtime_classes: Vec::new(),
        runtime_configs: vec!["/etc/kata-containers/kata-tdx/configuration.toml".to_string()],
        artifacts: vec![Artifact {
            kind: ArtifactKind::Kernel,
            source: kernel.to_string(),
            file_name: "vmlinuz".to_string(),
            sha256: None,
            verity: None,
            name: None,
        }],
        kata_version: None,
        se_host_key_documents: Vec::new(),
    }
}

/// One drop-in with `contents` per runtime config, in `config.d` beside it.
#[allow(dead_code)]
fn drop_ins(runtime_configs: &[RuntimeConfigFacts], contents: &str) -> Vec<DropIn> {
    runtime_configs
        .iter()
        .map(|rc| DropIn {
            runtime_config: rc.path.clone(),
            path: alloc::format!("{}/config.d/50-kata-addons.toml", rc.path.rsplit_once('/').map_or("", |(d, _)| d)),
            contents: contents.to_string(),
        })
        .collect()
}

#[allow(dead_code)]
fn unused(_: String) {}
