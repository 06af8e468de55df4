//! The one HTTP path of the registry side: send a request and classify what came back
//! (transport failures and HTTP 408/429/5xx are transient, with `Retry-After`), and read a
//! response body with a cap, checked against `Content-Length` first and while streaming,
//! so no body is ever buffered beyond its cap.

use anyhow::anyhow;
use futures_util::StreamExt;

use super::retry::{Failure, classify_body, classify_reqwest, status_failure, transient_status};

/// Sends `rb`; a transport failure or a transient status is a [`Failure`] (retryable or
/// not), any other response is returned for the caller to interpret. `what` names the
/// request in messages.
pub(crate) async fn send(rb: reqwest::RequestBuilder, what: &str) -> Result<reqwest::Response, Failure> {
    let resp = rb.send().await.map_err(classify_reqwest)?;
    let status = resp.status();
    if transient_status(status) {
        return Err(status_failure(status, resp.headers(), anyhow!("{what}: HTTP {status}")));
    }
    Ok(resp)
}

/// The body of `resp`, at most `cap` bytes; a larger one (by `Content-Length`, or as it
/// streams) is refused naming `what`.
pub(crate) async fn read_capped(resp: reqwest::Response, cap: u64, what: &str) -> Result<Vec<u8>, Failure> {
    if let Some(len) = resp.content_length()
        && len > cap
    {
        return Err(Failure::Fatal(anyhow!("{what} is {len} bytes, more than the {cap} byte limit")));
    }
    let mut body = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(classify_body)?;
        if body.len() as u64 + chunk.len() as u64 > cap {
            return Err(Failure::Fatal(anyhow!("{what} is larger than the {cap} byte limit")));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
