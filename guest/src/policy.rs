//! Placeholder: the policy rules (being written).
use crate::types::*;
use alloc::string::String;
use alloc::vec::Vec;

/// ConfigMap data -> resolved env.
pub fn env(_data: &[KeyValue]) -> Result<Vec<KeyValue>, Vec<Violation>> {
    Ok(Vec::new())
}
/// Env -> plan.
pub fn plan(_env: &[KeyValue]) -> Result<Plan, Vec<Violation>> {
    Err(Vec::new())
}
/// Plan -> drop-in.
pub fn render(_plan: &Plan, _installed: &[InstalledFile]) -> Result<String, Vec<Violation>> {
    Ok(String::new())
}
