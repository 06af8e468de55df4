//! The node lifecycle: `install` (the [`transaction`]), `uninstall` and `status`.
//!
//! Rooms: [`transaction`] (the atomic switch, docs/design.md#atomic-switch), [`target`]
//! (where a plan goes on this node), [`discovery`] (where kata-addons' files are on a
//! node), [`sweep`] (what killed runs left behind), [`facts`] (what an install learns for
//! the daemon), [`integrity`] (an installed file against its record), [`owner`] (the daemon
//! owning a node root), [`uninstall`] and [`status`].

pub mod discovery;
pub mod facts;
mod integrity;
pub mod owner;
pub mod status;
pub mod sweep;
pub mod target;
pub mod transaction;
pub mod uninstall;

pub use facts::{FileFacts, Observed};
pub(crate) use integrity::describe as describe_record;
pub use status::{Depth, Status, recorded_state, status};
pub use transaction::{Outcome, Pin, install_observed};
pub use uninstall::{Uninstalled, uninstall};
