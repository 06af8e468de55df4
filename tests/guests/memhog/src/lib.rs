//! Hostile guest: `env` allocates 1 MiB blocks until allocation fails when the ConfigMap
//! has a `hog` key.
#![no_std]
include!("../../common/rt.rs");

impl Guest for Component {
    fn env(data: Vec<KeyValue>) -> Result<Vec<KeyValue>, Vec<Violation>> {
        if has(&data, "hog") {
            let mut blocks: Vec<Vec<u8>> = Vec::new();
            loop {
                let mut b = vec![0u8; 1 << 20];
                b[0] = 1;
                blocks.push(core::hint::black_box(b));
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
