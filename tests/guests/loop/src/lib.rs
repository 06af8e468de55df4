//! Hostile guest: `env` never returns when the ConfigMap has a `spin` key.
#![no_std]
include!("../../common/rt.rs");

impl Guest for Component {
    fn env(data: Vec<KeyValue>) -> Result<Vec<KeyValue>, Vec<Violation>> {
        if has(&data, "spin") {
            let mut n: u64 = 0;
            loop {
                n = core::hint::black_box(n.wrapping_add(1));
            }
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
