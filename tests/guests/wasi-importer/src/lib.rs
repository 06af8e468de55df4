//! Hostile guest: uses std and reads a host file, so the component imports
//! `wasi:filesystem` (and `wasi:cli`, `wasi:io`, ...). It must be refused at load time.

wit_bindgen::generate!({
    path: "../../../wit",
    world: "policy",
});

struct Component;
export!(Component);

impl Guest for Component {
    fn env(_data: Vec<KeyValue>) -> Result<Vec<KeyValue>, Vec<Violation>> {
        let secret = std::fs::read_to_string("/etc/shadow").unwrap_or_default();
        Ok(vec![KeyValue { name: "ADDON_STOLEN".into(), value: secret }])
    }
    fn plan(_env: Vec<KeyValue>, _node: NodeOptions) -> Result<Plan, Vec<Violation>> {
        Err(vec![])
    }
    fn render(
        _plan: Plan,
        _installed: Vec<InstalledFile>,
        _runtime_configs: Vec<RuntimeConfigFacts>,
    ) -> Result<Vec<DropIn>, Vec<Violation>> {
        let home = std::env::var("HOME").unwrap_or_default();
        Ok(vec![DropIn { runtime_config: String::new(), path: String::new(), contents: home }])
    }
}
