//! A loaded policy component and its three calls (`env`, `plan`, `render`), each in a fresh
//! instance of the sandbox, each answer re-validated before the runner uses it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use wasmtime::component::Linker;
use wasmtime::{Engine, Store, StoreLimitsBuilder, Trap};

use kata_addons_facts::DEFAULT_KATA_PREFIX;

use super::bindings::{
    DropIn, InstalledFile, KeyValue, NodeOptions, Plan, PolicyPre, RuntimeConfigFacts, Violation, ViolationCode, World,
};
use super::cache::{LoadedFrom, compile, load_cached};
use super::checks::{MAX_STRING, MAX_VIOLATIONS, check_drop_ins, check_env, check_plan};
use super::error::{PolicyError, bad, prefix};
use super::sandbox::{CallState, MAX_TABLE_ELEMENTS, TICK, Ticker, new_engine};

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

/// A loaded, validated policy component, ready to be called.
pub struct Policy {
    engine: Engine,
    pre: PolicyPre<CallState>,
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
        let sha256 = crate::hash::sha256_hex(bytes);
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
        let pre = PolicyPre::new(instance_pre)
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
        f: impl FnOnce(&World, &mut Store<CallState>) -> wasmtime::Result<R>,
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
