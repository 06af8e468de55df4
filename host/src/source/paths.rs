//! Node paths of the registry configuration read by default, relative to `--root`.

/// containers-registries.conf(5).
pub(crate) const REGISTRIES_CONF: &str = "etc/containers/registries.conf";
/// containers-registries.conf.d(5).
pub(crate) const REGISTRIES_CONF_D: &str = "etc/containers/registries.conf.d";
/// containers-certs.d(5), searched first.
pub(crate) const CERTS_D: &str = "etc/containers/certs.d";
/// Docker's per-host certificates, searched second.
pub(crate) const DOCKER_CERTS_D: &str = "etc/docker/certs.d";
/// CA bundle of Fedora/RHEL/CoreOS nodes.
pub(crate) const CA_BUNDLE_RHEL: &str = "etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem";
/// CA bundle of Debian/Ubuntu nodes.
pub(crate) const CA_BUNDLE_DEBIAN: &str = "etc/ssl/certs/ca-certificates.crt";
/// The kubelet's (OpenShift's global) pull secret.
pub(crate) const PULL_SECRET: &str = "var/lib/kubelet/config.json";
