//! Change notification on the runtime configuration directories (non-recursive): inotify,
//! or polling when inotify is unavailable. Each relevant event sends one `()`.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use super::Watch;

/// The watcher and what it watches.
pub(super) struct DirWatch {
    watcher: Option<Box<dyn notify::Watcher + Send>>,
    watched: BTreeSet<PathBuf>,
}

impl DirWatch {
    /// A watcher sending `()` on `tx` for every event but reads, noticing changes `how`.
    pub(super) fn new(tx: tokio::sync::mpsc::UnboundedSender<()>, poll: Duration, how: Watch) -> DirWatch {
        let handler = move |res: notify::Result<notify::Event>| {
            if let Ok(ev) = res
                && !matches!(ev.kind, notify::EventKind::Access(_))
            {
                let _ = tx.send(());
            }
        };
        let poller = |handler| -> Option<Box<dyn notify::Watcher + Send>> {
            match notify::PollWatcher::new(handler, notify::Config::default().with_poll_interval(poll)) {
                Ok(w) => Some(Box::new(w)),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot watch the runtime configuration directories; resync only");
                    None
                }
            }
        };
        let watcher: Option<Box<dyn notify::Watcher + Send>> = match how {
            Watch::None => None,
            Watch::Poll => poller(handler),
            Watch::Inotify => match notify::recommended_watcher(handler.clone()) {
                Ok(w) => Some(Box::new(w)),
                Err(e) => {
                    tracing::warn!(error = %e, "inotify unavailable; polling the runtime configuration directories");
                    poller(handler)
                }
            },
        };
        DirWatch { watcher, watched: BTreeSet::new() }
    }

    /// Watches exactly `dirs` from now on. Everything is re-watched: a directory that was
    /// removed and recreated (kata-deploy's uninstall + install) has lost its inotify watch.
    pub(super) fn update(&mut self, dirs: BTreeSet<PathBuf>) {
        let Some(w) = self.watcher.as_mut() else { return };
        for old in std::mem::take(&mut self.watched) {
            let _ = w.unwatch(&old);
        }
        for dir in dirs {
            match w.watch(&dir, notify::RecursiveMode::NonRecursive) {
                Ok(()) => {
                    self.watched.insert(dir);
                }
                Err(e) => tracing::debug!(dir = %dir.display(), error = %e, "cannot watch directory"),
            }
        }
    }
}
