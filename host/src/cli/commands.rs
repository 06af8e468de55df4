//! The commands: each converts its arguments once ([`super::options`]), calls the domain
//! modules and prints what they did.

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use cap_std::fs::Dir;

use super::{Cli, Command, PolicyCommand, StatusFormat};
use crate::configmap::Input;
use crate::fetch::{self, PullOptions, Wanted};
use crate::install::{self, Outcome};
use crate::source::ImageRef;
use crate::{GUEST_WASM, daemon, metrics, plan, preview, webhook};

/// Runs one command; the exit code for success paths, an error otherwise.
pub fn run(cli: Cli) -> Result<ExitCode> {
    let g = cli.global;
    match cli.command {
        Command::Preview { config, output, root, layout } => {
            let input = Input::load(&config.source())?;
            let policy = g.load_policy()?;
            let p = preview::compute_on(&policy, &input, &root, &layout.selection())?;
            let stdout = std::io::stdout();
            preview::print(&p, output.format(), &mut stdout.lock())?;
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
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut <Cli as clap::CommandFactory>::command(), "kata-addons", &mut script);
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(&script).and_then(|()| stdout.flush()).context("writing the completion script")?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Fetch { image, paths, dest, registry, root } => {
            let pull = registry.pull_options(&root)?;
            runtime()?.block_on(fetch_command(&pull, &image, &paths, &dest))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Install { config, registry, node, layout, force } => {
            // A live daemon would put back its own addon: refused before anything is read
            // (the daemon's own installs run below this, holding the owner lock).
            install::owner::refuse_if_owned(&crate::node::Root::open(&node.root)?, force, "install")?;
            let pull = registry.pull_options(&node.root)?;
            let input = Input::load(&config.source())?;
            let policy = g.load_policy()?;
            let selection = layout.selection();
            let (_, plan) = plan::of(&policy, &input, &selection.kata_prefix)?;
            let mut obs = install::Observed::default();
            let outcome = runtime()?.block_on(install::install_observed(
                &policy,
                &plan,
                &pull,
                &node.site(),
                &selection,
                install::Pin::Reference,
                &mut obs,
            ))?;
            print_install(&outcome);
            if let Some(k) = &obs.kata_release {
                println!("  kata    {k}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Uninstall { node, layout, force } => {
            let done = install::uninstall(&node.site(), &layout.checked_selection()?, force)?;
            print_uninstall(&done);
            Ok(ExitCode::SUCCESS)
        }
        Command::Status { node, output, ready_file } => {
            let depth = if ready_file.is_some() { install::Depth::Size } else { install::Depth::Hash };
            let st = install::status(&node.site(), depth)?;
            let daemon = ready_file.as_deref().map(daemon_readiness).transpose()?;
            print_status(&st, daemon.as_deref(), output)?;
            Ok(ExitCode::from(st.exit_code()))
        }
        Command::ReferenceValues(args) => reference_values(&args),
        Command::Webhook(args) => serve_webhook(&g, &args),
        Command::Daemon(args) => run_daemon(&g, &args),
    }
}

/// `status --ready-file F`: the daemon's readiness lines; not ready (absent, or a
/// not-ready line) is an error saying why.
fn daemon_readiness(f: &Path) -> Result<Vec<String>> {
    match daemon::read_ready(f)? {
        Some(lines) => {
            if let Some(why) = lines.iter().find_map(|l| l.strip_prefix(daemon::NOT_READY)) {
                bail!("the daemon is not ready: {why}");
            }
            Ok(lines)
        }
        None => bail!(
            "the daemon is not ready: {} does not exist (it appears once the daemon's action succeeded, \
             and is absent while another daemon with other input owns the node root; see the daemon's log)",
            f.display()
        ),
    }
}

/// `kata-addons webhook`: serves admission reviews (and `/metrics` when asked) until SIGTERM.
fn serve_webhook(g: &super::GlobalArgs, args: &super::WebhookArgs) -> Result<ExitCode> {
    let options = args.options()?;
    let policy = g.load_policy()?;
    let rt = runtime()?;
    let mut registry = metrics::Registry::default();
    let recorder = metrics::webhook::WebhookMetrics::register(&mut registry);
    if let Some(addr) = options.metrics {
        rt.block_on(metrics::serve::spawn(addr, registry))?;
    }
    rt.block_on(webhook::serve(&options, policy, recorder))?;
    Ok(ExitCode::SUCCESS)
}

/// `kata-addons daemon`: reconciles the node (and serves `/metrics` when asked) until SIGTERM.
fn run_daemon(g: &super::GlobalArgs, args: &super::DaemonArgs) -> Result<ExitCode> {
    let options = args.options()?;
    let policy = g.load_policy()?;
    let rt = runtime()?;
    let mut registry = metrics::Registry::default();
    let recorder = metrics::daemon::DaemonMetrics::register(&mut registry);
    if let Some(addr) = options.metrics {
        rt.block_on(metrics::serve::spawn(addr, registry))?;
    }
    let result = rt.block_on(daemon::Daemon::new(options, recorder).run(&policy));
    // An install abandoned on SIGTERM may still run on the blocking pool: do not
    // wait for it (the node keeps its previous state, as after a crash).
    rt.shutdown_timeout(std::time::Duration::from_millis(100));
    result?;
    Ok(ExitCode::SUCCESS)
}

/// `kata-addons reference-values`: the values of what the state records, printed in the
/// chosen format; exit 1 when one could not be computed, 3 when nothing is installed.
fn reference_values(args: &super::ReferenceValuesArgs) -> Result<ExitCode> {
    let overrides = args.overrides()?;
    let mut keys = crate::attest::publish::host_keys(&args.root, &args.host_key_documents)?;
    let site = crate::node::Site { root: args.root.clone(), lock_timeout: std::time::Duration::ZERO };
    let Some(st) = install::recorded_state(&site)? else {
        eprintln!("nothing installed");
        return Ok(ExitCode::from(3));
    };
    // Without --host-key-document: the documents the install used (`seHostKeyDocuments`).
    if args.host_key_documents.is_empty() {
        let recorded: Vec<String> = st.host_key_documents.iter().map(|d| d.path.clone()).collect();
        keys = crate::attest::publish::node_host_keys(&args.root, &recorded)?.0;
    }
    let root = crate::node::Root::open(&args.root)?;
    let published = crate::attest::publish::of_state(&root, &st, &args.runtime_classes, &overrides, &keys)?;
    let text = match args.output {
        super::ReferenceValuesFormat::Text => published.text(),
        super::ReferenceValuesFormat::Json => published.json()?,
        super::ReferenceValuesFormat::Rvps => published.rvps()?,
    };
    print!("{text}");
    if published.incomplete() {
        for t in &published.targets {
            for (name, reason) in t.unavailable() {
                eprintln!("{}: {name} not computed: {reason}", t.runtime_config);
            }
        }
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// The async runtime for network commands.
fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// `kata-addons fetch`: fetch the paths into `dest` (created if missing) and print
/// each file with its sha256 and size.
async fn fetch_command(pull: &PullOptions, image: &str, paths: &[String], dest: &Path) -> Result<()> {
    let image = ImageRef::parse(image)?;
    std::fs::create_dir_all(dest).with_context(|| format!("create {}", dest.display()))?;
    let dir = Dir::open_ambient_dir(dest, cap_std::ambient_authority())
        .with_context(|| format!("open {}", dest.display()))?;
    let mut wanted = Vec::new();
    let mut seen = HashSet::new();
    for p in paths {
        let base = p.rsplit('/').next().unwrap_or_default().to_string();
        if !seen.insert(base.clone()) {
            bail!("two paths have the same file name {base:?}; fetch them separately");
        }
        wanted.push(Wanted { path: p.clone(), dest_name: base, verity: None, sha256: true });
    }
    let place = dest.display().to_string();
    let report = fetch::Pull::new(pull).files(&image, &wanted, &dir, &place).await?;
    println!("image {image}");
    println!("manifest {}", report.manifest_digest);
    println!("trust {}", report.trust.summary());
    println!("layers read {} of {}", report.layers_read.len(), report.layer_count);
    for f in &report.files {
        println!(
            "{}  {}  {}  {}",
            f.sha256.as_deref().unwrap_or("-"),
            f.size,
            dest.join(&f.dest_name).display(),
            f.path
        );
    }
    Ok(())
}

fn print_install(outcome: &Outcome) {
    match outcome {
        Outcome::UpToDate(st) => println!("up to date: {} {} ({})", st.image, st.version, st.manifest_digest),
        Outcome::Repaired(st, what) => {
            println!("repaired: {} {} ({})", st.image, st.version, st.manifest_digest);
            for w in what {
                println!("  {w}");
            }
        }
        Outcome::Installed(st) => {
            println!("installed {} {} ({})", st.image, st.version, st.manifest_digest);
            for f in &st.files {
                println!("  {:<7} {}  {}", f.kind, f.path, install::describe_record(f));
            }
            for d in &st.drop_ins {
                println!("  drop-in {}", d.path);
            }
            if let Some(t) = &st.trust {
                println!("  trust   {}", t.summary());
            }
            print_published(st);
        }
    }
}

/// The files published for attestation and what they hold (`docs/attestation.md`).
fn print_published(st: &crate::state::State) {
    for p in &st.published {
        match &p.summary {
            Some(s) => println!("  attest  {}: {s}", p.path),
            None => println!("  attest  {}", p.path),
        }
    }
}

fn print_uninstall(done: &install::Uninstalled) {
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
}

fn print_status(st: &install::Status, daemon: Option<&[String]>, output: StatusFormat) -> Result<()> {
    if let (Some(lines), StatusFormat::Text) = (daemon, output) {
        println!("daemon: ready");
        for l in lines {
            println!("  {l}");
        }
    }
    match output {
        StatusFormat::Json => {
            let mut v = serde_json::to_value(st).context("serialising status")?;
            v["healthy"] = serde_json::Value::Bool(st.exit_code() == 0);
            if let Some(lines) = daemon {
                v["daemon"] = serde_json::json!({ "ready": true, "lines": lines });
            }
            println!("{}", serde_json::to_string_pretty(&v).context("serialising status")?);
        }
        StatusFormat::Text => match &st.state {
            None => {
                println!("nothing installed");
                println!("  kata    {}", st.kata_release);
            }
            Some(s) => {
                println!("installed: {} {} ({}) for provider {}", s.image, s.version, s.manifest_digest, s.provider);
                for f in &s.files {
                    println!("  {:<7} {}", f.kind, f.path);
                }
                for d in &s.drop_ins {
                    println!("  drop-in {}  (for {})", d.path, d.runtime_config);
                }
                if let Some(t) = &s.trust {
                    println!("  trust   {}", t.summary());
                }
                print_published(s);
                println!("  kata    {}", st.kata_release);
                if let Some(k) = &s.kata
                    && let Some(w) = k.wanted()
                {
                    println!("  kataVersion {w}: checked at install against {}", k.node);
                }
                for l in &st.registry {
                    println!("  registry {l}");
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
    Ok(())
}
