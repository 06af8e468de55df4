//! Re-validation of what the policy answers: the runner acts on no output it has not
//! checked itself (env names and values, plan shape and paths, drop-in placement and TOML).

use kata_addons_facts::reference::check_parts;
use kata_addons_facts::{DROP_IN_NAME, file_name, is_configuration_file_name, is_sha256_hex, parent_dir};
pub use kata_addons_facts::{is_clean_path as is_clean_abs_path, is_plain_file_name};

use super::bindings::{DropIn, ImageSource, KeyValue, Plan, RuntimeConfigFacts, VeritySource};
use super::error::{PolicyError, bad, prefix};

/// Most runtime configurations a plan may name.
const MAX_RUNTIME_CONFIGS: usize = 32;
/// Most env entries a policy may return.
const MAX_ENV: usize = 64;
/// Most bytes in one returned string (name, value, path, message).
pub(super) const MAX_STRING: usize = 8 * 1024;
/// Most violations a policy may return.
pub(super) const MAX_VIOLATIONS: usize = 256;
/// Most bytes of drop-in text.
const MAX_DROP_IN: usize = 64 * 1024;
/// Most artifacts in a plan.
const MAX_ARTIFACTS: usize = 8;

/// `ADDON_[A-Z0-9_]+`.
fn valid_env_name(name: &str) -> bool {
    name.strip_prefix("ADDON_").is_some_and(|rest| {
        !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
    })
}

pub(super) fn check_env(func: &'static str, env: &[KeyValue]) -> Result<(), PolicyError> {
    if env.len() > MAX_ENV {
        return Err(bad(func, format!("returned {} env entries, more than {MAX_ENV}", env.len())));
    }
    for kv in env {
        if !valid_env_name(&kv.name) {
            return Err(bad(func, format!("env name {:?} does not match ADDON_[A-Z0-9_]+", prefix(&kv.name))));
        }
        if kv.value.len() > MAX_STRING {
            return Err(bad(func, format!("value of {} is longer than {MAX_STRING} bytes", kv.name)));
        }
        if kv.value.chars().any(char::is_control) {
            return Err(bad(func, format!("value of {} contains control characters", kv.name)));
        }
    }
    Ok(())
}

/// The host re-validates every plan field it will act on.
pub(super) fn check_plan(plan: &Plan) -> Result<(), PolicyError> {
    let f = "plan";
    for (what, s) in [("image", &plan.image), ("version", &plan.version)] {
        if s.len() > MAX_STRING {
            return Err(bad(f, format!("{what} is longer than {MAX_STRING} bytes")));
        }
    }
    if let ImageSource::Registry(r) = &plan.source
        && let Err(e) = check_parts(&r.registry, &r.repository, r.tag.as_deref(), r.digest.as_deref())
    {
        let problems = kata_addons_facts::reference::describe(&e);
        return Err(bad(f, format!("image {}/{}: {problems}", prefix(&r.registry), prefix(&r.repository))));
    }
    if !is_plain_file_name(&plan.version) {
        return Err(bad(f, format!("version {:?} is not usable as a directory name", prefix(&plan.version))));
    }
    if plan.runtime_configs.is_empty() || plan.runtime_configs.len() > MAX_RUNTIME_CONFIGS {
        return Err(bad(
            f,
            format!("plan names {} runtime configs; expected 1 to {MAX_RUNTIME_CONFIGS}", plan.runtime_configs.len()),
        ));
    }
    for rc in &plan.runtime_configs {
        if !is_clean_abs_path(rc) {
            return Err(bad(f, format!("runtime config {:?} is not a clean absolute path", prefix(rc))));
        }
        // The runner writes beside whatever file a candidate names: only Kata files qualify.
        if !is_configuration_file_name(file_name(rc)) {
            return Err(bad(f, format!("runtime config {:?} is not a Kata configuration*.toml", prefix(rc))));
        }
    }
    if plan.runtime_classes.len() > MAX_RUNTIME_CONFIGS {
        return Err(bad(
            f,
            format!("plan names {} runtime classes, more than {MAX_RUNTIME_CONFIGS}", plan.runtime_classes.len()),
        ));
    }
    if let Some(h) = plan.runtime_classes.iter().find(|h| h.len() > MAX_STRING || h.chars().any(char::is_control)) {
        return Err(bad(f, format!("runtime class {:?} is not a plain name", prefix(h))));
    }
    if plan.artifacts.is_empty() || plan.artifacts.len() > MAX_ARTIFACTS {
        return Err(bad(f, format!("plan has {} artifacts; expected 1 to {MAX_ARTIFACTS}", plan.artifacts.len())));
    }
    let mut names = std::collections::BTreeSet::new();
    for a in &plan.artifacts {
        if !is_plain_file_name(&a.file_name) {
            return Err(bad(f, format!("artifact file name {:?} is not a plain file name", prefix(&a.file_name))));
        }
        if !names.insert(a.file_name.as_str()) {
            return Err(bad(f, format!("artifact file name {:?} is used twice", a.file_name)));
        }
        if !is_clean_abs_path(&a.source) {
            return Err(bad(f, format!("artifact source {:?} is not a clean absolute path", prefix(&a.source))));
        }
        if let Some(s) = &a.sha256
            && !is_sha256_hex(s)
        {
            return Err(bad(f, format!("artifact sha256 {:?} is not 64 lowercase hex", prefix(s))));
        }
        if let Some(VeritySource::File(p)) = &a.verity
            && !is_clean_abs_path(p)
        {
            return Err(bad(f, format!("artifact verity file {:?} is not a clean absolute path", prefix(p))));
        }
        if let Some(n) = &a.name
            && !is_plain_file_name(n)
        {
            return Err(bad(f, format!("artifact name {:?} is not a plain name", prefix(n))));
        }
    }
    Ok(())
}

/// The facts of a runtime configuration known only by its node path (what the runner
/// has not read yet, or does not need to): no handler, keys or extensions.
pub fn path_only_facts(path: &str) -> RuntimeConfigFacts {
    RuntimeConfigFacts {
        path: path.to_string(),
        handler: None,
        keys: Vec::new(),
        extensions: Vec::new(),
        extensions_from: None,
    }
}

/// The host's own check of `render`'s answer: exactly one drop-in per runtime config, in
/// order, each directly inside the `config.d` beside it and named [`DROP_IN_NAME`], with
/// bounded, valid TOML text.
pub(super) fn check_drop_ins(runtime_configs: &[RuntimeConfigFacts], drop_ins: &[DropIn]) -> Result<(), PolicyError> {
    let f = "render";
    if drop_ins.len() != runtime_configs.len() {
        return Err(bad(
            f,
            format!("returned {} drop-ins for {} runtime configs", drop_ins.len(), runtime_configs.len()),
        ));
    }
    for (d, rc) in drop_ins.iter().zip(runtime_configs) {
        if d.runtime_config != rc.path {
            return Err(bad(f, format!("drop-in for {:?} answers {:?}", prefix(&rc.path), prefix(&d.runtime_config))));
        }
        let want = format!("{}/config.d/{DROP_IN_NAME}", parent_dir(&rc.path));
        if d.path != want {
            return Err(bad(f, format!("drop-in path {:?} is not {want}", prefix(&d.path))));
        }
        if d.contents.len() > MAX_DROP_IN {
            return Err(bad(f, format!("drop-in is {} bytes, more than {MAX_DROP_IN}", d.contents.len())));
        }
        toml::from_str::<toml::Table>(&d.contents).map_err(|e| bad(f, format!("drop-in is not valid TOML: {e}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_names() {
        assert!(valid_env_name("ADDON_IMAGE"));
        assert!(valid_env_name("ADDON_KERNEL_SHA256"));
        assert!(!valid_env_name("ADDON_"));
        assert!(!valid_env_name("PATH"));
        assert!(!valid_env_name("ADDON_image"));
    }

    #[test]
    fn clean_paths() {
        assert!(is_clean_abs_path("/etc/kata-containers/addons"));
        assert!(!is_clean_abs_path("/etc/../x"));
        assert!(!is_clean_abs_path("etc"));
        assert!(!is_clean_abs_path("/"));
        assert!(!is_clean_abs_path("/a//b"));
        assert!(!is_clean_abs_path("/a/"));
        assert!(is_plain_file_name("kernel"));
        assert!(!is_plain_file_name(".."));
        assert!(!is_plain_file_name("a/b"));
    }
}
