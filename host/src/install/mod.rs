//! The node lifecycle: `install` (the [`transaction`]), `uninstall` and `status`.
//!
//! Rooms: [`transaction`] (the atomic switch of DESIGN.md §4), [`target`] (where a plan
//! goes on this node), [`discovery`] (where kata-addons' files are on a node),
//! [`sweep`] (what killed runs left behind), [`uninstall`] and [`status`].

pub mod discovery;
pub mod status;
pub mod sweep;
pub mod target;
pub mod transaction;
pub mod uninstall;

pub use status::{Effective, Status, recorded_state, status};
pub use transaction::{Outcome, Pin, image_ref, install};
pub use uninstall::{Uninstalled, uninstall};
