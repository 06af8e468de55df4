// The no_std runtime of a policy component: allocator, panic handler, the canonical ABI
// allocation entry point and the two libc symbols LLVM emits calls to. Without std (and
// so without wasi-libc) the component imports nothing. Shared with the test guests under
// tests/guests through `include!`, so it holds items only (no inner attributes or docs).

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
