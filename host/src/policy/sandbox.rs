//! The sandbox around one policy call: the engine configuration (component model, epoch
//! interruption, pooling, no threads or 64-bit memories), the per-call resource limiter,
//! and the epoch ticker that enforces the wall-clock deadline.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, ModuleVersionStrategy, PoolingAllocationConfig, ResourceLimiter,
    StoreLimits,
};

/// How often the epoch ticker advances the engine's epoch.
pub(super) const TICK: Duration = Duration::from_millis(5);
/// Most elements in one table of an instance (each costs a pointer of host memory).
pub(super) const MAX_TABLE_ELEMENTS: usize = 100_000;
/// Native stack wasm code may use (wasmtime's default, stated explicitly).
pub(super) const MAX_WASM_STACK: usize = 512 << 10;

/// Per-call store data: the resource limits, and whether they refused something.
pub(super) struct CallState {
    pub(super) limits: StoreLimits,
    /// Set when the limiter refused a memory growth (bytes requested).
    pub(super) memory_denied: Option<usize>,
    /// Set when the limiter refused a table growth (elements requested).
    pub(super) table_denied: Option<usize>,
}

/// [`StoreLimits`] (with trap on failed grow), plus a record of what was refused, so the
/// error is classified from facts rather than from wasmtime's message text.
impl ResourceLimiter for CallState {
    fn memory_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        let r = self.limits.memory_growing(current, desired, maximum);
        if !matches!(r, Ok(true)) {
            self.memory_denied = Some(desired);
        }
        r
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.memory_denied.get_or_insert(0);
        self.limits.memory_grow_failed(error)
    }

    fn table_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        let r = self.limits.table_growing(current, desired, maximum);
        if !matches!(r, Ok(true)) {
            self.table_denied = Some(desired);
        }
        r
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.table_denied.get_or_insert(0);
        self.limits.table_grow_failed(error)
    }

    fn instances(&self) -> usize {
        self.limits.instances()
    }

    fn tables(&self) -> usize {
        self.limits.tables()
    }

    fn memories(&self) -> usize {
        self.limits.memories()
    }
}

/// Advances the engine epoch every [`TICK`] while at least one call is running; parks
/// otherwise (an idle runner does not wake up 200 times a second). Stops when dropped.
pub(super) struct Ticker {
    stop: Arc<AtomicBool>,
    active: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl Ticker {
    pub(super) fn start(engine: Engine) -> Result<Ticker> {
        let stop = Arc::new(AtomicBool::new(false));
        let active = Arc::new(AtomicUsize::new(0));
        let (flag, busy) = (Arc::clone(&stop), Arc::clone(&active));
        let thread = std::thread::Builder::new()
            .name("policy-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Acquire) {
                    if busy.load(Ordering::Acquire) == 0 {
                        // Woken by `Ticker::begin` (or drop); a wake-up before the park is not lost.
                        std::thread::park();
                        continue;
                    }
                    std::thread::sleep(TICK);
                    engine.increment_epoch();
                }
            })
            .context("starting the policy epoch ticker thread")?;
        Ok(Ticker { stop, active, thread: Some(thread) })
    }

    /// Marks a call as running until the guard is dropped.
    pub(super) fn begin(&self) -> TickGuard<'_> {
        if self.active.fetch_add(1, Ordering::AcqRel) == 0
            && let Some(t) = &self.thread
        {
            t.thread().unpark();
        }
        TickGuard(&self.active)
    }
}

/// One running call (see [`Ticker::begin`]).
pub(super) struct TickGuard<'a>(&'a AtomicUsize);

impl Drop for TickGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

/// The engine: component model and epoch interruption; no 64-bit memories (and no threads).
/// The compiled-artifact version string names the component (`kata-addons:<sha256>`), so
/// wasmtime itself refuses to load a cache entry compiled from any other component.
pub(super) fn new_engine(component_sha256: &str) -> Result<Engine> {
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    // Threads and shared memories: the `threads` cargo feature of wasmtime is not compiled in.
    config.wasm_memory64(false);
    config.max_wasm_stack(MAX_WASM_STACK);
    // Pooling: instance slots (memories, tables) are reserved once and reused, so the
    // fresh instance every call gets costs little. Slots are sized for the largest
    // --policy-memory so the per-call `StoreLimits` stays the one that refuses growth.
    let mut pool = PoolingAllocationConfig::new();
    pool.total_component_instances(4)
        .total_core_instances(16)
        .total_memories(8)
        .total_tables(16)
        .max_memory_size(4 << 30)
        .table_elements(100_000);
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    config
        .module_version(ModuleVersionStrategy::Custom(format!("kata-addons:{component_sha256}")))
        .map_err(anyhow::Error::from)
        .context("configuring the wasmtime engine")?;
    Engine::new(&config).map_err(anyhow::Error::from).context("creating the wasmtime engine")
}
