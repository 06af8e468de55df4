//! The serving certificate pair: read with a cap, checked (the key must match the first
//! certificate), served to every handshake, and swapped in when the files change
//! (service-ca, cert-manager and kubelet's `..data` symlink swap replace them atomically;
//! a half-rotated pair whose key does not match is ignored until it does).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;

/// Largest certificate or key file read.
const MAX_PEM: u64 = 1 << 20;

/// The certificate pair as read from disk, to notice changes.
#[derive(PartialEq, Eq)]
struct PemFiles {
    cert: Vec<u8>,
    key: Vec<u8>,
}

fn read_capped(path: &Path) -> Result<Vec<u8>> {
    use std::io::Read;
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut buf = Vec::new();
    f.take(MAX_PEM + 1).read_to_end(&mut buf).with_context(|| format!("reading {}", path.display()))?;
    if buf.len() as u64 > MAX_PEM {
        bail!("{} is larger than {MAX_PEM} bytes", path.display());
    }
    Ok(buf)
}

impl PemFiles {
    fn read(cert: &Path, key: &Path) -> Result<PemFiles> {
        Ok(PemFiles { cert: read_capped(cert)?, key: read_capped(key)? })
    }

    /// The certified key, checking that the key belongs to the first certificate.
    fn certified_key(&self, provider: &rustls::crypto::CryptoProvider) -> Result<CertifiedKey> {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let chain = CertificateDer::pem_slice_iter(&self.cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow::anyhow!("{e:?}"))
            .context("parsing the certificate PEM")?;
        if chain.is_empty() {
            bail!("the certificate file holds no CERTIFICATE block");
        }
        let key = PrivateKeyDer::from_pem_slice(&self.key)
            .map_err(|e| anyhow::anyhow!("{e:?}"))
            .context("parsing the private key PEM")?;
        CertifiedKey::from_der(chain, key, provider).context("the private key does not match the certificate")
    }
}

/// Serves the current certificate pair; [`CertStore::reload`] swaps it.
#[derive(Debug)]
pub(super) struct CertStore {
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<rustls::crypto::CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
}

impl CertStore {
    fn load(cert_path: &Path, key_path: &Path, provider: Arc<rustls::crypto::CryptoProvider>) -> Result<CertStore> {
        let files = PemFiles::read(cert_path, key_path)?;
        let ck = files
            .certified_key(&provider)
            .with_context(|| format!("loading the TLS pair {} / {}", cert_path.display(), key_path.display()))?;
        Ok(CertStore {
            cert_path: cert_path.to_path_buf(),
            key_path: key_path.to_path_buf(),
            provider,
            current: RwLock::new(Arc::new(ck)),
        })
    }

    fn current(&self) -> Arc<CertifiedKey> {
        match self.current.read() {
            Ok(g) => Arc::clone(&g),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    fn set(&self, ck: CertifiedKey) {
        match self.current.write() {
            Ok(mut g) => *g = Arc::new(ck),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(ck),
        }
    }

    /// Re-reads the files every `every`; swaps the pair in when their content changed and
    /// they form a valid pair (a half-written rotation is retried on the next tick).
    pub(super) async fn watch(self: Arc<Self>, every: Duration) {
        let mut last = PemFiles::read(&self.cert_path, &self.key_path).ok();
        let mut last_error = String::new();
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let store = Arc::clone(&self);
            let read = tokio::task::spawn_blocking(move || PemFiles::read(&store.cert_path, &store.key_path)).await;
            let files = match read {
                Ok(Ok(f)) => f,
                Ok(Err(e)) => {
                    let msg = format!("{e:#}");
                    if msg != last_error {
                        tracing::warn!(error = %msg, "cannot read the TLS pair; serving the previous one");
                        last_error = msg;
                    }
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "certificate reload task failed");
                    continue;
                }
            };
            if last.as_ref() == Some(&files) {
                continue;
            }
            match files.certified_key(&self.provider) {
                Ok(ck) => {
                    self.set(ck);
                    tracing::info!(cert = %self.cert_path.display(), "TLS certificate reloaded");
                    last = Some(files);
                    last_error.clear();
                }
                Err(e) => {
                    let msg = format!("{e:#}");
                    if msg != last_error {
                        tracing::warn!(error = %msg, "the changed TLS pair is not usable (yet); serving the previous one");
                        last_error = msg;
                    }
                }
            }
        }
    }
}

/// rustls asks for the certificate on every handshake: the current one is served.
#[derive(Debug)]
struct Resolver(Arc<CertStore>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current())
    }
}

/// A TLS acceptor (TLS 1.2/1.3, ALPN h2 then http/1.1) serving the pair at `cert`/`key`,
/// and the store whose [`CertStore::watch`] keeps it current.
pub(super) fn acceptor(cert: &Path, key: &Path) -> Result<(TlsAcceptor, Arc<CertStore>)> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let certs = Arc::new(CertStore::load(cert, key, Arc::clone(&provider))?);
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(Resolver(Arc::clone(&certs))));
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((TlsAcceptor::from(Arc::new(tls)), certs))
}
