//! Errors of the data-plane owner.

use std::io;

use crate::netlink::NetlinkError;

/// Something the kernel or the object refused.
#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    #[error("loading the XDP object failed")]
    Load(#[source] aya::EbpfError),
    #[error("the XDP object has no program `{name}`")]
    MissingProgram { name: &'static str },
    #[error("the XDP object has no map `{name}`")]
    MissingMap { name: &'static str },
    #[error("program `{name}`")]
    Program {
        name: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("interface `{interface}` does not exist")]
    NoSuchInterface { interface: String },
    #[error("attaching XDP to `{interface}` in {mode} mode failed")]
    Attach {
        interface: String,
        mode: &'static str,
        #[source]
        source: NetlinkError,
    },
    #[error(
        "`{interface}` already runs XDP program id {id} `{name}` ({mode}), which lb-agent did \
         not load; remove it first (`ip link set dev {interface} {off}`), or use another interface"
    )]
    Occupied {
        interface: String,
        id: u32,
        name: String,
        mode: &'static str,
        /// The `ip link` keyword that removes it.
        off: &'static str,
    },
    #[error(
        "`{interface}` runs lb's XDP program id {id} through a bpf_link that is not pinned in \
         this agent's pin_path (an older lb-agent pins it there as `link_xdp_{interface}`: \
         give this agent the same pin_path and it swaps into the link), so it cannot be \
         replaced in place; or stop its holder, run `lb-agent detach` (a short interruption) \
         and start this agent"
    )]
    HeldByLink { interface: String, id: u32 },
    #[error("{what}")]
    Netlink {
        what: String,
        #[source]
        source: NetlinkError,
    },
    #[error("{what}")]
    Previous {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error(
        "lb-agent lacks {missing}: it needs CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN) to \
         load the program, CAP_NET_ADMIN to attach it and CAP_SYS_ADMIN to adopt a running \
         one; run it as root or grant them (systemd: AmbientCapabilities=CAP_BPF CAP_PERFMON \
         CAP_NET_ADMIN CAP_NET_RAW CAP_SYS_ADMIN; docker: --cap-add BPF --cap-add PERFMON \
         --cap-add NET_ADMIN --cap-add SYS_ADMIN)"
    )]
    MissingCapabilities { missing: String },
    #[error(
        "the XDP program of `{interface}` changed behind the agent: now {now}; the agent does \
         not fight another program for the interface"
    )]
    Replaced { interface: String, now: String },
    #[error("interface `{interface}` (index {ifindex}) is gone")]
    InterfaceGone { interface: String, ifindex: u32 },
    #[error(
        "map `{name}`: {count} entries found both their buckets full (the table holds `agent.max_flows` connections)"
    )]
    TableFull { name: &'static str, count: usize },
    #[error("map `{name}` has another layout: {detail}")]
    Layout { name: &'static str, detail: String },
    #[error("map `{name}`")]
    Map {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("{what}")]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("no VIP index seed fits {services} services and their nat source addresses")]
    VipIndexFull { services: usize },
    #[error(
        "Maglev table for service {service_id} has {len} slots, expected one of {sizes:?}",
        sizes = lb_common::MAGLEV_SIZES
    )]
    TableSize { service_id: u32, len: usize },
    #[error("slot {slot} is not in service {service_id}'s published Maglev table ({size} slots)")]
    SlotOutside {
        service_id: u32,
        slot: u32,
        size: usize,
    },
    #[error("backend id {id} is outside the backend maps (ids 1..={max}, `agent.max_backends`)")]
    BackendOutside { id: u32, max: u32 },
    #[error(
        "no room in the Maglev pool for service {service_id}'s tables of {size} slots \
         ({wanted} blocks; the largest free run is {largest}): fewer or smaller services \
         (`maglev_size`)"
    )]
    MaglevPoolFull {
        service_id: u32,
        size: u32,
        wanted: u32,
        largest: u32,
    },
}
