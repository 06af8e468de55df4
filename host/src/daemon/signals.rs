//! SIGTERM and SIGINT, whatever the daemon is doing (docs/daemon.md#stopping): a thread of
//! its own waits for them on a runtime of its own, so no install, hash or lock wait on the
//! daemon's runtime can delay them. The daemon's loop sees the stop request at its next
//! await point and drops whatever it was doing (an install not committed leaves the old
//! state, as a crash does: docs/design.md#atomic-switch); if it has not exited [`GRACE`]
//! later (a synchronous step such as hashing a large file), this thread ends the process
//! with exit 0 itself.

use std::future::Future;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

/// Longest time between the signal and the end of the process.
pub(super) const GRACE: Duration = Duration::from_millis(1200);

/// The stop request: `None` until SIGTERM or SIGINT arrived, then its name.
#[derive(Clone)]
pub(super) struct Stop {
    rx: watch::Receiver<Option<&'static str>>,
}

impl Stop {
    /// Starts the signal thread; from now on SIGTERM/SIGINT end the process within [`GRACE`].
    pub(super) fn install() -> Result<Stop> {
        let (tx, rx) = watch::channel(None);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<()>>();
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || wait_for_signal(tx, ready_tx))
            .context("starting the signal thread")?;
        ready_rx.recv().context("the signal thread ended")??;
        Ok(Stop { rx })
    }

    /// Resolves when a stop is requested (at once if it already was).
    pub(super) async fn wait(&mut self) -> &'static str {
        loop {
            if let Some(s) = *self.rx.borrow_and_update() {
                return s;
            }
            if self.rx.changed().await.is_err() {
                // The signal thread is gone: no stop can come any more.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Runs `work` unless a stop is requested first; `None` = stopped (`work` is dropped,
    /// which cancels it at its current await point).
    pub(super) async fn unless_stopped<F: Future>(&mut self, work: F) -> Option<F::Output> {
        let mut me = self.clone();
        tokio::select! {
            biased;
            s = me.wait() => {
                tracing::info!(signal = s, "{s} while busy: the work in progress is abandoned; the node keeps its previous state");
                None
            }
            out = work => Some(out),
        }
    }
}

/// The signal thread: reports that the handlers are installed, waits for a signal,
/// announces it, and ends the process if the daemon has not exited after [`GRACE`].
fn wait_for_signal(tx: watch::Sender<Option<&'static str>>, ready: std::sync::mpsc::Sender<Result<()>>) {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_io().build() {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(e).context("starting the signal runtime"));
            return;
        }
    };
    let name = rt.block_on(async {
        let handlers = signal(SignalKind::terminate())
            .context("installing the SIGTERM handler")
            .and_then(|t| Ok((t, signal(SignalKind::interrupt()).context("installing the SIGINT handler")?)));
        let (mut term, mut int) = match handlers {
            Ok(h) => h,
            Err(e) => {
                let _ = ready.send(Err(e));
                return None;
            }
        };
        let _ = ready.send(Ok(()));
        tokio::select! {
            _ = term.recv() => Some("SIGTERM"),
            _ = int.recv() => Some("SIGINT"),
        }
    });
    let Some(name) = name else { return };
    let _ = tx.send(Some(name));
    std::thread::sleep(GRACE);
    tracing::warn!(
        signal = name,
        "{name}: the daemon did not stop within {} ms (a synchronous step was running); exiting now, the node keeps its previous state",
        GRACE.as_millis()
    );
    std::process::exit(0);
}
