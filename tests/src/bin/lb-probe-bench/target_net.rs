//! Where the probe targets live: on loopback beside the agent (`loopback`), or in a
//! namespace of their own behind a veth pair whose receive side runs in a NAPI kernel
//! thread (`veth`), as backends on other hosts; or behind the same pair but answered by
//! a BPF program instead of listeners (`remote`: `lb_tests::bpf::syn_responder`, SYN checks
//! only), so that the targets' own kernel work, which remote hosts would do, is not on
//! this machine's two CPUs.
//!
//! On loopback every packet is received in the softirq of its sender, so the agent's
//! CPU time includes the targets' half of every handshake and reset as well. With
//! `veth` each end of the pair receives in a NAPI thread of its own: the targets' kernel
//! work runs in `napi/pbt-…` and is counted as theirs; the agent host's receive work
//! (the probes' SYN-ACKs and the ACKs they trigger) runs in `napi/pba-…`, reported apart
//! from the agent process, as a NIC's softirq on a real host would be.

use std::{
    fs,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    os::fd::AsRawFd,
    path::Path,
    sync::OnceLock,
    time::Duration,
};

use anyhow::{Context, bail};
use lb_tests::{
    bench::cpu,
    net::{
        link::{self, Link, Mac, VethEnd},
        names,
        netns::NetNs,
    },
};

/// First port of the targets on each address.
pub const BASE_PORT: u16 = 20_000;
/// Targets per address (ports stay below the ephemeral range, 32768).
pub const PORTS_PER_IP: usize = 10_000;

/// The agent's end of the veth pair and its address.
const AGENT_IF: &str = "pba";
const AGENT_IP: Ipv4Addr = Ipv4Addr::new(10, 203, 0, 1);
/// The targets' end; their addresses are 10.203.0.2, .3, … (one per `PORTS_PER_IP`).
pub const TARGET_IF: &str = "pbt";
const FIRST_TARGET_HOST: u8 = 2;

/// Where the targets are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Net {
    Loopback,
    Veth,
    Remote,
}

impl Net {
    pub fn name(self) -> &'static str {
        match self {
            Net::Loopback => "loopback",
            Net::Veth => "veth",
            Net::Remote => "remote",
        }
    }

    /// Whether the targets are behind the veth pair (their own namespace).
    pub fn has_veth(self) -> bool {
        self != Net::Loopback
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "loopback" => Some(Net::Loopback),
            "veth" => Some(Net::Veth),
            "remote" => Some(Net::Remote),
            _ => None,
        }
    }
}

static NET: OnceLock<Net> = OnceLock::new();

/// Chooses where this process's targets are; once per process, before any address is
/// asked for.
pub fn select(net: Net) -> anyhow::Result<()> {
    NET.set(net)
        .map_err(|_| anyhow::anyhow!("the target network was already chosen"))
}

fn net() -> Net {
    NET.get().copied().unwrap_or(Net::Loopback)
}

/// The `k`-th address targets listen on.
fn target_ip(k: usize) -> Ipv4Addr {
    match net() {
        Net::Loopback => Ipv4Addr::new(127, 0, k as u8, 1),
        Net::Veth | Net::Remote => Ipv4Addr::new(10, 203, 0, FIRST_TARGET_HOST + k as u8),
    }
}

/// The address of target `i` (`…:20000`, `…:20001`, … then the next address).
pub fn target_addr(i: usize) -> SocketAddr {
    SocketAddr::new(
        IpAddr::V4(target_ip(i / PORTS_PER_IP)),
        BASE_PORT + (i % PORTS_PER_IP) as u16,
    )
}

/// The index of a target from its address (inverse of [`target_addr`]).
pub fn target_index(addr: SocketAddr) -> usize {
    let IpAddr::V4(ip) = addr.ip() else {
        return usize::MAX;
    };
    let k = match net() {
        Net::Loopback => usize::from(ip.octets()[2]),
        Net::Veth | Net::Remote => usize::from(ip.octets()[3].wrapping_sub(FIRST_TARGET_HOST)),
    };
    k * PORTS_PER_IP + usize::from(addr.port().wrapping_sub(BASE_PORT))
}

/// The two namespaces of `veth` mode and the pair between them; all removed on drop.
pub struct TargetNet {
    agent: NetNs,
    targets: NetNs,
    _link: Link,
}

impl TargetNet {
    /// Namespaces for the agent and for `count` targets, joined by a veth pair; the
    /// targets' end gets a NAPI thread. With `remote` the targets' process attaches the
    /// responder to its end (`targets::serve`) and the queues are deeper (below).
    pub fn create(count: usize, net: Net) -> anyhow::Result<Self> {
        names::sweep_stale_once();
        let tag = names::unique_tag();
        let agent = NetNs::create(&format!("{tag}-pa"))?;
        let targets = NetNs::create(&format!("{tag}-pt"))?;
        let link = link::veth_pair(
            VethEnd {
                ns: &agent,
                name: AGENT_IF,
                mac: Mac([0x02, 0xbe, 0, 0, 0, 1]),
            },
            VethEnd {
                ns: &targets,
                name: TARGET_IF,
                mac: Mac([0x02, 0xbe, 0, 0, 0, 2]),
            },
        )?;
        agent.ip(&["addr", "add", &format!("{AGENT_IP}/24"), "dev", AGENT_IF])?;
        for k in 0..count.div_ceil(PORTS_PER_IP) {
            let ip = Ipv4Addr::new(10, 203, 0, FIRST_TARGET_HOST + k as u8);
            targets.ip(&["addr", "add", &format!("{ip}/24"), "dev", TARGET_IF])?;
        }
        agent.ip(&["link", "set", AGENT_IF, "up"])?;
        targets.ip(&["link", "set", TARGET_IF, "up"])?;
        // A veth has NAPI instances only while it is up, and hands them only packets
        // from senders without TSO.
        for (ns, ifname) in [(&agent, AGENT_IF), (&targets, TARGET_IF)] {
            link::set_tso(ns, ifname, false)?;
            link::set_threaded_napi(ns, ifname)?;
            // A queue in front of the pair, as a NIC has (txqueuelen 1000): with one, a
            // full veth ring pushes back on the sender (Linux 6.16+) instead of dropping
            // the burst, as a NIC's full TX ring does. Without it a burst of SYNs
            // (`sendmmsg`) overflows the 256-entry ring whenever the peer's NAPI thread
            // waits for a CPU, which no NIC would do.
            //
            // `remote` carries two packets per probe each way (SYN and our kernel's RST
            // out, the answer back) at 100,000 probes a second, and a veth drains only
            // when its peer's NAPI thread gets a CPU: 1,000 packets are 5 ms of that, less
            // than one scheduling delay on this 2-CPU machine (1,000 dropped 4,160 answers
            // and 8,650 of our packets in one 30 s run), where a NIC drains at line rate
            // whatever its host's scheduler does. 10,000 (50 ms) hold those delays.
            ns.hold_bursts(ifname, if net == Net::Remote { 10_000 } else { 1000 })?;
        }

        Ok(Self {
            agent,
            targets,
            _link: link,
        })
    }

    /// Moves the calling thread into the agent's namespace. Call it before any other
    /// thread starts: threads made later inherit it, earlier ones do not.
    pub fn enter_agent(&self) -> anyhow::Result<()> {
        let path = Path::new(names::NETNS_DIR).join(self.agent.name());
        let file = fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
        // SAFETY: setns on a valid namespace fd changes only this thread's namespace.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            bail!(
                "setns into {}: {}",
                self.agent.name(),
                std::io::Error::last_os_error()
            );
        }
        Ok(())
    }

    /// The command line prefix that runs a program in the targets' namespace.
    pub fn exec_prefix(&self) -> [&str; 3] {
        ["netns", "exec", self.targets.name()]
    }
}

/// Which end of the veth pair.
#[derive(Clone, Copy, Debug)]
pub enum End {
    Agent,
    Targets,
}

/// Pins the NAPI thread(s) of one end to `cpu` (`veth` only; nothing on loopback).
pub fn pin_napi(end: End, cpu: usize) -> anyhow::Result<()> {
    if !net().has_veth() {
        return Ok(());
    }
    let threads = cpu::napi_threads(end_if(end));
    if threads.is_empty() {
        bail!("no NAPI thread for {}", end_if(end));
    }
    for t in threads {
        cpu::pin(t, cpu)?;
    }
    Ok(())
}

fn end_if(end: End) -> &'static str {
    match end {
        End::Agent => AGENT_IF,
        End::Targets => TARGET_IF,
    }
}

/// CPU time of the NAPI thread(s) of one end so far (zero on loopback: there are none).
pub fn napi_cpu(end: End) -> Duration {
    if !net().has_veth() {
        return Duration::ZERO;
    }
    cpu::on_cpu(&cpu::napi_threads(end_if(end)))
}
