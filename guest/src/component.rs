//! The thin wit-bindgen layer: converts between the generated WIT types and the
//! plain-Rust policy, plus the no_std runtime pieces (allocator, panic handler).

use alloc::string::String;
use alloc::vec::Vec;

use crate::types as t;

wit_bindgen::generate!({
    path: "../wit",
    world: "policy",
});

use self as w;

/// Linear-memory allocator: dlmalloc grows memory with `memory.grow`, importing nothing.
#[global_allocator]
static ALLOC: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

/// A panic aborts the call with a trap; the host reports it as a policy failure.
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    core::arch::wasm32::unreachable()
}

/// The canonical ABI's allocation entry point. On `wasm32-wasip2` it normally comes
/// from std (wasi-libc); this component has no std, so it exports its own.
///
/// # Safety
/// Called only by the component runtime with a layout it obtained from a previous call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cabi_realloc(old_ptr: *mut u8, old_len: usize, align: usize, new_len: usize) -> *mut u8 {
    use alloc::alloc::{Layout, alloc, realloc};
    if new_len == 0 {
        return align as *mut u8;
    }
    // SAFETY: the canonical ABI passes a power-of-two alignment and sizes it allocated.
    let ptr = unsafe {
        if old_len == 0 {
            alloc(Layout::from_size_align_unchecked(new_len, align))
        } else {
            realloc(old_ptr, Layout::from_size_align_unchecked(old_len, align), new_len)
        }
    };
    if ptr.is_null() {
        core::arch::wasm32::unreachable();
    }
    ptr
}

struct Component;

export!(Component);

impl Guest for Component {
    fn env(data: Vec<w::KeyValue>) -> Result<Vec<w::KeyValue>, Vec<w::Violation>> {
        let data: Vec<t::KeyValue> = data.into_iter().map(kv_in).collect();
        crate::env(&data).map(|env| env.into_iter().map(kv_out).collect()).map_err(violations_out)
    }

    fn plan(env: Vec<w::KeyValue>) -> Result<w::Plan, Vec<w::Violation>> {
        let env: Vec<t::KeyValue> = env.into_iter().map(kv_in).collect();
        crate::plan(&env).map(plan_out).map_err(violations_out)
    }

    fn render(plan: w::Plan, installed: Vec<w::InstalledFile>) -> Result<String, Vec<w::Violation>> {
        let plan = plan_in(plan);
        let installed: Vec<t::InstalledFile> =
            installed.into_iter().map(|f| t::InstalledFile { kind: kind_in(f.kind), path: f.path }).collect();
        crate::render(&plan, &installed).map_err(violations_out)
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
        runtime_config: p.runtime_config,
        hypervisor_table: p.hypervisor_table,
        install_dir: p.install_dir,
        drop_in_path: p.drop_in_path,
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
        runtime_config: p.runtime_config,
        hypervisor_table: p.hypervisor_table,
        install_dir: p.install_dir,
        drop_in_path: p.drop_in_path,
        artifacts: p
            .artifacts
            .into_iter()
            .map(|a| w::Artifact { kind: kind_out(a.kind), source: a.source, file_name: a.file_name, sha256: a.sha256 })
            .collect(),
    }
}

/// `memcmp` for slice and string comparisons. On `wasm32-wasip2` it normally comes from
/// wasi-libc; this component links no libc, so it defines its own (importing nothing).
///
/// # Safety
/// `a` and `b` must be valid for reads of `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    let mut i = 0;
    while i < n {
        // SAFETY: the caller guarantees both regions hold `n` readable bytes.
        let (x, y) = unsafe { (*a.add(i), *b.add(i)) };
        if x != y {
            return i32::from(x) - i32::from(y);
        }
        i += 1;
    }
    0
}

/// `bcmp` (equality-only `memcmp`), which LLVM may emit for `==` on slices.
///
/// # Safety
/// `a` and `b` must be valid for reads of `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: same contract as `memcmp`.
    unsafe { memcmp(a, b, n) }
}
