// Shared no_std runtime pieces of the test guests, pulled in with `include!`: the
// component imports nothing, exactly like the real guest (guest/src/component.rs).

extern crate alloc;

#[global_allocator]
static ALLOC: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    core::arch::wasm32::unreachable()
}

/// The canonical ABI allocation entry point (std would provide it; these guests have none).
///
/// # Safety
/// Called only by the component runtime.
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
        runtime_config: "/etc/kata-containers/kata-tdx/configuration.toml".to_string(),
        hypervisor_table: "hypervisor.qemu".to_string(),
        install_dir: "/etc/kata-containers/addons".to_string(),
        drop_in_path: "/etc/kata-containers/kata-tdx/config.d/50-kata-addons.toml".to_string(),
        artifacts: vec![Artifact {
            kind: ArtifactKind::Kernel,
            source: kernel.to_string(),
            file_name: "vmlinuz".to_string(),
            sha256: None,
        }],
    }
}

#[allow(dead_code)]
fn unused(_: String) {}

/// `memcmp`: wasi-libc would provide it; these guests link no libc.
///
/// # Safety
/// `a` and `b` must be valid for reads of `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    let mut i = 0;
    while i < n {
        // SAFETY: the caller guarantees both regions hold `n` readable bytes.
        let (x, y) = unsafe { (core::ptr::read_volatile(a.add(i)), core::ptr::read_volatile(b.add(i))) };
        if x != y {
            return i32::from(x) - i32::from(y);
        }
        i += 1;
    }
    0
}

/// `bcmp`, which LLVM may emit for `==` on slices.
///
/// # Safety
/// `a` and `b` must be valid for reads of `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: same contract as `memcmp`.
    unsafe { memcmp(a, b, n) }
}
