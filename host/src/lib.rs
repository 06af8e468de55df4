//! kata-addons: the native runner.
