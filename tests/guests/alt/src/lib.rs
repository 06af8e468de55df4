//! A small, well-behaved alternative policy for the `--policy-component` end-to-end test: it
//! accepts exactly `addonImage` (`registry/repo:tag`) and `kernelPath`, always targets
//! the `tdx` runtime, and renders a drop-in that says which policy wrote it.
#![no_std]
include!("../../common/rt.rs");

fn get<'a>(list: &'a [KeyValue], key: &str) -> Option<&'a str> {
    list.iter().find(|kv| kv.name == key).map(|kv| kv.value.trim()).filter(|v| !v.is_empty())
}

fn bad(key: &str, code: ViolationCode, message: &str) -> Violation {
    Violation { key: key.to_string(), code, message: message.to_string() }
}

fn toml_string(s: &str) -> Option<String> {
    if s.chars().any(|c| c == '"' || c == '\\' || c.is_control()) {
        return None;
    }
    Some(alloc::format!("\"{s}\""))
}

impl Guest for Component {
    fn env(data: Vec<KeyValue>) -> Result<Vec<KeyValue>, Vec<Violation>> {
        let mut errors = Vec::new();
        for kv in &data {
            if kv.name != "addonImage" && kv.name != "kernelPath" {
                errors.push(bad(&kv.name, ViolationCode::UnknownKey, "the alt policy knows addonImage and kernelPath"));
            }
        }
        let image = get(&data, "addonImage");
        let kernel = get(&data, "kernelPath");
        if image.is_none() {
            errors.push(bad("addonImage", ViolationCode::Missing, "required"));
        }
        if kernel.is_none() {
            errors.push(bad("kernelPath", ViolationCode::Missing, "required"));
        }
        match (image, kernel) {
            (Some(i), Some(k)) if errors.is_empty() => Ok(vec![
                kv("ADDON_IMAGE", i),
                kv("ADDON_PROVIDER", "tdx"),
                kv("ADDON_KERNEL_PATH", k),
                kv("ADDON_VERSION", "alt-1"),
            ]),
            _ => Err(errors),
        }
    }

    fn plan(env: Vec<KeyValue>, _node: NodeOptions) -> Result<Plan, Vec<Violation>> {
        let (Some(image), Some(kernel)) = (get(&env, "ADDON_IMAGE"), get(&env, "ADDON_KERNEL_PATH")) else {
            return Err(vec![bad(
                "ADDON_IMAGE",
                ViolationCode::Missing,
                "ADDON_IMAGE and ADDON_KERNEL_PATH are required",
            )]);
        };
        let Some((registry, rest)) = image.split_once('/') else {
            return Err(vec![bad("ADDON_IMAGE", ViolationCode::InvalidReference, "expected registry/repo:tag")]);
        };
        let (repository, tag) = match rest.rsplit_once(':') {
            Some((r, t)) => (r, Some(t.to_string())),
            None => (rest, None),
        };
        if !kernel.starts_with('/') || kernel.split('/').any(|c| c == "..") {
            return Err(vec![bad("ADDON_KERNEL_PATH", ViolationCode::InvalidPath, "must be absolute, without ..")]);
        }
        let mut p = good_plan(kernel);
        p.image = image.to_string();
        p.source = ImageSource::Registry(RegistryRef {
            registry: registry.to_string(),
            repository: repository.to_string(),
            tag,
            digest: None,
        });
        p.version = get(&env, "ADDON_VERSION").unwrap_or("alt-1").to_string();
        p.artifacts[0].file_name = "vmlinuz-alt".to_string();
        Ok(p)
    }

    fn render(
        _plan: Plan,
        installed: Vec<InstalledFile>,
        runtime_configs: Vec<RuntimeConfigFacts>,
    ) -> Result<Vec<DropIn>, Vec<Violation>> {
        let Some(kernel) = installed.iter().find(|f| f.kind == ArtifactKind::Kernel) else {
            return Err(vec![bad("installed", ViolationCode::Inconsistent, "no kernel installed")]);
        };
        let Some(path) = toml_string(&kernel.path) else {
            return Err(vec![bad("installed", ViolationCode::InvalidPath, "path not representable")]);
        };
        let text = alloc::format!("# written by the alt test policy\n[hypervisor.qemu]\nkernel = {path}\n");
        Ok(drop_ins(&runtime_configs, &text))
    }
}
