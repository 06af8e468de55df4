//! Hostile guest: returns output the host must refuse. `env` picks the bad output from
//! the first ConfigMap key; `plan` from the value of `ADDON_MODE`; `render` from the
//! plan's version. Anything else gets a well-formed answer.
#![no_std]
include!("../../common/rt.rs");

/// A registry source `registry/repository:v1`, its parts as given.
fn registry(registry: &str, repository: &str) -> ImageSource {
    ImageSource::Registry(RegistryRef {
        registry: registry.into(),
        repository: repository.into(),
        tag: Some("v1".into()),
        digest: None,
    })
}

fn mode(env: &[KeyValue]) -> &str {
    env.iter().find(|kv| kv.name == "ADDON_MODE").map(|kv| kv.value.as_str()).unwrap_or("")
}

impl Guest for Component {
    fn env(data: Vec<KeyValue>) -> Result<Vec<KeyValue>, Vec<Violation>> {
        let first = data.first().map(|kv| kv.name.as_str()).unwrap_or("");
        match first {
            "no-prefix" => Ok(vec![kv("LD_PRELOAD", "/tmp/evil.so")]),
            "lowercase" => Ok(vec![kv("ADDON_image", "x")]),
            "huge-value" => Ok(vec![kv("ADDON_IMAGE", &"a".repeat(1 << 20))]),
            "many" => Ok((0..1000).map(|i| kv(&alloc::format!("ADDON_X{i}"), "v")).collect()),
            "newline" => Ok(vec![kv("ADDON_IMAGE", "a\nADDON_EVIL=1")]),
            "many-violations" => Err((0..100_000).map(|_| violation("k", "m")).collect()),
            "empty-violations" => Err(Vec::new()),
            _ => Ok(vec![kv("ADDON_MODE", "ok")]),
        }
    }
    fn plan(env: Vec<KeyValue>, _node: NodeOptions) -> Result<Plan, Vec<Violation>> {
        let mut p = good_plan("/vmlinuz");
        match mode(&env) {
            "foreign-runtime-config" => p.runtime_configs = vec!["/etc/shadow".into()],
            "relative-runtime-config" => p.runtime_configs = vec!["etc/configuration.toml".into()],
            "no-runtime-config" => p.runtime_configs = Vec::new(),
            "slash-file-name" => p.artifacts[0].file_name = "../../../usr/bin/sudo".into(),
            "dotdot-file-name" => p.artifacts[0].file_name = "..".into(),
            "relative-source" => p.artifacts[0].source = "vmlinuz".into(),
            "bad-version" => p.version = "../v1".into(),
            "relative-verity-file" => p.artifacts[0].verity = Some(VeritySource::File("root_hash.txt".into())),
            "slash-name" => p.artifacts[0].name = Some("../x".into()),
            "ipv6-registry" => p.source = registry("[::1]:5000", "a/b"),
            "unnormalised-docker-hub" => p.source = registry("docker.io", "ubuntu"),
            "many-runtime-classes" => p.runtime_classes = (0..100).map(|i| alloc::format!("kata-{i}")).collect(),
            "newline-runtime-class" => p.runtime_classes = vec!["kata\n[x]".into()],
            "many-artifacts" => {
                let a = p.artifacts[0].clone();
                p.artifacts = (0..100).map(|i| Artifact { file_name: alloc::format!("f{i}"), ..a.clone() }).collect();
            }
            "huge-render" => p.version = "huge".into(),
            "bad-toml" => p.version = "badtoml".into(),
            _ => {}
        }
        Ok(p)
    }
    fn render(
        plan: Plan,
        _installed: Vec<InstalledFile>,
        runtime_configs: Vec<RuntimeConfigFacts>,
    ) -> Result<Vec<DropIn>, Vec<Violation>> {
        let good = "[hypervisor.qemu]\nkernel = \"/k\"\n";
        match plan.version.as_str() {
            "huge" => Ok(drop_ins(&runtime_configs, &alloc::format!("# {}\n", "x".repeat(100 * 1024)))),
            "badtoml" => Ok(drop_ins(&runtime_configs, "[hypervisor.qemu\nkernel = ")),
            "elsewhere" => {
                let mut d = drop_ins(&runtime_configs, good);
                d.iter_mut().for_each(|d| d.path = "/etc/cron.d/50-kata-addons.toml".into());
                Ok(d)
            }
            "fewer" => Ok(Vec::new()),
            "node-refuses" => Err(vec![Violation {
                key: "/etc/kata-containers/kata-tdx/configuration.toml".to_string(),
                code: ViolationCode::NodeRefuses,
                message: "this node measures its guest image".to_string(),
            }]),
            "node-refuses-and-invalid" => Err(vec![
                Violation {
                    key: "/etc/kata-containers/kata-tdx/configuration.toml".to_string(),
                    code: ViolationCode::NodeRefuses,
                    message: "this node measures its guest image".to_string(),
                },
                violation("imageVerityParams", "invalid"),
            ]),
            _ => Ok(drop_ins(&runtime_configs, good)),
        }
    }
}
