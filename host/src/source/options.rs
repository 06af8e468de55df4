//! How to reach registries, as the command layer decided it.

use std::time::Duration;

use super::image::Platform;
use super::{endpoints, proxy, retry};

/// How to reach registries: node files, platform, timeout, retries and proxy.
#[derive(Debug, Clone)]
pub(crate) struct RegistryOptions {
    /// The node files (registries.conf, certs.d, auth) and the flags overriding them.
    pub node: endpoints::NodeFiles,
    /// Platform to select from image indexes.
    pub platform: Platform,
    /// Longest wait for any registry response or progress.
    pub timeout: Duration,
    /// Retries of transient failures (backoff, `Retry-After`, per-pull budget).
    pub retry: retry::RetryPolicy,
    /// Longest time for one pull (every registry request of one install, retries and
    /// their waits included).
    pub pull_deadline: Duration,
    /// HTTP(S) proxy from `HTTPS_PROXY`/`HTTP_PROXY`/`NO_PROXY` (default: none).
    pub proxy: proxy::ProxyEnv,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        RegistryOptions {
            node: endpoints::NodeFiles::default(),
            platform: Platform::current(),
            timeout: Duration::from_secs(30),
            retry: retry::RetryPolicy::default(),
            pull_deadline: Duration::from_secs(retry::DEFAULT_PULL_DEADLINE),
            proxy: proxy::ProxyEnv::default(),
        }
    }
}
