//! The packet-parser fuzz target, bounded: 20,000 mutated frames through
//! BPF_PROG_TEST_RUN, each verdict checked against the reference classifier
//! (`lb_tests::bpf::classify`) and the invariants of `lb_tests::bpf::fuzz`. Needs root.
//! Longer runs: `cargo xtask fuzz --frames N --seed S`.

use lb_common::counters::{
    DROP_BAD_FLAGS, DROP_BAD_SOURCE, DROP_MALFORMED, DROP_NO_BACKEND, NAMES, PASS_FRAGMENT,
    PASS_MALFORMED, PASS_NOT_FOR_HOST, PASS_NOT_IP, PASS_NOT_VIP, PASS_TTL_EXPIRED,
    PASS_UNSUPPORTED_L4, TX_DSR,
};

#[test]
fn mutated_frames_match_the_reference_classifier() {
    let report = lb_tests::bpf::fuzz::run(20_000, 12).unwrap_or_else(|e| panic!("{e}"));
    println!("{report}");
    // The mutator must reach every rule, or agreement proves little.
    for counter in [
        PASS_NOT_IP,
        PASS_MALFORMED,
        PASS_FRAGMENT,
        PASS_UNSUPPORTED_L4,
        PASS_NOT_FOR_HOST,
        PASS_TTL_EXPIRED,
        PASS_NOT_VIP,
        DROP_BAD_SOURCE,
        DROP_BAD_FLAGS,
        DROP_MALFORMED,
        DROP_NO_BACKEND,
        TX_DSR,
    ] {
        assert!(
            report.outcomes.contains(&counter),
            "no frame of the run ended as {}:\n{report}",
            NAMES[counter as usize]
        );
    }
}
