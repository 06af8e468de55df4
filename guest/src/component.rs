//! The component's exports: the WIT functions are the policy functions themselves (the
//! types are the generated ones on every target, so nothing is converted). The no_std
//! runtime pieces live in `rt.rs`.

use alloc::vec::Vec;

use crate::wit::{DropIn, Guest, InstalledFile, KeyValue, NodeOptions, Plan, RuntimeConfigFacts, Violation};

struct Component;

crate::wit::export!(Component with_types_in crate::wit);

impl Guest for Component {
    fn env(data: Vec<KeyValue>) -> Result<Vec<KeyValue>, Vec<Violation>> {
        crate::env(&data)
    }

    fn plan(env: Vec<KeyValue>, node: NodeOptions) -> Result<Plan, Vec<Violation>> {
        crate::plan(&env, &node)
    }

    fn render(
        plan: Plan,
        installed: Vec<InstalledFile>,
        runtime_configs: Vec<RuntimeConfigFacts>,
    ) -> Result<Vec<DropIn>, Vec<Violation>> {
        crate::render(&plan, &installed, &runtime_configs)
    }
}
