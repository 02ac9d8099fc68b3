//! The lab's eBPF object, built by `tests/build.rs` (lb-ebpf with its `lab` feature): the
//! product's programs and maps plus the benchmarks' and test beds' own programs, which the
//! product object (`lb_agent::EBPF_OBJECT`) never holds.

/// The lab object: `lb_reflect` (the benchmarks' floor), the `lbr_*`/`lbrn_*` reduced
/// programs (`lb-components`), `lbt_syn_responder_tc` (the probe bench's remote hosts),
/// next to everything the product object has.
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(env!("LB_LAB_OBJ_PATH"));

/// The bare reflector (swap MACs, `XDP_TX`): the benchmarks' floor.
pub const REFLECT_PROGRAM: &str = "lb_reflect";

/// Whether `name` is one of the lab's own programs (none of them is in the product
/// object): the reflector, a reduced program (`lbr_*`, `lbrn_*`), a test bed's (`lbt_*`).
pub fn is_lab_program(name: &str) -> bool {
    name == REFLECT_PROGRAM
        || ["lbr_", "lbrn_", "lbt_"]
            .iter()
            .any(|p| name.starts_with(p))
}

/// The XDP program `name` of a loaded object (the benchmarks' lookup).
pub fn xdp<'a>(obj: &'a mut aya::Ebpf, name: &str) -> anyhow::Result<&'a mut aya::programs::Xdp> {
    use anyhow::Context as _;
    Ok(obj
        .program_mut(name)
        .with_context(|| format!("no program {name}"))?
        .try_into()?)
}

/// One `BPF_PROG_TEST_RUN` of the reflector `floor` on `packet`: the kernel's time for
/// it in ns; an error unless it reflected (`XDP_TX`).
pub fn floor_ns(floor: &mut aya::programs::Xdp, packet: &[u8]) -> anyhow::Result<u128> {
    use aya::programs::{TestRun, TestRunOptions};
    const XDP_TX: u32 = 3;
    let res = floor.test_run(TestRunOptions {
        data_in: Some(packet),
        ..TestRunOptions::default()
    })?;
    if res.return_value != XDP_TX {
        anyhow::bail!("reflector returned {}", res.return_value);
    }
    Ok(res.duration.as_nanos())
}
