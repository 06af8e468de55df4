//! kata-addons: the native runner. It alone performs side effects; every decision about
//! keys, defaults, validation and TOML is made by the policy guest (`guest/`).

pub mod cli;
pub mod configmap;
pub mod daemon;
pub mod extract;
pub mod fetch;
pub mod install;
pub mod kata_load;
pub mod layout;
pub mod lock;
pub mod logging;
pub mod node;
pub mod nodefs;
pub mod policy;
pub mod preview;
pub mod progress;
pub mod runtime;
pub mod runtime_class;
pub mod runtime_facts;
pub mod source;
pub mod state;
pub mod trust;
pub mod verity;
pub mod webhook;

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

/// Loads the policy component selected by `--policy-component` (or the embedded one).
pub fn load_policy(g: &GlobalArgs) -> Result<Policy> {
    Policy::load(g.policy_component.as_deref(), policy_options(g)?)
}

/// Runs one command; the exit code for success paths, an error otherwise.
pub fn run(cli: Cli) -> Result<ExitCode> {
    let g = cli.global;
    match cli.command {
        Command::Preview { config, output, root, layout } => {
            let input = configmap::Input::load(&config)?;
            let policy = load_policy(&g)?;
            let p = preview::compute_on(&policy, &input, &root, &layout)?;
            let stdout = std::io::stdout();
            preview::print(&p, output, &mut stdout.lock())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Policy { command: PolicyCommand::Export { file } } => {
            let bytes = match &g.policy_component {
                Some(p) => std::fs::read(p).with_context(|| format!("reading {}", p.display()))?,
                None => GUEST_WASM.to_vec(),
            };
            std::fs::write(&file, &bytes).with_context(|| format!("writing {}", file.display()))?;
            eprintln!("wrote {} ({} bytes)", file.display(), bytes.len());
            Ok(ExitCode::SUCCESS)
        }
        Command::Fetch { image, paths, dest, registry, root } => {
            runtime()?.block_on(fetch::run_fetch(&image, &paths, &dest, &registry, &root))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Install { config, registry, node, layout } => {
            let input = configmap::Input::load(&config)?;
            let policy = load_policy(&g)?;
            let (_, plan) = preview::plan_for(&policy, &input, &layout)?;
            let mut opts = source::RegistryOptions::from_args(&registry, &node.root)?;
            opts.trust.root = Some(node.root.clone());
            match runtime()?.block_on(install::install(&policy, &plan, &opts, &node, &layout))? {
                install::Outcome::UpToDate(st) => {
                    println!("up to date: {} {} ({})", st.image, st.version, st.manifest_digest)
                }
                install::Outcome::Repaired(st, what) => {
                    println!("repaired: {} {} ({})", st.image, st.version, st.manifest_digest);
                    for w in &what {
                        println!("  {w}");
                    }
                }
                install::Outcome::Installed(st) => {
                    println!("installed {} {} ({})", st.image, st.version, st.manifest_digest);
                    for f in &st.files {
                        println!("  {:<7} {}  sha256 {}", f.kind, f.path, f.sha256);
                    }
                    for d in &st.drop_ins {
                        println!("  drop-in {}", d.path);
                    }
                    if let Some(t) = &st.trust {
                        println!("  trust   {}", t.summary());
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Uninstall { node, layout } => {
            let done = install::uninstall(&node, &layout)?;
            match &done.state {
                _ if done.nothing() => println!("nothing installed"),
                Some(st) => println!("uninstalled {} {}", st.image, st.version),
                None => println!("no state recorded an install; removed what kata-addons had left on the node"),
            }
            if !done.nothing() {
                for d in &done.drop_ins {
                    println!("  removed drop-in {d}");
                }
                for d in &done.dirs {
                    println!("  removed version directory {}/{d}", kata_addons_facts::INSTALL_DIR);
                }
                for l in &done.leftovers {
                    println!("  removed leftover {l}");
                }
            }
            for p in &done.left_alone {
                println!("  left alone (not kata-addons' to remove; see the warnings): {p}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Status { node, output } => {
            let st = install::status(&node)?;
            match output {
                cli::StatusFormat::Json => {
                    let mut v = serde_json::to_value(&st).context("serialising status")?;
                    v["healthy"] = serde_json::Value::Bool(st.exit_code() == 0);
                    println!("{}", serde_json::to_string_pretty(&v).context("serialising status")?);
                }
                cli::StatusFormat::Text => match &st.state {
                    None => println!("nothing installed"),
                    Some(s) => {
                        println!(
                            "installed: {} {} ({}) for provider {}",
                            s.image, s.version, s.manifest_digest, s.provider
                        );
                        for f in &s.files {
                            println!("  {:<7} {}", f.kind, f.path);
                        }
                        for d in &s.drop_ins {
                            println!("  drop-in {}  (for {})", d.path, d.runtime_config);
                        }
                        if let Some(t) = &s.trust {
                            println!("  trust   {}", t.summary());
                        }
                        for e in &st.effective {
                            println!("  effective [{}] of {}:", e.table, e.runtime_config);
                            for (k, v) in [("kernel", &e.kernel), ("initrd", &e.initrd), ("image", &e.image)] {
                                match v {
                                    Some(v) => println!("    {k:<6} = {:?}  (from {})", v.value, v.from),
                                    None => println!("    {k:<6}   (not set)"),
                                }
                            }
                        }
                        if st.problems.is_empty() {
                            println!("healthy: every file and the drop-in match the state");
                        } else {
                            println!("DRIFTED:");
                            for p in &st.problems {
                                println!("  {p}");
                            }
                        }
                    }
                },
            }
            Ok(ExitCode::from(st.exit_code()))
        }
        Command::Webhook(args) => {
            let opts = args.options()?;
            let policy = load_policy(&g)?;
            runtime()?.block_on(webhook::serve(&opts, policy))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Daemon {
            action,
            config,
            registry,
            node,
            ready_file,
            poll_interval,
            start_jitter,
            layout,
            resync,
            watch,
        } => {
            if !(poll_interval.is_finite() && poll_interval >= 0.1) {
                bail!("--poll-interval must be at least 0.1 seconds");
            }
            if !(start_jitter.is_finite() && (0.0..=3600.0).contains(&start_jitter)) {
                bail!("--start-jitter must be between 0 and 3600 seconds, got {start_jitter}");
            }
            if !(resync.is_finite() && (resync == 0.0 || (0.1..=86400.0).contains(&resync))) {
                bail!("--resync must be 0 (never) or between 0.1 and 86400 seconds");
            }
            let policy = load_policy(&g)?;
            let d = daemon::Daemon {
                action,
                config,
                registry: {
                    let mut o = source::RegistryOptions::from_args(&registry, &node.root)?;
                    o.trust.root = Some(node.root.clone());
                    o
                },
                node,
                ready_file,
                poll_interval: Duration::from_secs_f64(poll_interval),
                start_jitter: Duration::from_secs_f64(start_jitter),
                layout,
                resync: (resync > 0.0).then(|| Duration::from_secs_f64(resync)),
                watch,
            };
            runtime()?.block_on(d.run(&policy))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The async runtime for network commands.
fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")
}
