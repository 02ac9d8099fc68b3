//! The product object holds only the product: `lb_agent::EBPF_OBJECT` (what the agent
//! embeds and attaches) has none of the lab's programs (`lb_reflect`, `lbr_*`, `lbrn_*`,
//! `lbt_*`), the lab object (`lb_tests::bpf::lab::OBJECT`, lb-ebpf's `lab` feature) has them
//! and every program of the product's; and the lab's reflector does what the benchmarks
//! take as their floor; the lab's LRU table (Katran's, for `lb-fill-bench`) hits what it
//! inserted, and the maps it weighs lb's memory against have their products' sizes.

use std::collections::BTreeSet;

use super::prelude::*;
use aya::{
    EbpfLoader,
    programs::{TestRun, TestRunOptions, Xdp},
};
use lb_common::map_names;
use lb_tests::bpf::{
    lab::{self, REFLECT_PROGRAM, is_lab_program},
    stack::StackMap,
    syn_responder,
};

fn programs(obj: &[u8]) -> BTreeSet<String> {
    StackMap::parse(obj)
        .expect("a BPF ELF object")
        .programs()
        .map(str::to_string)
        .collect()
}

#[test]
fn the_product_object_holds_only_the_product() {
    let product = programs(lb_agent::EBPF_OBJECT);
    let lab = programs(lab::OBJECT);
    for name in [
        lb_common::PROGRAM_NAME,
        lb_common::FULL_PROGRAM_NAME,
        lb_common::PASS_PROGRAM_NAME,
        lb_common::DECAP_PROGRAM_NAME,
    ] {
        assert!(product.contains(name), "{name} in the product: {product:?}");
    }
    let strays: Vec<&String> = product.iter().filter(|p| is_lab_program(p)).collect();
    assert!(
        strays.is_empty(),
        "lab programs in the product object: {strays:?}"
    );
    assert!(
        product.is_subset(&lab),
        "the lab object lacks product programs: {:?}",
        product.difference(&lab).collect::<Vec<_>>()
    );
    let lab_only: BTreeSet<&String> = lab.difference(&product).collect();
    assert!(lab_only.iter().all(|p| is_lab_program(p)), "{lab_only:?}");
    // The ones the benchmarks and test beds load, by name.
    for name in [
        REFLECT_PROGRAM,
        syn_responder::PROGRAM,
        "lbr_tx",
        "lbr_flow_insert",
    ] {
        assert!(lab.contains(name), "{name} in the lab object: {lab:?}");
    }
}

#[test]
fn the_lab_reflector_swaps_the_macs_and_transmits() {
    // Only the reflector runs: the balancer's big tables are made small.
    let mut ebpf = EbpfLoader::new()
        .map_max_entries(map_names::FLOWS, 64)
        .map_max_entries(map_names::NAT, 64)
        .load(lab::OBJECT)
        .expect("loading the lab object");
    let prog: &mut Xdp = ebpf
        .program_mut(REFLECT_PROGRAM)
        .expect("lb_reflect in the lab object")
        .try_into()
        .expect("an XDP program");
    prog.load().expect("the verifier accepts lb_reflect");
    let f = to_vip(DSR4, CPORT, TCP_SYN);
    let mut out = vec![0u8; f.bytes().len() + 256];
    let result = prog
        .test_run(TestRunOptions {
            data_in: Some(&f.bytes()),
            data_out: Some(&mut out),
            ..TestRunOptions::default()
        })
        .expect("BPF_PROG_TEST_RUN of lb_reflect");
    out.truncate(result.data_size_out as usize);
    assert_eq!(result.return_value, XDP_TX, "lb_reflect transmits");
    assert_frames_eq(
        "lb_reflect swaps the MACs",
        &f.clone().macs(LB_MAC, CLIENT_MAC).bytes(),
        &out,
    );
}

/// The maps `lb-fill-bench --memory` weighs lb's tables against have the key and value
/// sizes of the products they stand for: Cilium's IPv4 conntrack (16 / 56 B) and SNAT
/// (16 / 40 B) maps, Katran's flow table (40 / 16 B).
#[test]
fn the_lab_anchor_maps_have_the_products_sizes() {
    let ebpf = EbpfLoader::new()
        .map_max_entries(map_names::FLOWS, 64)
        .map_max_entries(map_names::NAT, 64)
        .map_max_entries("LBR_LRU", 64)
        .load(lab::OBJECT)
        .expect("loading the lab object");
    for (name, key, value) in [
        ("LBR_CILIUM_CT4", 16, 56),
        ("LBR_CILIUM_SNAT4", 16, 40),
        ("LBR_LRU", 40, 16),
    ] {
        let map = ebpf
            .map(name)
            .unwrap_or_else(|| panic!("{name} in the lab object"));
        let data = match map {
            aya::maps::Map::HashMap(d) | aya::maps::Map::LruHashMap(d) => d,
            _ => panic!("{name}: a hash map"),
        };
        let info = data.info().expect("map info");
        assert_eq!(
            (info.key_size(), info.value_size()),
            (key, value),
            "{name}: key and value sizes"
        );
    }
}

#[test]
fn the_lab_lru_programs_insert_then_hit() {
    let mut ebpf = EbpfLoader::new()
        .map_max_entries(map_names::FLOWS, 64)
        .map_max_entries(map_names::NAT, 64)
        .map_max_entries("LBR_LRU", 64)
        .load(lab::OBJECT)
        .expect("loading the lab object");
    let mut run = |name: &str, frame: &Frame| -> u32 {
        let prog: &mut Xdp = ebpf
            .program_mut(name)
            .unwrap_or_else(|| panic!("{name} in the lab object"))
            .try_into()
            .expect("an XDP program");
        if prog.fd().is_err() {
            prog.load()
                .unwrap_or_else(|e| panic!("the verifier rejects {name}: {e}"));
        }
        prog.test_run(TestRunOptions {
            data_in: Some(&frame.bytes()),
            ..TestRunOptions::default()
        })
        .expect("BPF_PROG_TEST_RUN")
        .return_value
    };
    let (a, b) = (
        to_vip(DSR4, CPORT, TCP_SYN),
        to_vip(DSR4, CPORT + 1, TCP_SYN),
    );
    assert_eq!(run("lbr_lru_hit", &a), XDP_DROP, "not there yet: a miss");
    assert_eq!(run("lbr_lru_new", &a), XDP_TX, "a new flow is inserted");
    assert_eq!(run("lbr_lru_new", &a), XDP_DROP, "then it is no new flow");
    assert_eq!(run("lbr_lru_hit", &a), XDP_TX, "an established flow hits");
    assert_eq!(run("lbr_lru_hit", &b), XDP_DROP, "another flow misses");
}
