//! One daemon per node root (docs/daemon.md#ownership): the daemon claims the root by
//! taking the owner lock ([`crate::install::owner`]) and recording itself under the node
//! lock. A root a live daemon owns is left to it: with the same input this daemon stands by
//! (ready, the owner does the work), with other input it refuses to act (not ready, the log
//! names the owner); either way it takes over when the owner is gone.

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

use crate::configmap::Input;
use crate::install::owner::{self, OwnerLock, OwnerRecord};
use crate::lock;
use crate::node::{Root, Site};

/// sha256 of the configuration as read (its kind and every key and value, in order): the
/// daemon compares inputs without interpreting a key.
pub(super) fn input_digest(input: &Input) -> String {
    let mut h = Sha256::new();
    let (kind, data) = match input {
        Input::ConfigMap { data, .. } => ("configmap", data),
        Input::Env(data) => ("env", data),
    };
    h.update(kind.as_bytes());
    for kv in data {
        for part in [kv.name.as_bytes(), kv.value.as_bytes()] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part);
        }
    }
    format!("sha256:{}", hex::encode(h.finalize()))
}

/// The outcome of a claim.
pub(super) enum Claim {
    /// This daemon owns the root now; the record of a dead predecessor, if one was left.
    Owner(OwnerLock, Option<OwnerRecord>),
    /// A live daemon owns it (its record, when readable).
    Taken(Option<OwnerRecord>),
}

/// Claims the root for this daemon, recorded as `me`.
pub(super) async fn claim(site: &Site, me: &OwnerRecord) -> Result<Claim> {
    let (site, me) = (site.clone(), me.clone());
    tokio::task::spawn_blocking(move || claim_blocking(&site, &me)).await.context("ownership task")?
}

fn claim_blocking(site: &Site, me: &OwnerRecord) -> Result<Claim> {
    let root = Root::open(&site.root)?;
    let Some(held) = owner::try_hold(&root)? else {
        return Ok(match owner::owner(&root)? {
            owner::Owner::Live(rec) => Claim::Taken(rec),
            // Released between the two looks: claim it on the next tick.
            owner::Owner::Free(_) => Claim::Taken(None),
        });
    };
    let _lock = lock::acquire(&root, site.lock_timeout)?;
    let previous = match owner::owner(&root)? {
        owner::Owner::Free(rec) | owner::Owner::Live(rec) => rec,
    };
    owner::write(&root, me)?;
    Ok(Claim::Owner(held, previous))
}

/// Records this owner again (it applies another input now), under the node lock.
pub(super) async fn record(site: &Site, me: &OwnerRecord) -> Result<()> {
    let (site, me) = (site.clone(), me.clone());
    tokio::task::spawn_blocking(move || {
        let root = Root::open(&site.root)?;
        let _lock = lock::acquire(&root, site.lock_timeout)?;
        owner::write(&root, &me)
    })
    .await
    .context("ownership task")?
}

/// Removes this daemon's record on a clean exit (it still holds the owner lock, so no one
/// else can have written one). Best effort.
pub(super) fn release(site: &Site, held: OwnerLock) {
    let result = Root::open(&site.root).and_then(|root| {
        if let Ok(addons) = root.dir().open_dir(crate::node::rel_path(kata_addons_facts::INSTALL_DIR)) {
            owner::remove(&addons)?;
        }
        Ok(())
    });
    if let Err(e) = result {
        tracing::warn!("could not remove the owner record: {e:#}");
    }
    drop(held);
}
