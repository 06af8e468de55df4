//! The thin wit-bindgen layer: converts between the generated WIT types and the
//! plain-Rust policy. The no_std runtime pieces live in `rt.rs`.

use alloc::string::String;
use alloc::vec::Vec;

use crate::types as t;

wit_bindgen::generate!({
    path: "../wit",
    world: "policy",
});

use self as w;

struct Component;

export!(Component);

impl Guest for Component {
    fn env(data: Vec<w::KeyValue>) -> Result<Vec<w::KeyValue>, Vec<w::Violation>> {
        let data: Vec<t::KeyValue> = data.into_iter().map(kv_in).collect();
        crate::env(&data).map(|env| env.into_iter().map(kv_out).collect()).map_err(violations_out)
    }

    fn plan(env: Vec<w::KeyValue>, node: w::NodeOptions) -> Result<w::Plan, Vec<w::Violation>> {
        let env: Vec<t::KeyValue> = env.into_iter().map(kv_in).collect();
        let node = t::NodeOptions { kata_prefix: node.kata_prefix };
        crate::plan(&env, &node).map(plan_out).map_err(violations_out)
    }

    fn render(
        plan: w::Plan,
        installed: Vec<w::InstalledFile>,
        runtime_configs: Vec<String>,
    ) -> Result<Vec<w::DropIn>, Vec<w::Violation>> {
        let plan = plan_in(plan);
        let installed: Vec<t::InstalledFile> =
            installed.into_iter().map(|f| t::InstalledFile { kind: kind_in(f.kind), path: f.path }).collect();
        crate::render(&plan, &installed, &runtime_configs)
            .map(|d| {
                d.into_iter()
                    .map(|d| w::DropIn { runtime_config: d.runtime_config, path: d.path, contents: d.contents })
                    .collect()
            })
            .map_err(violations_out)
    }
}

fn kv_in(kv: w::KeyValue) -> t::KeyValue {
    t::KeyValue { name: kv.name, value: kv.value }
}

fn kv_out(kv: t::KeyValue) -> w::KeyValue {
    w::KeyValue { name: kv.name, value: kv.value }
}

fn violations_out(v: Vec<t::Violation>) -> Vec<w::Violation> {
    v.into_iter().map(|v| w::Violation { key: v.key, code: code_out(v.code), message: v.message }).collect()
}

fn code_out(c: t::Code) -> w::ViolationCode {
    match c {
        t::Code::Missing => w::ViolationCode::Missing,
        t::Code::UnknownKey => w::ViolationCode::UnknownKey,
        t::Code::InvalidReference => w::ViolationCode::InvalidReference,
        t::Code::InvalidPath => w::ViolationCode::InvalidPath,
        t::Code::InvalidVersion => w::ViolationCode::InvalidVersion,
        t::Code::InvalidProvider => w::ViolationCode::InvalidProvider,
        t::Code::InvalidSha256 => w::ViolationCode::InvalidSha256,
        t::Code::NotAllowed => w::ViolationCode::NotAllowed,
        t::Code::Conflict => w::ViolationCode::Conflict,
        t::Code::Inconsistent => w::ViolationCode::Inconsistent,
    }
}

fn kind_in(k: w::ArtifactKind) -> t::ArtifactKind {
    match k {
        w::ArtifactKind::Kernel => t::ArtifactKind::Kernel,
        w::ArtifactKind::Initrd => t::ArtifactKind::Initrd,
        w::ArtifactKind::Image => t::ArtifactKind::Image,
    }
}

fn kind_out(k: t::ArtifactKind) -> w::ArtifactKind {
    match k {
        t::ArtifactKind::Kernel => w::ArtifactKind::Kernel,
        t::ArtifactKind::Initrd => w::ArtifactKind::Initrd,
        t::ArtifactKind::Image => w::ArtifactKind::Image,
    }
}

fn provider_in(p: w::Provider) -> t::Provider {
    match p {
        w::Provider::Se => t::Provider::Se,
        w::Provider::Tdx => t::Provider::Tdx,
        w::Provider::Snp => t::Provider::Snp,
    }
}

fn provider_out(p: t::Provider) -> w::Provider {
    match p {
        t::Provider::Se => w::Provider::Se,
        t::Provider::Tdx => w::Provider::Tdx,
        t::Provider::Snp => w::Provider::Snp,
    }
}

fn source_in(s: w::ImageSource) -> t::ImageSource {
    match s {
        w::ImageSource::Registry(r) => t::ImageSource::Registry(t::RegistryRef {
            registry: r.registry,
            repository: r.repository,
            tag: r.tag,
            digest: r.digest,
        }),
        w::ImageSource::Layout(l) => t::ImageSource::Layout(t::LayoutRef { path: l.path, tag: l.tag }),
    }
}

fn source_out(s: t::ImageSource) -> w::ImageSource {
    match s {
        t::ImageSource::Registry(r) => w::ImageSource::Registry(w::RegistryRef {
            registry: r.registry,
            repository: r.repository,
            tag: r.tag,
            digest: r.digest,
        }),
        t::ImageSource::Layout(l) => w::ImageSource::Layout(w::LayoutRef { path: l.path, tag: l.tag }),
    }
}

fn plan_in(p: w::Plan) -> t::Plan {
    t::Plan {
        image: p.image,
        source: source_in(p.source),
        provider: provider_in(p.provider),
        version: p.version,
        runtime_configs: p.runtime_configs,
        hypervisor_table: p.hypervisor_table,
        install_dir: p.install_dir,
        drop_in_name: p.drop_in_name,
        artifacts: p
            .artifacts
            .into_iter()
            .map(|a| t::Artifact { kind: kind_in(a.kind), source: a.source, file_name: a.file_name, sha256: a.sha256 })
            .collect(),
    }
}

fn plan_out(p: t::Plan) -> w::Plan {
    w::Plan {
        image: p.image,
        source: source_out(p.source),
        provider: provider_out(p.provider),
        version: p.version,
        runtime_configs: p.runtime_configs,
        hypervisor_table: p.hypervisor_table,
        install_dir: p.install_dir,
        drop_in_name: p.drop_in_name,
        artifacts: p
            .artifacts
            .into_iter()
            .map(|a| w::Artifact { kind: kind_out(a.kind), source: a.source, file_name: a.file_name, sha256: a.sha256 })
            .collect(),
    }
}
