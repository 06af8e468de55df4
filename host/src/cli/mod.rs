//! The command layer: the command line (clap types, the contract of docs/design.md#cli), its
//! conversion into domain options with every flag range check ([`options`]), and the
//! commands themselves ([`commands`]). Nothing below this layer names a clap type.

mod commands;
mod options;

use std::net::SocketAddr;
use std::path::PathBuf;

pub use commands::run;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Install custom Kata Containers guest artifacts (kernel, initrd, image) from OCI images.
#[derive(Debug, Parser)]
#[command(name = "kata-addons", version, about, long_about = None)]
pub struct Cli {
    /// Options that apply to every command.
    #[command(flatten)]
    pub global: GlobalArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Options accepted by every command.
#[derive(Debug, Clone, Args)]
pub struct GlobalArgs {
    /// Run this policy component (Wasm) instead of the embedded one.
    #[arg(long, global = true, value_name = "FILE")]
    pub policy_component: Option<PathBuf>,
    /// Longest time one policy call may run, in seconds.
    #[arg(long, global = true, value_name = "SECONDS", default_value_t = 1.0)]
    pub policy_timeout: f64,
    /// Most linear memory one policy call may use, in MiB.
    #[arg(long, global = true, value_name = "MIB", default_value_t = 64)]
    pub policy_memory: u64,
    /// Where compiled policy components are cached (default: $XDG_CACHE_HOME/kata-addons).
    #[arg(long, global = true, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Log line format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Where the addon configuration comes from (else the `ADDON_*` environment).
#[derive(Debug, Clone, Default, Args)]
pub struct ConfigArgs {
    /// A ConfigMap as YAML or JSON (whole object or bare key/value map); `-` for stdin.
    #[arg(long, value_name = "FILE", conflicts_with = "configmap_dir")]
    pub configmap: Option<PathBuf>,
    /// A ConfigMap mounted as a volume: one file per key.
    #[arg(long, value_name = "DIR")]
    pub configmap_dir: Option<PathBuf>,
}

/// How to reach registries. Defaults: the node's own files beneath `--root`
/// (docs/design.md#node-configuration).
#[derive(Debug, Clone, Default, Args)]
pub struct RegistryArgs {
    /// The only auth file read (containers auth.json / docker config.json); default: the
    /// containers-auth.json(5) search with the node pull secret `ROOT/var/lib/kubelet/config.json`.
    #[arg(long, value_name = "FILE")]
    pub auth_file: Option<PathBuf>,
    /// containers-registries.conf (v2 or v1) instead of `ROOT/etc/containers/registries.conf`.
    #[arg(long, value_name = "FILE")]
    pub registries_conf: Option<PathBuf>,
    /// Drop-in directory instead of `ROOT/etc/containers/registries.conf.d`.
    #[arg(long, value_name = "DIR")]
    pub registries_conf_dir: Option<PathBuf>,
    /// Certificates directory (repeatable) instead of the node's certs.d: `*.crt`, `*.cert`/`*.key`
    /// directly in DIR apply to every registry, `DIR/<host[:port]>/` to that host only.
    #[arg(long, value_name = "DIR")]
    pub cert_dir: Vec<PathBuf>,
    /// Treat this registry as registries.conf `insecure = true`: HTTPS without certificate
    /// verification, then plain HTTP (repeatable).
    #[arg(long, value_name = "HOST[:PORT]")]
    pub insecure_registry: Vec<String>,
    /// Platform to select from an image index (default: this machine's).
    #[arg(long, value_name = "OS/ARCH[/VARIANT]")]
    pub platform: Option<String>,
    /// Longest wait for any registry response or progress, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub timeout: u64,
    /// Most retries of transient registry failures per pull (0: none).
    #[arg(long, value_name = "N", default_value_t = 12)]
    pub retries: u32,
    /// Most time spent waiting between retries per pull, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 300)]
    pub retry_budget: u64,
    /// Longest time for one pull, every request, retry and wait included, in seconds
    /// (keep it below the MachineConfig unit's TimeoutStartSec).
    #[arg(long, value_name = "SECONDS", default_value_t = crate::source::retry::DEFAULT_PULL_DEADLINE)]
    pub pull_deadline: u64,
    /// Image trust policy, containers-policy.json(5) (default: the node's /etc/containers/policy.json).
    #[arg(long, value_name = "FILE")]
    pub signature_policy: Option<PathBuf>,
    /// Signature storage configuration, containers-registries.d(5) (default: the node's /etc/containers/registries.d).
    #[arg(long, value_name = "DIR")]
    pub registries_d: Option<PathBuf>,
    /// Resource caps on what an image may make the runner do.
    #[command(flatten)]
    pub limits: LimitArgs,
}

/// Resource caps on image content (docs/design.md#limits); every one refuses with a clear error.
#[derive(Debug, Clone, Default, Args)]
pub struct LimitArgs {
    /// Most layers an image may have [default: 256].
    #[arg(long, value_name = "N")]
    pub max_layers: Option<usize>,
    /// Most decompressed bytes per compressed byte of a layer (layers under 64 MiB
    /// decompressed are always allowed) [default: 256].
    #[arg(long, value_name = "RATIO")]
    pub max_layer_ratio: Option<u64>,
    /// Most decompressed bytes of one layer, whatever its ratio [default: 32 GiB].
    #[arg(long, value_name = "BYTES")]
    pub max_layer_bytes: Option<u64>,
    /// Most tar entries indexed over the layers read [default: 250000].
    #[arg(long, value_name = "N")]
    pub max_index_entries: Option<u64>,
    /// Most bytes of that index (paths plus 96 bytes per entry) [default: 24 MiB].
    #[arg(long, value_name = "BYTES")]
    pub max_index_bytes: Option<u64>,
    /// Largest extracted file [default: 4 GiB].
    #[arg(long, value_name = "BYTES")]
    pub max_file_bytes: Option<u64>,
    /// Largest sum of extracted files [default: 8 GiB].
    #[arg(long, value_name = "BYTES")]
    pub max_total_bytes: Option<u64>,
}

/// Where on the node to work.
#[derive(Debug, Clone, Args)]
pub struct NodeArgs {
    /// The node's root filesystem (the DaemonSet mounts it at /host).
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
    /// Longest wait for another kata-addons run on this node, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 300)]
    pub lock_timeout: u64,
}

/// Which Kata runtime configurations get the drop-in (docs/design.md#kata-layouts).
#[derive(Debug, Clone, Args)]
pub struct LayoutArgs {
    /// kata-deploy's installation prefix on the node.
    #[arg(long, value_name = "DIR", default_value = kata_addons_facts::DEFAULT_KATA_PREFIX)]
    pub kata_prefix: String,
    /// Install only for this runtime configuration (node path; repeatable).
    #[arg(long = "runtime-config", value_name = "PATH")]
    pub runtime_configs: Vec<String>,
    /// Also write into a config.d that other configuration*.toml files read.
    #[arg(long)]
    pub allow_shared_config_d: bool,
}

impl Default for LayoutArgs {
    fn default() -> Self {
        LayoutArgs {
            kata_prefix: kata_addons_facts::DEFAULT_KATA_PREFIX.to_string(),
            runtime_configs: Vec::new(),
            allow_shared_config_d: false,
        }
    }
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the policy only: print env, plan and the drop-in install would write.
    Preview {
        /// Configuration source.
        #[command(flatten)]
        config: ConfigArgs,
        /// Output format.
        #[arg(long, short, value_enum, default_value_t = PreviewFormat::Text)]
        output: PreviewFormat,
        /// Node root to look for runtime configurations and registry hosts in (read only).
        #[arg(long, value_name = "DIR", default_value = "/")]
        root: PathBuf,
        /// Runtime configuration selection.
        #[command(flatten)]
        layout: LayoutArgs,
    },
    /// Pull an image and extract the named in-image paths into a directory.
    Fetch {
        /// Image reference (`registry/repo[:tag][@digest]` or `oci:/layout[:tag]`).
        #[arg(long, value_name = "REF")]
        image: String,
        /// Absolute in-image path to extract (repeatable).
        #[arg(long = "path", value_name = "PATH", required = true)]
        paths: Vec<String>,
        /// Directory to write the files into.
        #[arg(long, value_name = "DIR")]
        dest: PathBuf,
        /// Registry access.
        #[command(flatten)]
        registry: RegistryArgs,
        /// Root whose registry configuration (etc/containers, pull secret) is read.
        #[arg(long, value_name = "DIR", default_value = "/")]
        root: PathBuf,
    },
    /// Pull, verify, install and commit the addon on this node.
    Install {
        /// Configuration source.
        #[command(flatten)]
        config: ConfigArgs,
        /// Registry access.
        #[command(flatten)]
        registry: RegistryArgs,
        /// Node location.
        #[command(flatten)]
        node: NodeArgs,
        /// Runtime configuration selection.
        #[command(flatten)]
        layout: LayoutArgs,
        /// Install even while a live `kata-addons daemon` owns this node root (it will put
        /// back the addon of its own ConfigMap unless it is stopped).
        #[arg(long)]
        force: bool,
    },
    /// Remove what the state records and every kata-addons drop-in (carrying its header) in
    /// a known runtime config.d, with the version directories; works without a state.
    Uninstall {
        /// Node location.
        #[command(flatten)]
        node: NodeArgs,
        /// Where to look for drop-ins besides the state (`--kata-prefix`, `--runtime-config`;
        /// `--allow-shared-config-d` has no effect: only files carrying kata-addons' header go).
        #[command(flatten)]
        layout: LayoutArgs,
        /// Uninstall even while a live `kata-addons daemon` owns this node root (it will
        /// put back the addon of its own ConfigMap unless it is stopped).
        #[arg(long)]
        force: bool,
    },
    /// Verify the installed files and drop-in against the state (exit 3: none, 4: drifted).
    Status {
        /// Node location.
        #[command(flatten)]
        node: NodeArgs,
        /// Output format.
        #[arg(long, short, value_enum, default_value_t = StatusFormat::Text)]
        output: StatusFormat,
        /// Also require the daemon's readiness file (its `daemon --ready-file`): absent =
        /// the daemon is not ready (exit 1); its lines (a retry's next attempt, a standby's
        /// owner) are printed.
        #[arg(long, value_name = "FILE")]
        ready_file: Option<PathBuf>,
    },
    /// Print the reference values of what is installed, per target runtime configuration
    /// (exit 1 when a value could not be computed, 3 when nothing is installed).
    ReferenceValues(ReferenceValuesArgs),
    /// DaemonSet entry point: do the action, report readiness, wait for SIGTERM.
    Daemon(DaemonArgs),
    /// Validating admission webhook for the ConfigMap `kata-addon-artifacts` (HTTPS).
    Webhook(WebhookArgs),
    /// Policy component tools.
    Policy {
        /// Policy subcommand.
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// Print the completion script for SHELL on stdout.
    ///
    /// bash: kata-addons completions bash > /usr/share/bash-completion/completions/kata-addons
    ///
    /// zsh: kata-addons completions zsh > "${fpath[1]}/_kata-addons"
    ///
    /// fish: kata-addons completions fish > ~/.config/fish/completions/kata-addons.fish
    ///
    /// Every command has a man page (kata-addons(1), kata-addons-install(1), ...), in docs/man
    /// of the source tree and in the runner image.
    Completions {
        /// The shell to complete in.
        #[arg(value_enum, value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
}

/// `kata-addons reference-values` options (docs/attestation.md).
#[derive(Debug, Clone, Args)]
pub struct ReferenceValuesArgs {
    /// The node's root filesystem.
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
    /// Output format.
    #[arg(long, short, value_enum, default_value_t = ReferenceValuesFormat::Text)]
    pub output: ReferenceValuesFormat,
    /// Only the target of this RuntimeClass handler (repeatable; default: every target).
    #[arg(long = "runtime-class", value_name = "HANDLER")]
    pub runtime_classes: Vec<String>,
    /// IBM SE host key document (X.509 certificate of an EC P-521 host key; repeatable).
    #[arg(long = "host-key-document", value_name = "FILE")]
    pub host_key_documents: Vec<PathBuf>,
    /// AMD SNP: the vCPU type QEMU runs the guest with.
    #[arg(long, value_name = "TYPE")]
    pub vcpu_type: Option<String>,
    /// AMD SNP: the vCPU count, or an inclusive range `A-B`, to publish values for.
    #[arg(long, value_name = "N|A-B")]
    pub vcpus: Option<String>,
    /// Appended to the kernel command line Kata composes.
    #[arg(long, value_name = "STR")]
    pub append: Option<String>,
}

/// `reference-values` output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReferenceValuesFormat {
    /// For people.
    Text,
    /// The values with their inputs and provenance.
    Json,
    /// One Trustee RVPS message (`sample` format) per target, one per line.
    Rvps,
}

/// `policy` subcommands.
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Write the policy component (embedded, or `--policy-component`) to FILE.
    Export {
        /// Destination file.
        file: PathBuf,
    },
}

/// `preview` output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PreviewFormat {
    /// Human-readable summary.
    Text,
    /// One JSON object: `env`, `artifacts`, `dropIns`, `plan`.
    Json,
    /// `NAME=value` lines, shell-quoted.
    Env,
    /// A Kubernetes `env:` list for a DaemonSet.
    Yaml,
}

/// `status` output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusFormat {
    /// Human-readable summary.
    Text,
    /// One JSON object.
    Json,
}

/// `daemon` actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Action {
    /// Install (and keep reconciling).
    Install,
    /// Uninstall.
    Uninstall,
}

/// How the daemon notices changes of the runtime configuration directories (`--watch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Watch {
    /// inotify; polling where inotify is unavailable.
    Inotify,
    /// Poll the directories every `--poll-interval` (filesystems without inotify).
    Poll,
    /// No change notification: drift is found by the periodic `--resync` only.
    None,
}

/// `kata-addons daemon` options (the DaemonSet's arguments; host/deploy/base/daemonset.yaml).
#[derive(Debug, Clone, Args)]
pub struct DaemonArgs {
    /// What to do on this node.
    #[arg(long, value_enum, env = "ADDON_ACTION", default_value_t = Action::Install)]
    pub action: Action,
    /// Configuration source.
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Registry access.
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// Node location.
    #[command(flatten)]
    pub node: NodeArgs,
    /// File created once the action succeeded (readiness marker).
    #[arg(long, value_name = "FILE", default_value = "/tmp/kata-addons-ready")]
    pub ready_file: PathBuf,
    /// How often to check a `--configmap-dir` for changes, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0)]
    pub poll_interval: f64,
    /// Runtime configuration selection.
    #[command(flatten)]
    pub layout: LayoutArgs,
    /// Re-verify and repair the node this often, in seconds (with jitter; 0 = never).
    #[arg(long, value_name = "SECONDS", default_value_t = 300.0)]
    pub resync: f64,
    /// Wait a random time up to this many seconds before the first install, so that a
    /// rollout does not reach the registry from every node in one instant (0: no wait).
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0)]
    pub start_jitter: f64,
    /// How changes of the runtime configuration directories are noticed between resyncs:
    /// inotify (polling where inotify is unavailable), poll (every --poll-interval), or
    /// none (only the periodic --resync).
    #[arg(long, value_enum, value_name = "HOW", default_value_t = Watch::Inotify)]
    pub watch: Watch,
    /// Hash every installed file again this often, in seconds; the checks between
    /// compare size, inode, mtime and ctime, and hash only a file whose metadata changed.
    #[arg(long, value_name = "SECONDS", default_value_t = 3600.0)]
    pub verify_interval: f64,
    /// After a failed attempt (a ConfigMap change that cannot be applied, a repair that
    /// fails or is undone again), wait this long before the next, doubling per failure
    /// (less up to 25 % jitter)…
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    pub failure_backoff: f64,
    /// …up to this; another input, another image digest or a success starts over.
    #[arg(long, value_name = "SECONDS", default_value_t = 600.0)]
    pub failure_backoff_max: f64,
    /// Serve Prometheus metrics (`GET /metrics`, plain HTTP) here; off when not given
    /// (docs/metrics.md).
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics_address: Option<SocketAddr>,
}

/// `kata-addons webhook` options (docs/design.md#webhook, docs/webhook.md).
#[derive(Debug, Clone, Args)]
pub struct WebhookArgs {
    /// Address and port to serve HTTPS on.
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: SocketAddr,
    /// Also serve `/healthz` and `/readyz` over plain HTTP here, with connection slots of
    /// their own, so that the probes answer however busy the HTTPS port is.
    #[arg(long, value_name = "ADDR:PORT")]
    pub probe_listen: Option<SocketAddr>,
    /// Server certificate chain (PEM), re-read when it changes.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: PathBuf,
    /// Server private key (PEM), re-read when it changes.
    #[arg(long, value_name = "FILE")]
    pub tls_key: PathBuf,
    /// Most policy evaluations at once (1-4) [default: the number of CPUs, at most 4].
    #[arg(long, value_name = "N")]
    pub concurrency: Option<usize>,
    /// Longest time for one review, queueing included, in seconds (keep it below the
    /// webhook configuration's timeoutSeconds).
    #[arg(long, value_name = "SECONDS", default_value_t = 4.0)]
    pub review_timeout: f64,
    /// How often the certificate files are checked for changes, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0)]
    pub cert_poll_interval: f64,
    /// After SIGTERM, keep serving (with /readyz failing) this long, in seconds, so that
    /// the Service stops routing here before the listener closes.
    #[arg(long, value_name = "SECONDS", default_value_t = 0.0)]
    pub shutdown_delay: f64,
    /// Longest wait for in-flight requests after the listener closed, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 20.0)]
    pub shutdown_timeout: f64,
    /// Close a connection that has had no request in flight this long, in seconds
    /// (keep-alive, HTTP/2, or one that never sent a request).
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0)]
    pub idle_timeout: f64,
    /// Most open HTTPS connections; further ones are closed at once.
    #[arg(long, value_name = "N", default_value_t = 512)]
    pub max_connections: usize,
    /// Most open HTTPS connections from one source address.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub max_connections_per_ip: usize,
    /// Most MiB of request bodies held at once over all connections (a body takes its
    /// declared length, or 3 MiB, before it is read; beyond this reviews wait, then get 503).
    #[arg(long, value_name = "MIB", default_value_t = 32)]
    pub body_budget: usize,
    /// Serve Prometheus metrics (`GET /metrics`, plain HTTP) here, with connection slots of
    /// their own; off when not given (docs/metrics.md).
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics_address: Option<SocketAddr>,
}
