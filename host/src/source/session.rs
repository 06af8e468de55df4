//! One HTTP session with one registry endpoint: TLS per containers-certs.d(5) (extra roots,
//! client certificate), `insecure` = HTTPS without verification then plain HTTP (as
//! containers/image pings), and the distribution auth flows (anonymous, Basic, Bearer token).

use std::sync::{Arc, RwLock};

use anyhow::{Context, Result, anyhow, bail};

use super::auth::AuthLookup;
use super::certs::HostTls;
use super::containerd_hosts::CtdHost;
use super::endpoints::Endpoint;
use super::http;
use super::options::RegistryOptions;
use super::reference::DOCKER_HUB;
use super::retry::{Failure, Retries, RetryBudget, classify_reqwest, status_failure, timed_out, with_retry};

/// How requests are authorised.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Scheme {
    None,
    Basic,
    Bearer { realm: String, service: Option<String> },
}

/// An authenticated session with one endpoint.
pub(crate) struct Session {
    /// The endpoint.
    pub endpoint: Endpoint,
    http: reqwest::Client,
    /// `https://host` or `http://host` (Docker Hub: its API host).
    base: String,
    auth: AuthLookup,
    scheme: Scheme,
    bearer: RwLock<Option<String>>,
    opts: RegistryOptions,
    retries: Retries,
    /// API root path (`/v2`; a containerd host may set another).
    api: String,
    /// `?ns=…` appended to every registry URL (a containerd mirror), or empty.
    query: String,
}

/// Largest token endpoint response read.
const MAX_TOKEN_RESPONSE: u64 = 1 << 20;

fn build_client(
    opts: &RegistryOptions,
    tls: &HostTls,
    skip_verify: bool,
    headers: &[(String, String)],
    what: &str,
) -> Result<reqwest::Client> {
    let mut map = reqwest::header::HeaderMap::new();
    for (k, v) in headers {
        let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
            .with_context(|| format!("{what}: invalid header name {k:?}"))?;
        let value = reqwest::header::HeaderValue::from_str(v)
            .with_context(|| format!("{what}: invalid value of header {k:?}"))?;
        map.append(name, value);
    }
    let mut b = reqwest::Client::builder()
        .default_headers(map)
        .read_timeout(opts.timeout)
        .connect_timeout(super::retry::connect_timeout(opts.timeout))
        .redirect(reqwest::redirect::Policy::limited(5))
        .user_agent(concat!("kata-addons/", env!("CARGO_PKG_VERSION")));
    b = opts.proxy.apply(b);
    if skip_verify {
        b = b.tls_danger_accept_invalid_certs(true);
    } else if !tls.roots.is_empty() {
        let extra: Vec<reqwest::Certificate> = tls
            .roots
            .iter()
            .map(|d| reqwest::Certificate::from_der(d))
            .collect::<Result<_, _>>()
            .with_context(|| format!("{what}: invalid CA certificate"))?;
        b = b.tls_certs_merge(extra);
    }
    if let Some(id) = &tls.identity {
        let identity = reqwest::Identity::from_pem(&id.pem)
            .with_context(|| format!("{what}: client certificate {} is unusable", id.cert_file.display()))?;
        b = b.identity(identity);
    }
    b.build().with_context(|| format!("{what}: cannot build the HTTP client"))
}

/// The host to talk to for a registry name (Docker Hub's API lives elsewhere).
fn api_host(host: &str) -> &str {
    if host == DOCKER_HUB { "registry-1.docker.io" } else { host }
}

/// Parses `Bearer realm="…",service="…"` / `Basic realm="…"`.
fn parse_challenge(h: &str) -> Option<Scheme> {
    let (kind, rest) = h.trim().split_once(' ').unwrap_or((h.trim(), ""));
    match kind.to_ascii_lowercase().as_str() {
        "basic" => Some(Scheme::Basic),
        "bearer" => {
            let mut realm = None;
            let mut service = None;
            let mut s = rest.trim();
            while !s.is_empty() {
                let (k, after) = s.split_once('=')?;
                let after = after.trim_start();
                let (v, next) = if let Some(q) = after.strip_prefix('"') {
                    let end = q.find('"')?;
                    (&q[..end], q[end + 1..].trim_start().trim_start_matches(',').trim_start())
                } else {
                    let end = after.find(',').unwrap_or(after.len());
                    (&after[..end], after[end..].trim_start_matches(',').trim_start())
                };
                match k.trim().to_ascii_lowercase().as_str() {
                    "realm" => realm = Some(v.to_string()),
                    "service" => service = Some(v.to_string()),
                    _ => {}
                }
                s = next;
            }
            Some(Scheme::Bearer { realm: realm?, service })
        }
        _ => None,
    }
}

/// `GET base/v2/`: the status (200 or 401) and the auth challenge.
async fn ping_once(
    client: &reqwest::Client,
    base: &str,
    api: &str,
    lenient: bool,
) -> std::result::Result<(u16, Option<Scheme>), Failure> {
    let url = format!("{base}{api}/");
    let resp = client.get(&url).send().await.map_err(|e| {
        // A certificate the verifier refuses, or a handshake the server refuses (no or a bad
        // client certificate), will not get better by retrying.
        let chain = format!("{e:?}");
        if ["InvalidCertificate", "AlertReceived", "CertificateRequired", "NoCertificatesPresented"]
            .iter()
            .any(|k| chain.contains(k))
        {
            Failure::Fatal(anyhow::Error::new(e).context("TLS handshake refused"))
        } else {
            classify_reqwest(e)
        }
    })?;
    let status = resp.status();
    if lenient && status.as_u16() != 401 && !super::retry::transient_status(status) {
        // containerd never pings: a host with a path of its own may not answer there.
        return Ok((200, None));
    }
    if status.as_u16() != 200 && status.as_u16() != 401 {
        return Err(status_failure(status, resp.headers(), anyhow!("{url}: HTTP {status}")));
    }
    let challenge = resp
        .headers()
        .get_all(reqwest::header::WWW_AUTHENTICATE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(parse_challenge)
        .next();
    Ok((status.as_u16(), challenge))
}

impl Session {
    /// Connects to `endpoint`: finds the scheme, reads the auth challenge and authenticates
    /// (pull scope). `auth` is what the auth files say for this endpoint.
    pub(crate) async fn connect(
        opts: &RegistryOptions,
        endpoint: &Endpoint,
        tls: &HostTls,
        auth: AuthLookup,
        budget: Arc<RetryBudget>,
    ) -> Result<Self> {
        let what = format!("registry {}", endpoint.name());
        let retries = Retries::new(budget, endpoint.mirror);
        if let Some(h) = &endpoint.ctd {
            return Self::connect_containerd(opts, endpoint, h, tls, auth, retries).await;
        }
        let host = api_host(&endpoint.host);
        let verified = build_client(opts, tls, endpoint.insecure, &[], &what)?;
        let https = format!("https://{host}");
        if opts.proxy.is_set() {
            let route = |base: &str| {
                reqwest::Url::parse(base).map_or_else(|e| format!("unknown ({e})"), |u| opts.proxy.route(&u))
            };
            if endpoint.insecure {
                tracing::info!("{what}: HTTPS {}, plain HTTP {}", route(&https), route(&format!("http://{host}")));
            } else {
                tracing::info!("{what}: {}", route(&https));
            }
        }
        let (http, base, (status, challenge)) = if endpoint.insecure {
            // containers/image: an insecure registry is pinged over HTTPS without
            // verification once, then over plain HTTP.
            let first = match tokio::time::timeout(opts.timeout, ping_once(&verified, &https, "/v2", false)).await {
                Ok(Ok(r)) => Ok(r),
                Ok(Err(f)) => Err(f.into_inner()),
                Err(_) => Err(timed_out(opts.timeout)),
            };
            match first {
                Ok(r) => (verified, https, r),
                Err(e) => {
                    tracing::debug!("{what}: HTTPS failed ({e:#}), trying plain HTTP (insecure)");
                    // The same client (no certificate verification): as in containers/image,
                    // one transport serves the insecure registry over both schemes, redirects
                    // to HTTPS blob storage included. Loading the system roots for a second
                    // client would cost ~10-20 ms on every pull.
                    let base = format!("http://{host}");
                    let r = with_retry(&retries, opts.timeout, &format!("{what}: ping {base}/v2/"), || {
                        ping_once(&verified, &base, "/v2", false)
                    })
                    .await
                    .map_err(|e2| e2.context(format!("HTTPS failed too: {e:#}")))?;
                    (verified, base, r)
                }
            }
        } else {
            let r = with_retry(&retries, opts.timeout, &format!("{what}: ping {https}/v2/"), || {
                ping_once(&verified, &https, "/v2", false)
            })
            .await?;
            (verified, https, r)
        };
        let scheme = match (status, challenge) {
            (200, _) => Scheme::None,
            (_, Some(s)) => s,
            (_, None) => bail!("{what}: HTTP 401 without a usable WWW-Authenticate challenge"),
        };
        let me = Session {
            endpoint: endpoint.clone(),
            http,
            base,
            auth,
            scheme,
            bearer: RwLock::new(None),
            opts: opts.clone(),
            retries,
            api: "/v2".to_string(),
            query: String::new(),
        };
        me.authenticate().await?;
        Ok(me)
    }

    /// Connects to a containerd `hosts.toml` host: its scheme only (no HTTP fallback),
    /// `skip_verify`, its API path, headers and `ns` parameter.
    async fn connect_containerd(
        opts: &RegistryOptions,
        endpoint: &Endpoint,
        h: &CtdHost,
        tls: &HostTls,
        auth: AuthLookup,
        retries: Retries,
    ) -> Result<Self> {
        let what = format!("registry {} ({})", endpoint.name(), h.from);
        let http = build_client(opts, tls, h.skip_verify == Some(true), &h.header, &what)?;
        let base = format!("{}://{}", h.scheme, h.host);
        if opts.proxy.is_set() {
            let route = reqwest::Url::parse(&base).map_or_else(|e| format!("unknown ({e})"), |u| opts.proxy.route(&u));
            tracing::info!("{what}: {route}");
        }
        let ping = format!("{what}: ping {base}{}/", h.path);
        let (status, challenge) =
            with_retry(&retries, opts.timeout, &ping, || ping_once(&http, &base, &h.path, true)).await?;
        let scheme = match (status, challenge) {
            (200, _) => Scheme::None,
            (_, Some(s)) => s,
            (_, None) => bail!("{what}: HTTP 401 without a usable WWW-Authenticate challenge"),
        };
        // Go's url.Values.Encode of `ns`: registry names hold [A-Za-z0-9.-:[]] only.
        let query = match &endpoint.ns {
            Some(ns) => format!("?ns={}", ns.replace(':', "%3A").replace('[', "%5B").replace(']', "%5D")),
            None => String::new(),
        };
        let me = Session {
            endpoint: endpoint.clone(),
            http,
            base,
            auth,
            scheme,
            bearer: RwLock::new(None),
            opts: opts.clone(),
            retries,
            api: h.path.clone(),
            query,
        };
        me.authenticate().await?;
        Ok(me)
    }

    /// `registry host/repo`.
    pub(crate) fn name(&self) -> String {
        self.endpoint.name()
    }

    /// Who is asking, for messages.
    fn who(&self) -> String {
        match &self.auth.creds {
            Some(c) => format!("user {:?} from {}", c.username, c.source),
            None => "anonymous access (no credentials found)".to_string(),
        }
    }

    /// The message for an HTTP 401: who was refused, and the credential helpers, if any.
    pub(crate) fn unauthorized(&self) -> anyhow::Error {
        let mut m = match &self.auth.creds {
            Some(_) => format!("authentication failed for {} (HTTP 401)", self.who()),
            None => "authentication required and no credentials found (HTTP 401)".to_string(),
        };
        if let Some(h) = self.auth.helper_hint() {
            m.push_str("; ");
            m.push_str(&h);
        }
        anyhow!(m)
    }

    async fn authenticate(&self) -> Result<()> {
        let what = format!("registry {}: authentication", self.name());
        let retries = &self.retries;
        match &self.scheme {
            Scheme::None => Ok(()),
            Scheme::Basic => {
                // Check the credentials now, for a clear error.
                let url = format!("{}{}/", self.base, self.api);
                let status = with_retry(retries, self.opts.timeout, &what, || async {
                    Ok(http::send(self.authorize(self.http.get(&url)), "credentials check").await?.status().as_u16())
                })
                .await?;
                if status == 401 {
                    return Err(self.unauthorized().context(what));
                }
                Ok(())
            }
            Scheme::Bearer { realm, service } => {
                let mut url =
                    reqwest::Url::parse(realm).with_context(|| format!("{what}: invalid token realm {realm:?}"))?;
                {
                    let mut q = url.query_pairs_mut();
                    if let Some(s) = service {
                        q.append_pair("service", s);
                    }
                    q.append_pair("scope", &format!("repository:{}:pull", self.endpoint.repository));
                }
                let token = with_retry(retries, self.opts.timeout, &what, || async {
                    let mut rb = self.http.get(url.clone());
                    if let Some(c) = &self.auth.creds {
                        rb = rb.basic_auth(&c.username, Some(&c.password));
                    }
                    let resp = http::send(rb, "token endpoint").await?;
                    let status = resp.status();
                    if status.as_u16() == 401 || status.as_u16() == 403 {
                        return Err(Failure::Fatal(self.unauthorized()));
                    }
                    if !status.is_success() {
                        return Err(Failure::Fatal(anyhow!("token endpoint: unexpected HTTP {status}")));
                    }
                    let body = http::read_capped(resp, MAX_TOKEN_RESPONSE, "token endpoint response").await?;
                    let v: serde_json::Value = serde_json::from_slice(&body)
                        .map_err(|e| Failure::Fatal(anyhow!("token endpoint: response is not JSON: {e}")))?;
                    let t = v
                        .get("token")
                        .or_else(|| v.get("access_token"))
                        .and_then(|t| t.as_str())
                        .filter(|t| !t.is_empty())
                        .ok_or_else(|| Failure::Fatal(anyhow!("token endpoint: no token in the response")))?;
                    Ok(t.to_string())
                })
                .await?;
                if let Ok(mut b) = self.bearer.write() {
                    *b = Some(token);
                }
                Ok(())
            }
        }
    }

    /// Adds the authorisation this session uses to a request.
    pub(crate) fn authorize(&self, rb: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.scheme {
            Scheme::None => rb,
            Scheme::Basic => match &self.auth.creds {
                Some(c) => rb.basic_auth(&c.username, Some(&c.password)),
                None => rb,
            },
            Scheme::Bearer { .. } => match self.bearer.read().ok().and_then(|b| b.clone()) {
                Some(t) => rb.bearer_auth(t),
                None => rb,
            },
        }
    }

    /// Re-runs the token flow (after a 401 on an expired token). Basic/none: nothing to do.
    pub(crate) async fn reauthenticate(&self) -> Result<bool> {
        if matches!(self.scheme, Scheme::Bearer { .. }) {
            self.authenticate().await?;
            return Ok(true);
        }
        Ok(false)
    }

    /// `base/v2/<repository>/<rest>`.
    pub(crate) fn url(&self, rest: &str) -> String {
        format!("{}{}/{}/{rest}{}", self.base, self.api, self.endpoint.repository, self.query)
    }

    /// The retries of requests to this endpoint (built once, at connect).
    pub(crate) fn retries(&self) -> &Retries {
        &self.retries
    }

    /// The HTTP client (this endpoint's TLS settings).
    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// A GET request builder for `url`, authorised.
    pub(crate) fn get(&self, url: &str) -> reqwest::RequestBuilder {
        self.authorize(self.http.get(url))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges() {
        assert_eq!(
            parse_challenge(r#"Bearer realm="https://auth.example/token",service="registry.example",scope="x""#),
            Some(Scheme::Bearer {
                realm: "https://auth.example/token".into(),
                service: Some("registry.example".into())
            })
        );
        assert_eq!(parse_challenge(r#"Basic realm="test""#), Some(Scheme::Basic));
        assert_eq!(parse_challenge("Negotiate"), None);
    }
}
