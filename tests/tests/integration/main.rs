//! lb-tests' integration binary: every scenario and fixture that needs root, a kernel
//! with BPF and network namespaces, one module each (the module's `//!` says what it
//! checks). One binary links the harness once; `cargo xtask test` still schedules each
//! module by its class, as if it were a binary of its own (xtask/src/test_classes.rs),
//! and runs a module's tests with `--exact`, so that `cargo xtask test netns_udp` or
//! `cargo test -p lb-tests --test integration netns_udp::` selects one.
//!
//! The BPF_PROG_TEST_RUN fixtures of the XDP program are the `bpf_fixtures` binary.

mod bpf_flood_full_size;
mod bpf_fuzz;
mod browser_status_page;
mod contrib_monitoring;
mod dataplane_backend_capacity;
mod dataplane_maglev_pool;
mod dataplane_native_flag;
mod dataplane_peers;
mod dataplane_slot_writes;
mod flood_bench_smoke;
mod flood_sink;
mod netns_admin_state;
mod netns_balance;
mod netns_chaos;
mod netns_cluster_nat;
mod netns_cluster_sync;
mod netns_doctor;
mod netns_flood_nat_ports;
mod netns_flood_real_size;
mod netns_foreign_mac;
mod netns_getting_started;
mod netns_harness;
mod netns_health_hostile;
mod netns_health_http;
mod netns_health_icmp_forged;
mod netns_health_keeps_connections;
mod netns_health_local_faults;
mod netns_health_passive;
mod netns_health_probes;
mod netns_health_reload_recheck;
mod netns_health_starved_agent;
mod netns_health_syn_check;
mod netns_health_syn_families;
mod netns_health_syn_icmp_defaults;
mod netns_health_syn_icmp_flood;
mod netns_health_test_condition;
mod netns_metrics;
mod netns_multinode;
mod netns_multinode_deadman;
mod netns_multinode_tunnel;
mod netns_multiqueue;
mod netns_nat_hostile;
mod netns_nat_time_wait;
mod netns_neighbour_failed;
mod netns_neighbour_gateway;
mod netns_neighbour_moves;
mod netns_neighbour_netlink;
mod netns_offloads;
mod netns_operator_container;
mod netns_operator_systemd;
mod netns_passive_restart;
mod netns_pmtu;
mod netns_redundancy_backup;
mod netns_redundancy_cap;
mod netns_redundancy_drain;
mod netns_redundancy_failopen;
mod netns_redundancy_spare;
mod netns_reload;
mod netns_restart;
mod netns_restart_max_backends;
mod netns_restart_max_flows;
mod netns_restart_netns_exec;
mod netns_syn_port_reuse;
mod netns_traffic_backup;
mod netns_traffic_hostile;
mod netns_traffic_keepalive;
mod netns_traffic_kill;
mod netns_traffic_ordinary;
mod netns_traffic_spare;
mod netns_tunnel;
mod netns_udp;
mod netns_upgrade;
mod package_install;
mod probe_bench_smoke;
