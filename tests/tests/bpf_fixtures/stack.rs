//! The stack budget (docs/internals/fast-path.md, "Stack budget"): read from the object the
//! fixtures load, every function's frame and the deepest BPF-to-BPF call chain of each
//! program. The programs lb attaches (`lb_xdp`, `lb_xdp_full`, `lb_pass`) and the
//! benchmarks' floor (`lb_reflect`, in the lab object) stay within `STACK_BUDGET` (the
//! verifier's 512 bytes less 64), so that no change brings them back to the edge
//! unnoticed; every program of both objects fits the limit.

use lb_tests::bpf::stack::{STACK_BUDGET, STACK_LIMIT, StackMap, rounded};

/// The programs lb attaches or tail-calls.
const PRODUCTION: [&str; 4] = ["lb_xdp", "lb_xdp_full", "lb_xdp_peer", "lb_pass"];

#[test]
fn programs_fit_the_stack_budget() {
    let map = StackMap::parse(lb_agent::EBPF_OBJECT).expect("the XDP object parses");

    // The model sees what the verifier sees: lb_xdp_full's frame, and the table scans it
    // calls as BPF global functions (their frames add to its own).
    let full = &map.functions["lb_xdp_full"];
    assert!(full.frame > 0, "lb_xdp_full has a stack frame");
    for callee in [
        "lb_flow_claim",
        "lb_flow_find",
        "lb_nat_claim",
        "lb_nat_find",
    ] {
        assert!(
            full.calls.contains(callee),
            "lb_xdp_full calls {callee}: {:?}",
            full.calls
        );
    }
    let chain = map.chain("lb_xdp_full").expect("lb_xdp_full");
    assert!(chain.functions.len() >= 2, "{chain:?}");

    for name in PRODUCTION {
        let chain = map
            .chain(name)
            .unwrap_or_else(|| panic!("{name} in the object"));
        let frames: Vec<String> = chain
            .functions
            .iter()
            .map(|f| format!("{f} {}", rounded(map.functions[f].frame)))
            .collect();
        println!("{name}: {} bytes ({})", chain.bytes, frames.join(" + "));
        assert!(
            chain.bytes <= STACK_BUDGET,
            "{name} needs {} bytes of stack ({}), over the budget of {STACK_BUDGET} \
             (the verifier's {STACK_LIMIT} less a margin of 64): see docs/internals/fast-path.md, \
             \"Stack budget\"",
            chain.bytes,
            frames.join(" + "),
        );
    }
    let lab = StackMap::parse(lb_tests::bpf::lab::OBJECT).expect("the lab object parses");
    let floor = lab
        .chain(lb_tests::bpf::lab::REFLECT_PROGRAM)
        .expect("lb_reflect");
    assert!(floor.bytes <= STACK_BUDGET, "lb_reflect: {floor:?}");
    for map in [&map, &lab] {
        for name in map.programs() {
            let chain = map.chain(name).expect("a program of the object");
            assert!(
                chain.bytes <= STACK_LIMIT,
                "{name} needs {} bytes of stack: {chain:?}",
                chain.bytes
            );
        }
    }
}
