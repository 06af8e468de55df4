//! kata-addons: the native runner. It alone performs side effects; every decision about
//! keys, defaults, validation and TOML is made by the policy guest (`guest/`).

pub mod cli;
pub mod configmap;
pub mod extract;
pub mod fetch;
pub mod layout;
pub mod logging;
pub mod policy;
pub mod preview;
pub mod source;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use cli::{Cli, Command, GlobalArgs, PolicyCommand};
use policy::{Policy, PolicyOptions};

/// The embedded policy component, built from `guest/` by `build.rs`.
pub const GUEST_WASM: &[u8] = include_bytes!(env!("KATA_ADDONS_GUEST_WASM"));

/// Policy limits and cache location from the global options.
pub fn policy_options(g: &GlobalArgs) -> Result<PolicyOptions> {
    if !(g.policy_timeout.is_finite() && g.policy_timeout > 0.0 && g.policy_timeout <= 3600.0) {
        bail!("--policy-timeout must be between 0 and 3600 seconds, got {}", g.policy_timeout);
    }
    if g.policy_memory == 0 || g.policy_memory > 4096 {
        bail!("--policy-memory must be between 1 and 4096 MiB, got {}", g.policy_memory);
    }
    Ok(PolicyOptions {
        timeout: Duration::from_secs_f64(g.policy_timeout),
        memory_limit: usize::try_from(g.policy_memory << 20).context("--policy-memory too large")?,
        cache_dir: g.cache_dir.clone().or_else(policy::default_cache_dir),
    })
}

/// Loads the policy selected by `--policy` (or the embedded one).
pub fn load_policy(g: &GlobalArgs) -> Result<Policy> {
    Policy::load(g.policy.as_deref(), policy_options(g)?)
}

/// Runs one command; the exit code for success paths, an error otherwise.
pub fn run(cli: Cli) -> Result<ExitCode> {
    let g = cli.global;
    match cli.command {
        Command::Preview { config, output } => {
            let input = configmap::Input::load(&config)?;
            let policy = load_policy(&g)?;
            let p = preview::compute(&policy, &input)?;
            let stdout = std::io::stdout();
            preview::print(&p, output, &mut stdout.lock())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Policy { command: PolicyCommand::Export { file } } => {
            let bytes = match &g.policy {
                Some(p) => std::fs::read(p).with_context(|| format!("reading {}", p.display()))?,
                None => GUEST_WASM.to_vec(),
            };
            std::fs::write(&file, &bytes).with_context(|| format!("writing {}", file.display()))?;
            eprintln!("wrote {} ({} bytes)", file.display(), bytes.len());
            Ok(ExitCode::SUCCESS)
        }
        Command::Fetch { image, paths, dest, registry } => {
            let rt =
                tokio::runtime::Builder::new_multi_thread().enable_all().build().context("start the async runtime")?;
            rt.block_on(fetch::run_fetch(&image, &paths, &dest, &registry))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Install { .. } | Command::Uninstall { .. } | Command::Status { .. } | Command::Daemon { .. } => {
            bail!("this command is not available in this build yet")
        }
    }
}
