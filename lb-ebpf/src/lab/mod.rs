//! The lab's programs, built only with the `lab` feature (the benchmarks' and test beds'
//! object; the product build never enables it): [`reflect`] the bare reflector
//! (`lb_reflect`, the benchmarks' floor), [`reduced`] and [`reduced_nat`] the `lbr_*`
//! programs that price one component of `lb_xdp` each (`lb-components`), [`lru`] Katran's
//! LRU flow table next to lb's (`lb-fill-bench`), [`anchor_maps`] Cilium's conntrack and
//! SNAT maps for the memory comparison (`lb-fill-bench --memory`), [`testbed`] the
//! probe bench's SYN responder (`lbt_syn_responder_tc`). Never attached by the agent.

mod anchor_maps;
mod lru;
mod reduced;
mod reduced_nat;
mod reflect;
mod testbed;
