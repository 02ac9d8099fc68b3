//! The two test beds of the flood benchmark on the namespace topology, and the kernel
//! threads on the path pinned and prioritised.
//!
//! - **end to end**: the sender is the client (its `eth0`, through the switch's bridge
//!   to the lb host), the lb host forwards through the bridge to b1..b3, whose XDP
//!   programs count and drop the flood;
//! - **wire**: the sender sits on the switch's port toward the lb host (`p-lb`) and the
//!   counting sink is that port's XDP program, as a traffic generator cabled to the lb's
//!   NIC: the bridge and the backends' receive work leave the sender's CPU, so the lb
//!   host's core can be driven to saturation.
//!
//! The reflector's frames go back toward the sender: on the wire into the same `p-lb`
//! sink, end to end through the bridge to the client, whose `eth0` has a sink of its
//! own for them (the balancers' frames never reach it).

use anyhow::{Context, bail};
use lb_tests::{
    bench::cpu,
    bpf::drop_prog,
    net::{
        link,
        netns::NetNs,
        topology::{Forwarding, HOST_IF, Topology},
    },
    scenario::balance::WEIGHTS,
};

use crate::{
    balancers::{self, Kind},
    measure::Probe,
};

/// CPU of the lb host's receive side; everything else runs on the other one.
pub const LB_CPU: usize = 0;
pub const OTHER_CPU: usize = 1;
/// `SCHED_FIFO` priority of the NAPI threads on the path (the kernel's default for
/// threaded interrupt handlers).
const NAPI_PRIORITY: i32 = 50;
/// Switch ports whose receive side gets a NAPI thread on OTHER_CPU: from the client,
/// and from the lb host.
const SWITCH_NAPI: [&str; 2] = ["p-client", "p-lb"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setup {
    EndToEnd,
    Wire,
}

impl Setup {
    pub const ALL: [Setup; 2] = [Setup::EndToEnd, Setup::Wire];

    pub fn key(self) -> &'static str {
        match self {
            Setup::EndToEnd => "e2e",
            Setup::Wire => "wire",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Setup::EndToEnd => "end to end: client → bridge → lb → bridge → b1..b3 (XDP sinks)",
            Setup::Wire => "wire: generator and XDP sink on the switch port facing the lb",
        }
    }
}

/// A built test bed: the topology, its sinks, and where the sender sends.
pub struct Bed {
    // Fields drop in order: the sinks before their interfaces.
    pub sinks: Vec<drop_prog::DropCounter>,
    /// End to end: the sink on the client's `eth0`, where the reflector's frames arrive.
    pub returned: Option<drop_prog::DropCounter>,
    pub topo: Topology,
    pub setup: Setup,
}

impl Bed {
    pub fn build(setup: Setup) -> anyhow::Result<Bed> {
        let mut builder = Topology::builder()
            .backends(WEIGHTS.len())
            .forwarding(Forwarding::Nat);
        if setup == Setup::Wire {
            builder = builder.without_pass_on("lb");
        }
        let topo = builder
            .build()
            .context("building the topology (as root?)")?;
        let sinks = match setup {
            Setup::EndToEnd => topo
                .backends()
                .iter()
                .map(|b| drop_prog::attach(&b.ns, HOST_IF, balancers::PORT))
                .collect::<Result<Vec<_>, _>>()?,
            Setup::Wire => vec![drop_prog::attach(topo.switch(), "p-lb", balancers::PORT)?],
        };
        let returned = match setup {
            Setup::EndToEnd => Some(drop_prog::attach(
                &topo.client().ns,
                HOST_IF,
                balancers::PORT,
            )?),
            Setup::Wire => None,
        };
        lb_tests::bench::nft_balancer::prepare_lb_host(&topo)?;
        // The lb host receives in its own NAPI thread on LB_CPU; the switch receives from
        // the client and from the lb host in threads of their own on OTHER_CPU (in
        // softirq they would run in ksoftirqd under a flood, behind every other task).
        // A veth hands TSO senders' packets around NAPI: the switch side that sends to
        // the lb host gets TSO off (the hosts' eth0 have it off already).
        link::set_threaded_napi(&topo.lb().ns, HOST_IF)?;
        link::set_tso(topo.switch(), "p-lb", false)?;
        for port in SWITCH_NAPI {
            link::set_threaded_napi(topo.switch(), port)?;
        }
        Ok(Bed {
            sinks,
            returned,
            topo,
            setup,
        })
    }

    /// Where the sender puts its frames.
    fn sender(&self) -> (&NetNs, &'static str) {
        match self.setup {
            Setup::EndToEnd => (&self.topo.client().ns, HOST_IF),
            Setup::Wire => (self.topo.switch(), "p-lb"),
        }
    }

    /// What a measurement of `kind` reads (the sinks its frames reach), with the NAPI
    /// threads pinned and prioritised: attaching or detaching XDP re-creates them, so
    /// this follows every balancer's start.
    pub fn probe(&self, kind: Kind, pid: Option<u32>) -> anyhow::Result<Probe<'_>> {
        let sinks = match (&self.returned, kind) {
            (Some(returned), Kind::Reflector) => std::slice::from_ref(returned),
            _ => &self.sinks[..],
        };
        let napi_threads = one_napi_thread(HOST_IF)?;
        for &t in &napi_threads {
            cpu::pin(t, LB_CPU)?;
            realtime(t)?;
        }
        let mut switch_threads = Vec::new();
        for port in SWITCH_NAPI {
            let threads = one_napi_thread(port)?;
            for &t in &threads {
                cpu::pin(t, OTHER_CPU)?;
                realtime(t)?;
            }
            switch_threads.extend(threads);
        }
        Ok(Probe {
            topo: &self.topo,
            sinks,
            napi_threads,
            switch_threads,
            sender: self.sender(),
            pid,
        })
    }
}

/// The NAPI thread of our interface `ifname` (a veth has one receive queue). Threads are
/// found by name, across namespaces: another test bed with a threaded interface of the
/// same name (another benchmark running) would mix its CPU time into ours, so that is
/// refused.
fn one_napi_thread(ifname: &str) -> anyhow::Result<Vec<u32>> {
    let threads = cpu::napi_threads(ifname);
    match threads.len() {
        1 => Ok(threads),
        0 => bail!("no NAPI thread for {ifname}"),
        n => bail!(
            "{n} NAPI threads named after {ifname}: another benchmark with threaded NAPI on \
             an interface of that name is running; run one at a time"
        ),
    }
}

/// Gives kernel thread `tid` `SCHED_FIFO` priority [`NAPI_PRIORITY`]: on a shared
/// machine the receive threads otherwise wait behind other work while their queues
/// overflow. They only run while frames arrive, and the kernel's RT throttling leaves
/// other work 5 % of the CPU even then.
fn realtime(tid: u32) -> anyhow::Result<()> {
    let param = libc::sched_param {
        sched_priority: NAPI_PRIORITY,
    };
    // SAFETY: a plain syscall on a task id with a parameter struct we own.
    let rc = unsafe { libc::sched_setscheduler(tid as libc::pid_t, libc::SCHED_FIFO, &param) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("SCHED_FIFO for NAPI thread {tid}"));
    }
    Ok(())
}
