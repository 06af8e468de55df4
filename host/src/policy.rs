//! The policy sandbox: loads a policy component, refuses any component that imports
//! anything, and runs its three functions under a wall-clock deadline and a memory cap,
//! with a fresh instance per call. Nothing else in the runner touches wasmtime.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};
use wasmtime::component::{Component, Linker};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, ModuleVersionStrategy, PoolingAllocationConfig, ResourceLimiter, Store,
    StoreLimits, StoreLimitsBuilder, Trap,
};

mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "policy",
        additional_derives: [PartialEq, Eq],
    });
}

pub use bindings::{
    Artifact, ArtifactKind, DropIn, EffectiveKey, ExtensionImage, Filesystem, ImageSource, InstalledFile, KeyValue,
    LayoutRef, NodeOptions, Plan, Provider, RegistryRef, RuntimeConfigFacts, VerityParams, VeritySource, Violation,
    ViolationCode,
};

use kata_addons_facts::reference::check_parts;
use kata_addons_facts::{
    DEFAULT_KATA_PREFIX, DROP_IN_NAME, file_name, is_clean_path as is_clean_abs_path, is_configuration_file_name,
    is_plain_file_name, is_sha256_hex, parent_dir,
};

/// WIT names of the enums the node records and prints (`Display`, and the serde form of
/// the state's `kind` and `provider`).
macro_rules! wit_names {
    ($ty:ident { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// Every value, in WIT order.
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];

            /// The WIT name.
            pub fn name(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.pad(self.name())
            }
        }

        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
                s.serialize_str(self.name())
            }
        }

        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                $ty::ALL.iter().copied().find(|v| v.name() == s).ok_or_else(|| {
                    let names: Vec<&str> = $ty::ALL.iter().map(|v| v.name()).collect();
                    serde::de::Error::custom(format!("unknown {} {s:?} (known: {})", stringify!($ty), names.join(", ")))
                })
            }
        }
    };
}

wit_names!(ArtifactKind { Kernel => "kernel", Initrd => "initrd", Image => "image", Extension => "extension" });
wit_names!(Provider { Se => "se", Tdx => "tdx", Snp => "snp" });
/// Most runtime configurations a plan may name.
const MAX_RUNTIME_CONFIGS: usize = 32;

/// How often the epoch ticker advances the engine's epoch.
const TICK: Duration = Duration::from_millis(5);
/// Most env entries a policy may return.
const MAX_ENV: usize = 64;
/// Most bytes in one returned string (name, value, path, message).
const MAX_STRING: usize = 8 * 1024;
/// Most violations a policy may return.
const MAX_VIOLATIONS: usize = 256;
/// Most bytes of drop-in text.
const MAX_DROP_IN: usize = 64 * 1024;
/// Most artifacts in a plan.
const MAX_ARTIFACTS: usize = 8;
/// Most elements in one table of an instance (each costs a pointer of host memory).
const MAX_TABLE_ELEMENTS: usize = 100_000;
/// Largest compiled artifact the cache will read back.
const MAX_CACHE_ENTRY: u64 = 256 << 20;
/// First line of a cache entry's checksum file.
const CACHE_FORMAT: &str = "kata-addons policy cache v1";
/// Native stack wasm code may use (wasmtime's default, stated explicitly).
const MAX_WASM_STACK: usize = 512 << 10;

/// Limits and caching for a [`Policy`].
#[derive(Debug, Clone)]
pub struct PolicyOptions {
    /// Longest wall-clock time of one call.
    pub timeout: Duration,
    /// Most linear memory of one instance, in bytes.
    pub memory_limit: usize,
    /// Where compiled components are cached; `None` disables the cache.
    pub cache_dir: Option<PathBuf>,
}

impl Default for PolicyOptions {
    fn default() -> Self {
        PolicyOptions { timeout: Duration::from_secs(1), memory_limit: 64 << 20, cache_dir: default_cache_dir() }
    }
}

/// `$XDG_CACHE_HOME/kata-addons`, else `$HOME/.cache/kata-addons`.
pub fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("kata-addons"))
}

/// Why a policy call did not produce a usable answer.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The policy rejected the input (exit code 2).
    #[error("invalid configuration:\n{}", format_violations(.0))]
    Rejected(Vec<Violation>),
    /// `render` refused because of the node's own configuration: every violation has code
    /// `node-refuses` and names a node file (exit code 1: the ConfigMap is not at fault).
    #[error("the node's configuration refuses this addon:\n{}", format_violations(.0))]
    NodeRefuses(Vec<Violation>),
    /// The call ran past the deadline.
    #[error(
        "policy `{func}` did not finish within {limit:?} (raise --policy-timeout if the policy is legitimately slow)"
    )]
    Timeout {
        /// The function called.
        func: &'static str,
        /// The deadline.
        limit: Duration,
    },
    /// The instance tried to grow memory past the cap.
    #[error("policy `{func}` tried to use more than {limit} MiB of memory (--policy-memory)")]
    Memory {
        /// The function called.
        func: &'static str,
        /// The cap, in MiB.
        limit: usize,
    },
    /// The guest trapped (a panic in the guest ends in a trap).
    #[error("policy `{func}` crashed: {detail}")]
    Trap {
        /// The function called.
        func: &'static str,
        /// What the trap said.
        detail: String,
    },
    /// The guest answered, but the host refuses to act on the answer.
    #[error("policy `{func}` returned output the runner refuses: {detail}")]
    BadOutput {
        /// The function called.
        func: &'static str,
        /// What is wrong with it.
        detail: String,
    },
}

/// One line per violation: `key: message [code]`.
pub fn format_violations(v: &[Violation]) -> String {
    v.iter().map(|v| format!("  {}: {} [{}]", v.key, v.message, code_name(v.code))).collect::<Vec<_>>().join("\n")
}

/// The WIT name of a violation code.
pub fn code_name(c: ViolationCode) -> &'static str {
    match c {
        ViolationCode::Missing => "missing",
        ViolationCode::UnknownKey => "unknown-key",
        ViolationCode::InvalidReference => "invalid-reference",
        ViolationCode::InvalidPath => "invalid-path",
        ViolationCode::InvalidVersion => "invalid-version",
        ViolationCode::InvalidProvider => "invalid-provider",
        ViolationCode::InvalidSha256 => "invalid-sha256",
        ViolationCode::NotAllowed => "not-allowed",
        ViolationCode::Conflict => "conflict",
        ViolationCode::Inconsistent => "inconsistent",
        ViolationCode::InvalidVerity => "invalid-verity",
        ViolationCode::InvalidName => "invalid-name",
        ViolationCode::NodeRefuses => "node-refuses",
    }
}

/// Per-call store data: the resource limits, and whether they refused something.
struct CallState {
    limits: StoreLimits,
    /// Set when the limiter refused a memory growth (bytes requested).
    memory_denied: Option<usize>,
    /// Set when the limiter refused a table growth (elements requested).
    table_denied: Option<usize>,
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
struct Ticker {
    stop: Arc<AtomicBool>,
    active: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl Ticker {
    fn start(engine: Engine) -> Result<Ticker> {
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
    fn begin(&self) -> TickGuard<'_> {
        if self.active.fetch_add(1, Ordering::AcqRel) == 0
            && let Some(t) = &self.thread
        {
            t.thread().unpark();
        }
        TickGuard(&self.active)
    }
}

/// One running call (see [`Ticker::begin`]).
struct TickGuard<'a>(&'a AtomicUsize);

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

/// How a component was obtained, for logs and benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadedFrom {
    /// Compiled now (no cache, or cache miss).
    Compiled,
    /// Deserialized from a verified cache entry.
    Cache,
}

/// A loaded, validated policy component, ready to be called.
pub struct Policy {
    engine: Engine,
    pre: bindings::PolicyPre<CallState>,
    options: PolicyOptions,
    sha256: String,
    loaded_from: LoadedFrom,
    ticker: Ticker,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy").field("sha256", &self.sha256).field("loaded_from", &self.loaded_from).finish()
    }
}

impl Policy {
    /// Loads the embedded policy component.
    pub fn embedded(options: PolicyOptions) -> Result<Policy> {
        Policy::from_bytes(crate::GUEST_WASM, options).context("loading the embedded policy component")
    }

    /// Loads the component at `path` (`--policy-component FILE`).
    pub fn from_file(path: &Path, options: PolicyOptions) -> Result<Policy> {
        let bytes = std::fs::read(path).with_context(|| format!("reading policy component {}", path.display()))?;
        Policy::from_bytes(&bytes, options).with_context(|| format!("loading policy component {}", path.display()))
    }

    /// Loads `--policy-component FILE` if given, else the embedded component.
    pub fn load(path: Option<&Path>, options: PolicyOptions) -> Result<Policy> {
        match path {
            Some(p) => Policy::from_file(p, options),
            None => Policy::embedded(options),
        }
    }

    /// Validates and compiles (or loads from cache) a component from its bytes. A component
    /// that imports anything is refused here, before it is cached or instantiated.
    pub fn from_bytes(bytes: &[u8], options: PolicyOptions) -> Result<Policy> {
        if Engine::detect_precompiled(bytes).is_some() {
            bail!("this is a precompiled artifact, not a WebAssembly component; pass the .wasm component");
        }
        let sha256 = hex::encode(Sha256::digest(bytes));
        let engine = new_engine(&sha256)?;
        let (component, loaded_from, pending) = match &options.cache_dir {
            Some(dir) => load_cached(&engine, bytes, &sha256, dir)?,
            None => (compile(&engine, bytes)?, LoadedFrom::Compiled, None),
        };
        let imports: Vec<String> =
            component.component_type().imports(&engine).map(|(name, _)| name.to_string()).collect();
        if !imports.is_empty() {
            bail!(
                "policy components must import nothing (no WASI, no host functions), but this one imports: {}",
                imports.join(", ")
            );
        }
        let linker: Linker<CallState> = Linker::new(&engine);
        let instance_pre = linker.instantiate_pre(&component).map_err(anyhow::Error::from).context(
            "the component does not match the kata-addons policy world (wit/kata-addons.wit): missing or mistyped exports",
        )?;
        let pre = bindings::PolicyPre::new(instance_pre)
            .map_err(anyhow::Error::from)
            .context("the component does not export `env`, `plan` and `render` as wit/kata-addons.wit defines them")?;
        // Only a component that passed every check is written to the cache.
        if let Some(entry) = pending {
            entry.store();
        }
        let ticker = Ticker::start(engine.clone())?;
        Ok(Policy { engine, pre, options, sha256, loaded_from, ticker })
    }

    /// sha256 (hex) of the component bytes.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// Whether the component came from the cache or was compiled.
    pub fn loaded_from(&self) -> LoadedFrom {
        self.loaded_from
    }

    /// ConfigMap data -> resolved `ADDON_*` env.
    pub fn env(&self, data: &[KeyValue]) -> Result<Vec<KeyValue>, PolicyError> {
        let out = self.call("env", |p, s| p.call_env(s, data))?;
        let env = out.map_err(|v| self.rejected("env", v))?;
        check_env("env", &env)?;
        Ok(env)
    }

    /// `ADDON_*` env -> install plan, for kata-deploy's default prefix.
    pub fn plan(&self, env: &[KeyValue]) -> Result<Plan, PolicyError> {
        self.plan_for(env, &NodeOptions { kata_prefix: DEFAULT_KATA_PREFIX.to_string() })
    }

    /// `ADDON_*` env + node facts (`--kata-prefix`) -> install plan.
    pub fn plan_for(&self, env: &[KeyValue], node: &NodeOptions) -> Result<Plan, PolicyError> {
        let out = self.call("plan", |p, s| p.call_plan(s, env, node))?;
        let plan = out.map_err(|v| self.rejected("plan", v))?;
        check_plan(&plan)?;
        Ok(plan)
    }

    /// Plan + installed node paths + the facts of each resolved runtime configuration
    /// found on the node -> one drop-in per runtime configuration, each checked to sit
    /// directly in the `config.d` beside its configuration. A refusal whose violations
    /// are all `node-refuses` is [`PolicyError::NodeRefuses`].
    pub fn render(
        &self,
        plan: &Plan,
        installed: &[InstalledFile],
        runtime_configs: &[RuntimeConfigFacts],
    ) -> Result<Vec<DropIn>, PolicyError> {
        let out = self.call("render", |p, s| p.call_render(s, plan, installed, runtime_configs))?;
        let drop_ins = out.map_err(|v| match self.rejected("render", v) {
            PolicyError::Rejected(v) if v.iter().all(|v| v.code == ViolationCode::NodeRefuses) => {
                PolicyError::NodeRefuses(v)
            }
            other => other,
        })?;
        check_drop_ins(runtime_configs, &drop_ins)?;
        Ok(drop_ins)
    }

    fn rejected(&self, func: &'static str, v: Vec<Violation>) -> PolicyError {
        if v.is_empty() {
            return bad(func, "rejected the input without saying why (empty violation list)".into());
        }
        if v.len() > MAX_VIOLATIONS {
            return bad(func, format!("returned {} violations, more than {MAX_VIOLATIONS}", v.len()));
        }
        if let Some(v) = v.iter().find(|v| v.key.len() > MAX_STRING || v.message.len() > MAX_STRING) {
            return bad(
                func,
                format!("violation text longer than {MAX_STRING} bytes (key starts {:?})", prefix(&v.key)),
            );
        }
        PolicyError::Rejected(v)
    }

    /// Instantiates a fresh instance in a fresh store, with limits, and runs `f`.
    fn call<R>(
        &self,
        func: &'static str,
        f: impl FnOnce(&bindings::Policy, &mut Store<CallState>) -> wasmtime::Result<R>,
    ) -> Result<R, PolicyError> {
        let limits = StoreLimitsBuilder::new()
            .memory_size(self.options.memory_limit)
            .table_elements(MAX_TABLE_ELEMENTS)
            .trap_on_grow_failure(true)
            .instances(16)
            .memories(4)
            .tables(16)
            .build();
        let mut store = Store::new(&self.engine, CallState { limits, memory_denied: None, table_denied: None });
        store.limiter(|s| s);
        let ticks = self.options.timeout.as_nanos().div_ceil(TICK.as_nanos()).max(1);
        let _running = self.ticker.begin();
        // The deadline also covers instantiation (a component may run start functions).
        store.set_epoch_deadline(u64::try_from(ticks).unwrap_or(u64::MAX));
        store.epoch_deadline_trap();
        let result = self.pre.instantiate(&mut store).and_then(|instance| f(&instance, &mut store));
        result.map_err(|e| self.classify(func, e, store.data()))
    }

    fn classify(&self, func: &'static str, e: wasmtime::Error, state: &CallState) -> PolicyError {
        let trap = e.downcast_ref::<Trap>().copied();
        if trap == Some(Trap::Interrupt) {
            return PolicyError::Timeout { func, limit: self.options.timeout };
        }
        if state.memory_denied.is_some() || trap == Some(Trap::AllocationTooLarge) {
            return PolicyError::Memory { func, limit: self.options.memory_limit >> 20 };
        }
        let detail = match trap {
            Some(Trap::UnreachableCodeReached) => {
                "the guest aborted (a panic or `unreachable`: wasm `unreachable` instruction executed)".to_string()
            }
            Some(Trap::StackOverflow) => "stack overflow (unbounded recursion in the guest)".to_string(),
            _ if state.table_denied.is_some() => {
                format!("a table grew past {MAX_TABLE_ELEMENTS} elements ({e})")
            }
            // Other traps (out-of-bounds access, bad canonical-ABI data, ...): wasmtime's own text.
            _ => format!("{e:#}"),
        };
        PolicyError::Trap { func, detail }
    }
}

fn bad(func: &'static str, detail: String) -> PolicyError {
    PolicyError::BadOutput { func, detail }
}

fn prefix(s: &str) -> &str {
    let mut end = s.len().min(40);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The engine: component model and epoch interruption; no 64-bit memories (and no threads).
/// The compiled-artifact version string names the component (`kata-addons:<sha256>`), so
/// wasmtime itself refuses to load a cache entry compiled from any other component.
fn new_engine(component_sha256: &str) -> Result<Engine> {
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

fn compile(engine: &Engine, bytes: &[u8]) -> Result<Component> {
    Component::new(engine, bytes).map_err(anyhow::Error::from).context("compiling the policy component")
}

/// The engine compatibility hash, as 16 hex digits.
fn engine_hash(engine: &Engine) -> String {
    let mut h = std::hash::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    format!("{:016x}", h.finish())
}

/// The checksum file of a cache entry: format line, what the entry was compiled from and
/// for, and the sha256 of the compiled bytes. All four must match before the entry is used.
fn cache_manifest(component_sha256: &str, engine_hash: &str, cwasm_sha256: &str) -> String {
    format!("{CACHE_FORMAT}\ncomponent-sha256 {component_sha256}\nengine {engine_hash}\ncwasm-sha256 {cwasm_sha256}\n")
}

/// A compiled component waiting to be written to the cache (after it passed validation).
struct PendingEntry {
    dir: PathBuf,
    artifact: PathBuf,
    checksum: PathBuf,
    compiled: Vec<u8>,
    manifest: String,
}

impl PendingEntry {
    /// Writes the entry; a cache that cannot be written is not an error.
    fn store(self) {
        if let Err(e) = store_cache_entry(&self) {
            tracing::debug!(dir = %self.dir.display(), error = %format!("{e:#}"), "policy cache not written");
        }
    }
}

/// Reads a verified cache entry, or says why there is none.
fn read_cache_entry(engine: &Engine, artifact: &Path, checksum: &Path, expected: &str) -> Result<Option<Component>> {
    let Ok(manifest) = std::fs::read_to_string(checksum) else { return Ok(None) };
    let Ok(meta) = std::fs::metadata(artifact) else { return Ok(None) };
    if !meta.is_file() || meta.len() > MAX_CACHE_ENTRY {
        bail!("not a regular file of at most {MAX_CACHE_ENTRY} bytes");
    }
    let data = std::fs::read(artifact).context("reading")?;
    let actual = cache_manifest_lines(&manifest);
    let wanted = cache_manifest_lines(expected);
    // Format, component and engine lines first: a foreign entry is refused before hashing.
    if actual.len() != 4 || actual[..3] != wanted[..3] {
        bail!("checksum file is for another component, engine or format");
    }
    if hex::encode(Sha256::digest(&data)) != actual[3].strip_prefix("cwasm-sha256 ").unwrap_or_default() {
        bail!("compiled bytes do not match their checksum (corrupt or truncated)");
    }
    // SAFETY: the bytes match the sha256 recorded when this program wrote them (by
    // `precompile_component` below) for this exact component and an engine with the same
    // compatibility hash; wasmtime further checks the header and that the embedded version
    // string names this component (see `new_engine`). What runs is still checked: the
    // import check and the typed exports are verified on the loaded component.
    let component = unsafe { Component::deserialize(engine, &data) }.map_err(anyhow::Error::from)?;
    Ok(Some(component))
}

/// The lines of a checksum file, trimmed.
fn cache_manifest_lines(text: &str) -> Vec<&str> {
    text.lines().map(str::trim).filter(|l| !l.is_empty()).collect()
}

/// Loads a precompiled component from `dir` if a verified entry exists, else compiles it
/// and returns the entry to write once the component passed validation.
fn load_cached(
    engine: &Engine,
    bytes: &[u8],
    sha256: &str,
    dir: &Path,
) -> Result<(Component, LoadedFrom, Option<PendingEntry>)> {
    let hash = engine_hash(engine);
    let key = format!("{sha256}-{hash}");
    let artifact = dir.join(format!("{key}.cwasm"));
    let checksum = dir.join(format!("{key}.cwasm.sha256"));
    // The expected manifest, minus the cwasm digest (which only the entry itself knows).
    let expected = cache_manifest(sha256, &hash, "");
    match read_cache_entry(engine, &artifact, &checksum, &expected) {
        Ok(Some(c)) => return Ok((c, LoadedFrom::Cache, None)),
        Ok(None) => {}
        Err(e) => tracing::warn!(
            path = %artifact.display(), error = %format!("{e:#}"), "discarding policy cache entry; recompiling"
        ),
    }
    let compiled =
        engine.precompile_component(bytes).map_err(anyhow::Error::from).context("compiling the policy component")?;
    // SAFETY: `compiled` was produced just now by `precompile_component` on this engine.
    let component = unsafe { Component::deserialize(engine, &compiled) }
        .map_err(anyhow::Error::from)
        .context("loading the freshly compiled policy component")?;
    let manifest = cache_manifest(sha256, &hash, &hex::encode(Sha256::digest(&compiled)));
    let pending = PendingEntry { dir: dir.to_path_buf(), artifact, checksum, compiled, manifest };
    Ok((component, LoadedFrom::Compiled, Some(pending)))
}

fn store_cache_entry(e: &PendingEntry) -> Result<()> {
    std::fs::create_dir_all(&e.dir).with_context(|| format!("creating {}", e.dir.display()))?;
    // Checksum file last: until it is in place, the entry is incomplete and ignored.
    write_atomic(&e.dir, &e.artifact, &e.compiled)?;
    write_atomic(&e.dir, &e.checksum, e.manifest.as_bytes())?;
    Ok(())
}

fn write_atomic(dir: &Path, path: &Path, data: &[u8]) -> Result<()> {
    let tmp =
        dir.join(format!(".tmp-{}-{}", std::process::id(), path.file_name().and_then(|n| n.to_str()).unwrap_or("x")));
    std::fs::write(&tmp, data).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| {
        let _ = std::fs::remove_file(&tmp);
        format!("renaming into {}", path.display())
    })
}

/// `ADDON_[A-Z0-9_]+`.
fn valid_env_name(name: &str) -> bool {
    name.strip_prefix("ADDON_").is_some_and(|rest| {
        !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
    })
}

fn check_env(func: &'static str, env: &[KeyValue]) -> Result<(), PolicyError> {
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
fn check_plan(plan: &Plan) -> Result<(), PolicyError> {
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
fn check_drop_ins(runtime_configs: &[RuntimeConfigFacts], drop_ins: &[DropIn]) -> Result<(), PolicyError> {
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
