//! Hostile guest: `env` panics on a `panic` key and recurses without bound on a
//! `recurse` key.
#![no_std]
include!("../../common/rt.rs");

#[inline(never)]
#[allow(unconditional_recursion)]
fn recurse(n: u64) -> u64 {
    core::hint::black_box(recurse(core::hint::black_box(n + 1))) + 1
}

impl Guest for Component {
    fn env(data: Vec<KeyValue>) -> Result<Vec<KeyValue>, Vec<Violation>> {
        if has(&data, "panic") {
            panic!("the policy guest panicked on purpose");
        }
        if has(&data, "recurse") {
            let n = recurse(0);
            return Ok(vec![kv("ADDON_N", if n > 0 { "1" } else { "0" })]);
        }
        Ok(vec![kv("ADDON_IMAGE", "quay.io/example/addon:v1")])
    }
    fn plan(_env: Vec<KeyValue>, _node: NodeOptions) -> Result<Plan, Vec<Violation>> {
        Ok(good_plan("/vmlinuz"))
    }
    fn render(
        _plan: Plan,
        _installed: Vec<InstalledFile>,
        runtime_configs: Vec<RuntimeConfigFacts>,
    ) -> Result<Vec<DropIn>, Vec<Violation>> {
        Ok(drop_ins(&runtime_configs, ""))
    }
}
