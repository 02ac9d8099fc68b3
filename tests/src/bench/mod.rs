//! What the benchmarks and flood scenarios measure with: CPU pinning and on-CPU time
//! ([`cpu`]), the agent's flow-table readings during a flood ([`flood_watch`]), the
//! nftables balancer lb is compared with ([`nft_balancer`]), and the per-service cost
//! bench ([`vips_bench`]).

pub mod cpu;
pub mod flood_watch;
pub mod nft_balancer;
pub mod vips_bench;
