use super::*;

const ROOT: &str = "278d7cfa2bf79e43ca873d5f203bf2622358a5c0cbbadc3b0d3757675fa1a6ef";

fn frag(path: &str, text: &str) -> Fragment {
    Fragment { path: path.to_string(), table: Ok(toml::from_str(text).expect("test TOML")) }
}

fn compose_one(runtime: Runtime, frags: &[Fragment]) -> Result<Composed, String> {
    compose(&Inputs { runtime, fragments: frags, fips: false, host_cpus: 8 })
}

fn measured_image(extra: &str) -> String {
    format!(
        "[hypervisor.qemu]\nimage = \"/opt/kata/share/kata-containers/kata-containers-confidential.img\"\n\
         kernel_verity_params = \"root_hash={ROOT},salt=5eed,data_blocks=74,data_block_size=4096,hash_block_size=4096\"\n\
         rootfs_type = \"erofs\"\nconfidential_guest = true\nsev_snp_guest = true\n{extra}"
    )
}

const DM: &str = "dm-mod.create=\"dm-verity,,,ro,0 592 verity 1 /dev/vda1 /dev/vda2 4096 4096 74 0 sha256 \
                  278d7cfa2bf79e43ca873d5f203bf2622358a5c0cbbadc3b0d3757675fa1a6ef 5eed\" root=/dev/dm-0 \
                  rootflags=ro rootfstype=erofs";

#[test]
fn runtime_rs_snp_with_a_measured_image_as_kata_composes_it() {
    let base = frag(
        "/opt/kata/share/defaults/kata-containers/runtime-rs/configuration-qemu-snp-runtime-rs.toml",
        &measured_image(
            "kernel_params = \"\"\nvm_rootfs_driver = \"virtio-blk-pci\"\ndisable_guest_selinux = true\n\
             [agent.kata]\ncdh_api_timeout_ms = 50000\n",
        ),
    );
    let c = compose_one(Runtime::RuntimeRs, &[base]).expect("composes");
    let want = format!(
        "reboot=k panic=1 systemd.unit=kata-containers.target systemd.mask=systemd-networkd.service \
         systemd.mask=systemd-networkd.socket {DM} agent.cdh_api_timeout=50 selinux=0 console=hvc0"
    );
    assert_eq!(c.cmdline, want);
    assert_eq!(c.pieces.len(), c.cmdline.split(' ').count() - 12, "the dm-verity table is one piece");
    assert!(c.pieces.iter().any(|p| p.origin.contains("kernel_param.rs:243")), "{:?}", c.pieces);
}

#[test]
fn go_snp_with_a_measured_image_as_kata_composes_it() {
    let base = frag(
        "/opt/kata/share/defaults/kata-containers/configuration-qemu-snp.toml",
        &measured_image(
            "kernel_params = \"agent.https_proxy=http://proxy:3128\"\ndisable_guest_selinux = true\n\
             block_device_driver = \"virtio-scsi\"\n[agent.kata]\nlaunch_process_timeout = 6\n",
        ),
    );
    let c = compose_one(Runtime::Go, &[base]).expect("composes");
    let want = format!(
        "tsc=reliable no_timer_check rcupdate.rcu_expedited=1 i8042.direct=1 i8042.dumbkbd=1 i8042.nopnp=1 \
         i8042.noaux=1 noreplace-smp reboot=k cryptomgr.notests net.ifnames=0 pci=lastbus=0 {DM} console=hvc0 \
         console=hvc1 quiet systemd.show_status=false panic=1 selinux=0 systemd.unit=kata-containers.target \
         systemd.mask=systemd-networkd.service systemd.mask=systemd-networkd.socket scsi_mod.scan=none \
         agent.launch_process_timeout=6 agent.https_proxy=http://proxy:3128"
    );
    assert_eq!(c.cmdline, want);
}

#[test]
fn initrd_guests_debug_agents_extensions_and_iommu() {
    let text = "[hypervisor.qemu]\ninitrd = \"/opt/kata/initrd.img\"\nenable_debug = true\nenable_iommu = true\n\
                confidential_guest = true\ndisable_guest_selinux = false\n\
                kernel_params = 'a=\"b c\"  d= =e'\n\
                [[hypervisor.qemu.guest_extension_images]]\nname = \"coco\"\npath = \"/x.img\"\nverity_params = \"\"\n\
                [agent.kata]\nenable_debug = true\ndebug_console_enabled = true\ncdh_api_timeout_ms = 0\n";
    let frags = [frag("/etc/kata-containers/kata-snp/configuration.toml", text)];
    let rs = compose_one(Runtime::RuntimeRs, &frags);
    assert!(rs.as_ref().is_err_and(|e| e.contains("empty key")), "{rs:?}");
    let go = compose_one(Runtime::Go, &frags).expect("composes");
    assert!(
        go.cmdline.ends_with(
            "pci=lastbus=0 intel_iommu=on iommu=pt console=hvc0 console=hvc1 debug panic=1 selinux=1 \
             scsi_mod.scan=none agent.log=debug agent.debug_console agent.debug_console_vport=1026 a=\"b c\" d e \
             kata.extension.coco.verity_params"
        ),
        "{}",
        go.cmdline
    );
    let ok = [frag("/c.toml", &text.replace(" =e", ""))];
    let rs = compose_one(Runtime::RuntimeRs, &ok).expect("composes");
    assert_eq!(
        rs.cmdline,
        "reboot=k panic=1 systemd.unit=kata-containers.target systemd.mask=systemd-networkd.service \
         systemd.mask=systemd-networkd.socket agent.log_vport=1025 agent.debug_console agent.debug_console_vport=1026 \
         agent.log=debug a=\"b c\" d selinux=1 kata.extension.coco.verity_params intel_iommu=on iommu=pt console=hvc0"
    );
}

#[test]
fn a_later_fragment_wins_and_unmodelled_or_broken_configurations_are_refused() {
    let base = frag("/base.toml", &measured_image("kernel_params = \"x=1\"\n"));
    let drop_in = frag("/config.d/50-kata-addons.toml", "[hypervisor.qemu]\nkernel_params = \"y=2\"\n");
    let c = compose_one(Runtime::RuntimeRs, &[base.clone(), drop_in]).expect("composes");
    assert!(c.cmdline.contains(" y=2 ") && !c.cmdline.contains("x=1"), "{}", c.cmdline);
    assert!(c.pieces.iter().any(|p| p.text == "y=2" && p.origin.contains("50-kata-addons.toml")));

    let refusals = [
        ("[hypervisor.qemu]\ninitrd = \"/i\"\nimage = \"/m\"\n", "both `image`"),
        ("[hypervisor.qemu]\nimage = \"/m\"\nrootfs_type = \"btrfs\"\n", "rootfs_type \"btrfs\""),
        ("[hypervisor.qemu]\nimage = \"/m\"\nkernel_verity_params = \"root_hash=00\"\n", "kernel_verity_params"),
        ("[hypervisor.qemu]\nimage = \"/m\"\nvm_rootfs_driver = \"nvme\"\n", "vm_rootfs_driver"),
        ("[hypervisor.qemu]\nimage = \"/m\"\nenable_debug = \"yes\"\n", "not a boolean"),
        ("[hypervisor.qemu]\nimage = \"/m\"\n[agent.kata.mem_agent]\nenable = true\n", "mem_agent"),
    ];
    for (text, want) in refusals {
        let r = compose_one(Runtime::RuntimeRs, &[frag("/c.toml", text)]);
        assert!(r.as_ref().is_err_and(|e| e.contains(want)), "{text}: {r:?}");
    }
    let go = compose_one(Runtime::Go, &[frag("/c.toml", "[hypervisor.qemu]\nblock_device_driver = \"nvme\"\n")]);
    assert!(go.is_err_and(|e| e.contains("block_device_driver")));
}

#[test]
fn non_confidential_go_guests_get_nr_cpus_and_pmem_roots() {
    let text = "[hypervisor.qemu]\nimage = \"/m\"\ndefault_maxvcpus = 0\nblock_device_driver = \"virtio-blk\"\n";
    let c = compose_one(Runtime::Go, &[frag("/c.toml", text)]).expect("composes");
    assert!(
        c.cmdline
            .contains("root=/dev/pmem0p1 rootflags=dax,data=ordered,errors=remount-ro ro rootfstype=ext4 console=hvc0"),
        "{}",
        c.cmdline
    );
    assert!(c.cmdline.contains(" panic=1 nr_cpus=8 selinux=1 "), "{}", c.cmdline);
}

#[test]
fn the_runtime_is_told_by_the_configuration_path() {
    let rs = "/opt/kata/share/defaults/kata-containers/runtime-rs/runtimes/qemu-snp-runtime-rs/configuration-qemu-snp-runtime-rs.toml";
    assert_eq!(Runtime::of_config(rs), Runtime::RuntimeRs);
    assert_eq!(Runtime::of_config("/etc/kata-containers/configuration-qemu-snp-runtime-rs.toml"), Runtime::RuntimeRs);
    assert_eq!(Runtime::of_config("/opt/kata/share/defaults/kata-containers/configuration-qemu-snp.toml"), Runtime::Go);
    assert_eq!(Runtime::of_config("/etc/kata-containers/kata-snp/configuration.toml"), Runtime::Go);
}
