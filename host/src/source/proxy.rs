//! HTTP(S) proxy from the environment, decided the way containers/image (CRI-O, skopeo)
//! decides it on the same node: Go's `http.ProxyFromEnvironment`
//! (golang.org/x/net/http/httpproxy). `HTTPS_PROXY` for `https://` URLs, `HTTP_PROXY` for
//! `http://` URLs (upper case first, then lower case; empty = unset), `NO_PROXY` exclusions,
//! and `localhost` / loopback addresses never proxied. `ALL_PROXY` is not read (Go does not
//! read it). reqwest's own environment proxy is turned off so that this is the one decision.

use std::fmt;
use std::net::IpAddr;

use anyhow::{Result, bail};
use reqwest::Url;

/// One `NO_PROXY` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Exclusion {
    /// `*`: nothing is proxied.
    All,
    /// An address or a CIDR block (`10.0.0.0/8`, `fd00::/8`), optionally with a port.
    Net { addr: IpAddr, prefix: u8, port: Option<u16> },
    /// A domain: `example.com` matches it and its subdomains, `.example.com` (or
    /// `*.example.com`) its subdomains only; optionally with a port.
    Domain { suffix: String, exact_too: bool, port: Option<u16> },
}

/// The proxy configuration read from the environment (see the module docs).
#[derive(Clone, Default)]
pub struct ProxyEnv {
    http: Option<(String, Url)>,
    https: Option<(String, Url)>,
    no_proxy: Vec<Exclusion>,
    no_proxy_raw: Option<(String, String)>,
}

/// The first non-empty variable of `names`, with its name.
fn first(get: &dyn Fn(&str) -> Option<String>, names: &[&str]) -> Option<(String, String)> {
    names
        .iter()
        .find_map(|n| get(n).map(|v| v.trim().to_string()).filter(|v| !v.is_empty()).map(|v| (n.to_string(), v)))
}

/// A proxy URL as Go reads it: a value without a scheme means `http://`.
fn proxy_url(name: &str, value: &str) -> Result<Url> {
    let parsed = if value.contains("://") { Url::parse(value) } else { Url::parse(&format!("http://{value}")) };
    let url = match parsed {
        Ok(u) if u.has_host() => u,
        _ => bail!("{name}: not a proxy URL: {}", redact_str(value)),
    };
    if !matches!(url.scheme(), "http" | "https") {
        bail!("{name}: proxy scheme {:?} is not supported (http:// and https:// are)", url.scheme());
    }
    Ok(url)
}

/// A proxy URL for logs: credentials replaced by `***`.
fn redact(url: &Url) -> String {
    let mut u = url.clone();
    if !u.username().is_empty() || u.password().is_some() {
        let _ = u.set_username("***");
        let _ = u.set_password(None);
    }
    u.to_string().trim_end_matches('/').to_string()
}

fn redact_str(value: &str) -> String {
    match value.rsplit_once('@') {
        Some((_, host)) => format!("***@{host}"),
        None => value.to_string(),
    }
}

/// `host`, `host:port`, `[v6]`, `[v6]:port`.
fn split_port(entry: &str) -> (&str, Option<u16>) {
    if let Some(rest) = entry.strip_prefix('[') {
        if let Some((h, after)) = rest.split_once(']') {
            return (h, after.strip_prefix(':').and_then(|p| p.parse().ok()));
        }
        return (entry, None);
    }
    match entry.rsplit_once(':') {
        // A bare IPv6 address has several colons and no port.
        Some((h, p)) if !h.contains(':') => match p.parse() {
            Ok(port) => (h, Some(port)),
            Err(_) => (entry, None),
        },
        _ => (entry, None),
    }
}

fn parse_exclusion(entry: &str) -> Option<Exclusion> {
    let entry = entry.trim().to_ascii_lowercase();
    if entry.is_empty() {
        return None;
    }
    if entry == "*" {
        return Some(Exclusion::All);
    }
    if let Some((a, bits)) = entry.split_once('/')
        && let (Ok(addr), Ok(prefix)) = (a.parse::<IpAddr>(), bits.parse::<u8>())
    {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        return (prefix <= max).then_some(Exclusion::Net { addr, prefix, port: None });
    }
    let (host, port) = split_port(&entry);
    if let Ok(addr) = host.parse::<IpAddr>() {
        let prefix = if addr.is_ipv4() { 32 } else { 128 };
        return Some(Exclusion::Net { addr, prefix, port });
    }
    let host = host.strip_prefix('*').unwrap_or(host);
    match host.strip_prefix('.') {
        Some(s) if !s.is_empty() => Some(Exclusion::Domain { suffix: format!(".{s}"), exact_too: false, port }),
        Some(_) => None,
        None => Some(Exclusion::Domain { suffix: format!(".{host}"), exact_too: true, port }),
    }
}

fn in_net(ip: IpAddr, net: IpAddr, prefix: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - u32::from(prefix)) };
            u32::from(a) & mask == u32::from(b) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let mask = if prefix == 0 { 0 } else { u128::MAX << (128 - u32::from(prefix)) };
            u128::from(a) & mask == u128::from(b) & mask
        }
        _ => false,
    }
}

impl Exclusion {
    fn matches(&self, host: &str, ip: Option<IpAddr>, port: u16) -> bool {
        match self {
            Exclusion::All => true,
            Exclusion::Net { addr, prefix, port: p } => {
                ip.is_some_and(|ip| in_net(ip, *addr, *prefix)) && p.is_none_or(|p| p == port)
            }
            Exclusion::Domain { suffix, exact_too, port: p } => {
                let hit = host.ends_with(suffix.as_str()) || (*exact_too && host == &suffix[1..]);
                hit && p.is_none_or(|p| p == port)
            }
        }
    }
}

impl ProxyEnv {
    /// Reads `HTTPS_PROXY`, `HTTP_PROXY`, `NO_PROXY` (and their lower-case forms) from the
    /// process environment. A value that is not a usable proxy URL is an error naming it.
    pub(crate) fn from_env() -> Result<ProxyEnv> {
        ProxyEnv::from_vars(&|n| std::env::var(n).ok())
    }

    /// The same, from any variable lookup (tests).
    pub fn from_vars(get: &dyn Fn(&str) -> Option<String>) -> Result<ProxyEnv> {
        let parse = |names: &[&str]| -> Result<Option<(String, Url)>> {
            match first(get, names) {
                Some((n, v)) => Ok(Some((n.clone(), proxy_url(&n, &v)?))),
                None => Ok(None),
            }
        };
        let https = parse(&["HTTPS_PROXY", "https_proxy"])?;
        // Go ignores HTTP_PROXY in a CGI process (httpoxy); so does this.
        let http = if get("REQUEST_METHOD").is_some() { None } else { parse(&["HTTP_PROXY", "http_proxy"])? };
        let no_proxy_raw = first(get, &["NO_PROXY", "no_proxy"]);
        let no_proxy: Vec<Exclusion> =
            no_proxy_raw.as_ref().map(|(_, v)| v.split(',').filter_map(parse_exclusion).collect()).unwrap_or_default();
        Ok(ProxyEnv { http, https, no_proxy, no_proxy_raw })
    }

    /// Whether any proxy is configured.
    pub(crate) fn is_set(&self) -> bool {
        self.http.is_some() || self.https.is_some()
    }

    /// The proxy for a request URL, `None` for a direct connection.
    pub fn proxy_for(&self, url: &Url) -> Option<&Url> {
        let proxy = match url.scheme() {
            "https" => self.https.as_ref(),
            "http" => self.http.as_ref(),
            _ => None,
        }?;
        let host = url.host_str()?.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
        let host = host.trim_end_matches('.');
        let ip = host.parse::<IpAddr>().ok();
        if host == "localhost" || ip.is_some_and(|ip| ip.is_loopback()) {
            return None;
        }
        let port = url.port_or_known_default().unwrap_or(0);
        if self.no_proxy.iter().any(|e| e.matches(host, ip, port)) {
            return None;
        }
        Some(&proxy.1)
    }

    /// How a request to `url` goes, for logs: `via proxy http://…` or `direct (…)`.
    pub(crate) fn route(&self, url: &Url) -> String {
        match self.proxy_for(url) {
            Some(p) => format!("via proxy {}", redact(p)),
            None if !self.is_set() => "direct (no proxy configured)".to_string(),
            None => "direct (NO_PROXY or loopback)".to_string(),
        }
    }

    /// Turns off reqwest's own reading of the environment and routes every request by
    /// [`ProxyEnv::proxy_for`].
    pub(crate) fn apply(&self, b: reqwest::ClientBuilder) -> reqwest::ClientBuilder {
        let b = b.no_proxy();
        if !self.is_set() {
            return b;
        }
        let me = self.clone();
        b.proxy(reqwest::Proxy::custom(move |url| me.proxy_for(url).cloned()))
    }
}

/// Credentials never appear: proxy URLs are shown redacted.
impl fmt::Display for ProxyEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.is_set() {
            return f.write_str("no proxy (HTTPS_PROXY and HTTP_PROXY unset)");
        }
        let mut parts = Vec::new();
        for (n, u) in [&self.https, &self.http].into_iter().flatten() {
            parts.push(format!("{n}={}", redact(u)));
        }
        if let Some((n, v)) = &self.no_proxy_raw {
            parts.push(format!("{n}={v}"));
        }
        parts.push("loopback direct".to_string());
        f.write_str(&parts.join(", "))
    }
}

impl fmt::Debug for ProxyEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ProxyEnv({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> ProxyEnv {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        ProxyEnv::from_vars(&move |n| vars.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone())).expect("valid")
    }

    fn via(p: &ProxyEnv, url: &str) -> Option<String> {
        p.proxy_for(&Url::parse(url).expect("url")).map(|u| u.to_string())
    }

    #[test]
    fn scheme_selects_the_variable_and_bare_hosts_are_http() {
        let p = env(&[("HTTPS_PROXY", "proxy.corp:3128"), ("http_proxy", "http://p2:80")]);
        assert_eq!(via(&p, "https://quay.io/v2/").as_deref(), Some("http://proxy.corp:3128/"));
        assert_eq!(via(&p, "http://quay.io/v2/").as_deref(), Some("http://p2/"));
        let only_https = env(&[("HTTPS_PROXY", "http://proxy:3128")]);
        assert_eq!(via(&only_https, "http://quay.io/v2/"), None);
        // Upper case wins; empty means unset.
        let p = env(&[("HTTPS_PROXY", ""), ("https_proxy", "http://lower:1")]);
        assert_eq!(via(&p, "https://quay.io/").as_deref(), Some("http://lower:1/"));
    }

    #[test]
    fn loopback_and_localhost_are_never_proxied() {
        let p = env(&[("HTTPS_PROXY", "http://proxy:3128"), ("HTTP_PROXY", "http://proxy:3128")]);
        for u in ["http://127.0.0.1:5000/v2/", "https://127.8.9.1/", "http://[::1]:5000/", "https://localhost:5000/"] {
            assert_eq!(via(&p, u), None, "{u}");
        }
        assert!(via(&p, "https://localhost.example.com/").is_some());
    }

    #[test]
    fn no_proxy_entries_as_go_reads_them() {
        let p = env(&[
            ("HTTPS_PROXY", "http://proxy:3128"),
            (
                "NO_PROXY",
                " .cluster.local, example.com,10.0.0.0/8, 192.168.1.5:5000, fd00::/8, *.svc , mirror.corp:8443",
            ),
        ]);
        for (u, direct) in [
            ("https://registry.cluster.local/", true),
            ("https://cluster.local/", false),
            ("https://example.com/", true),
            ("https://a.b.example.com/", true),
            ("https://notexample.com/", false),
            ("https://10.1.2.3/", true),
            ("https://11.1.2.3/", false),
            ("https://192.168.1.5:5000/", true),
            ("https://192.168.1.5/", false),
            ("https://[fd00::5]/", true),
            ("https://image-registry.openshift-image-registry.svc:5000/", true),
            ("https://mirror.corp:8443/", true),
            ("https://mirror.corp/", false),
            ("https://quay.io/", false),
        ] {
            assert_eq!(via(&p, u).is_none(), direct, "{u}");
        }
        assert_eq!(via(&env(&[("HTTPS_PROXY", "http://proxy:3128"), ("no_proxy", "*")]), "https://quay.io/"), None);
    }

    #[test]
    fn credentials_are_used_but_never_shown() {
        let p = env(&[("HTTPS_PROXY", "http://user:secret@proxy:3128"), ("NO_PROXY", "a.b")]);
        assert_eq!(via(&p, "https://quay.io/").as_deref(), Some("http://user:secret@proxy:3128/"));
        let shown = format!("{p} {p:?} {}", p.route(&Url::parse("https://quay.io/").expect("url")));
        assert!(!shown.contains("secret") && !shown.contains("user"), "{shown}");
        assert!(shown.contains("HTTPS_PROXY=http://***@proxy:3128") && shown.contains("NO_PROXY=a.b"), "{shown}");
    }

    #[test]
    fn unusable_values_are_errors_naming_the_variable() {
        let bad = |k: &str, v: &str| {
            let (k, v) = (k.to_string(), v.to_string());
            let e = ProxyEnv::from_vars(&move |n| (n == k).then(|| v.clone())).expect_err("refused");
            format!("{e:#}")
        };
        assert!(bad("HTTPS_PROXY", "socks5://proxy:1080").starts_with("HTTPS_PROXY: proxy scheme"));
        let e = bad("HTTP_PROXY", "http://u:pw@[bad");
        assert!(e.starts_with("HTTP_PROXY: not a proxy URL") && !e.contains("pw"), "{e}");
        // CGI: HTTP_PROXY is ignored (httpoxy), as in Go.
        let cgi = env(&[("REQUEST_METHOD", "GET"), ("HTTP_PROXY", "http://evil:1")]);
        assert!(!cgi.is_set());
    }
}
