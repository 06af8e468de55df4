//! Hostile guest: a 256 MiB zeroed static makes the module's initial memory larger than
//! the cap, so instantiation itself must fail.
#![no_std]
include!("../../common/rt.rs");

static mut BIG: [u8; 256 << 20] = [0; 256 << 20];

impl Guest for Component {
    fn env(data: Vec<KeyValue>) -> Result<Vec<KeyValue>, Vec<Violation>> {
        let i = data.len() % (256 << 20);
        // SAFETY: single-threaded guest; the read keeps the static alive.
        let v = unsafe { core::ptr::addr_of!(BIG).cast::<u8>().add(i).read_volatile() };
        Ok(vec![kv("ADDON_X", if v == 0 { "0" } else { "1" })])
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
