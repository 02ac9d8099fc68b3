//! lb's agent: configuration, Maglev tables, and the owner of the data plane.
//!
//! Layout:
//! - [`agent`]: the brain — health, membership and publishing wired together;
//! - [`event_loop`]: the loop that feeds the agent its inputs, in `lb-agent run` and tests;
//! - [`config`]: the TOML configuration (DESIGN.md §7), validated with file/line/key errors;
//! - [`probe`]: active probes (http/https, tcp, udp, icmp) and their per-(server, probe) scheduler;
//! - [`health`]: the per-server health state machine (probe results + passive signals -> state);
//! - [`maglev`]: the pure weighted Maglev table builder;
//! - [`membership`]: per-service roles from health, admin, spares, backup levels, cap, fail-open;
//! - [`publish`]: turns desired services into data-plane writes (ids, backends, tables);
//! - [`dataplane`]: the single owner of every BPF map handle (load, attach, publish, read);
//! - [`testing`]: the in-memory data plane for tests and benchmarks (never `lb-agent run`'s);
//! - [`host`]: this host's addresses (a nat `snat_ip` must be one);
//! - [`neighbour`]: backend MAC resolution through the kernel's neighbour table;
//! - [`netlink`]: the one rtnetlink stack (requests, acknowledgements, subscriptions, XDP attach);
//! - [`hwaddr`]: the attached interface's own MAC (the data plane balances only frames to it);
//! - [`announce`]: VIP announcement to BGP routers (through BIRD) driven by health and drain;
//! - [`discovery`]: DNS discovery of `resolve = true` servers (SRV, A/AAAA) and re-resolution at TTL;
//! - [`rlimit`]: the file-descriptor limit, raised at start;
//! - [`sd_notify`]: readiness, watchdog and stopping for a systemd `Type=notify` unit;
//! - [`build_info`]: version, commit and the XDP object's hash;
//! - [`cluster`]: the nat connections shared with the peers of `[cluster]` over QUIC;
//! - [`doctor`]: the host preflight of `lb-agent doctor` (docs/doctor.md);
//! - [`import`]: lb.toml from keepalived and Angie/nginx configs (`lb-agent import`, docs/migrating.md);
//! - [`view`]: the snapshot the operator surface shows; [`api`]: REST API and `/metrics`;
//! - `util`: durable file writes and the ordered join of address-sorted sequences.
//!
//! The binary (`src/main.rs`, `src/cli/`) wires them into `lb-agent run`.
pub mod agent;
pub mod alloc;
pub mod announce;
pub mod api;
pub mod build_info;
pub mod cluster;
pub mod config;
pub mod dataplane;
pub mod discovery;
pub mod doctor;
pub mod event_loop;
pub mod health;
pub mod host;
pub mod hwaddr;
pub mod import;
pub mod maglev;
pub mod membership;
pub mod neighbour;
pub mod netlink;
pub mod probe;
pub mod publish;
pub mod rlimit;
pub mod sd_notify;
pub mod testing;
mod util;
pub mod view;

/// The XDP object built by `build.rs`, embedded so the binary is one file to copy.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("LB_EBPF_OBJ_PATH"));
