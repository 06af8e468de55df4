//! `kata-addons webhook`: a validating admission webhook (docs/design.md#webhook) for the ConfigMap
//! `kata-addon-artifacts`. It runs the same policy component as `preview` (and nothing
//! else): an invalid ConfigMap is denied with every violation, exactly as `preview` prints
//! them; a valid one is allowed with warnings that preview what the nodes will install.
//!
//! HTTPS (rustls, HTTP/1.1 and HTTP/2), `POST /validate`, `GET /healthz`, `GET /readyz`;
//! the probes also on a plain-HTTP probe listener. Files by what they own:
//! - `server`: listeners, connection slots (total and per source address), handshake,
//!   header, idle and HTTP/2 ping timeouts, graceful shutdown on SIGTERM/SIGINT;
//! - `http`: the endpoints and the global budget of request-body bytes in flight;
//! - `review`: the AdmissionReview wire types, parsed borrowed from the body;
//! - `decide`: which request runs the policy, and the decision;
//! - `warnings`: the preview as admission warnings within the API server's limits;
//! - `tls`: the certificate pair, reloaded when its files change.

mod decide;
mod http;
mod review;
pub(crate) mod server;
mod tls;
mod warnings;

pub use decide::CONFIGMAP_NAME;
pub(crate) use server::{Options, serve};
