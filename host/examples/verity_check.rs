//! `verity_check DISK PARAMS [image|extension]`: kata-addons' check of a measured guest
//! image (partition table, filesystem, dm-verity tree against `root_hash` and partition 2)
//! on its own, as an install runs it before the commit point. `bench/verity` times it
//! beside `veritysetup verify --no-superblock` on the same partitions (docs/measured-guests.md).

use anyhow::{Context, Result, bail};
use kata_addons::verity::{self, Params, Role};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (disk, params, role) = match args.as_slice() {
        [d, p] => (d, p, Role::Image),
        [d, p, r] if r == "image" => (d, p, Role::Image),
        [d, p, r] if r == "extension" => (d, p, Role::Extension),
        _ => bail!("usage: verity_check DISK KATA_VERITY_PARAMS [image|extension]"),
    };
    let v = kata_addons_facts::verity::parse(params).map_err(|e| anyhow::anyhow!("{params}: {e}"))?;
    let p = Params::from_hex(&v.root_hash, &v.salt, v.data_blocks, v.data_block_size, v.hash_block_size)
        .map_err(anyhow::Error::msg)?;
    let f = std::fs::File::open(disk).with_context(|| format!("opening {disk}"))?;
    let found = verity::check(&f, disk, role, Some(&p), None)?;
    println!("{disk}: {:?} {:?} root_hash={}", found.table, found.filesystem, found.root_hash.unwrap_or_default());
    Ok(())
}
