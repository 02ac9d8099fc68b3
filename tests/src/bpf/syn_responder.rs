//! Remote hosts for the probe bench, on one BPF program of the lab object
//! ([`crate::bpf::lab`]): `lbt_syn_responder_tc` (lb-ebpf's `lab::testbed`, at TC ingress) answers every TCP SYN to a target address with a
//! SYN-ACK, or with an RST-ACK for a target marked closed, out of the interface it came
//! in on, and consumes the prober's other segments, so that 100,000 targets cost this
//! machine a few percent of a CPU instead of a kernel's listen path per SYN
//! (`lb-probe-bench --net remote`; why TC and not XDP: lb-ebpf's `lab::testbed`).

use std::ffi::CString;

use crate::util::error::Error;
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, MapData},
    programs::{
        ProgramError, SchedClassifier, TcAttachType, TestRun, TestRunOptions,
        tc::{self, SchedClassifierLinkId},
    },
};
use lb_common::map_names;

/// The program's name in the object.
pub const PROGRAM: &str = "lbt_syn_responder_tc";
/// Its map of closed targets (`u8` per target index, nonzero = closed).
const CLOSED_MAP: &str = "LBT_CLOSED";
/// Target indexes it knows: `(last address byte - 2) × PORTS_PER_HOST + (port - 20000)`.
pub const TARGETS: u32 = 1 << 18;
/// Ports per target address (lb-ebpf's `testbed::LBT_PORTS_PER_HOST`).
pub const PORTS_PER_HOST: u32 = 10_000;

/// The loaded responder; attached to an interface with [`SynResponder::attach`],
/// detached when dropped.
pub struct SynResponder {
    ebpf: Ebpf,
    link: Option<SchedClassifierLinkId>,
}

impl std::fmt::Debug for SynResponder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SynResponder")
            .field("attached", &self.link.is_some())
            .finish()
    }
}

impl SynResponder {
    /// Loads the program (every target open), not attached.
    pub fn load() -> Result<Self, Error> {
        // The object carries the balancer's maps too; only the responder is used here,
        // so the big tables are made small.
        let mut ebpf = EbpfLoader::new()
            .map_max_entries(map_names::FLOWS, 64)
            .map_max_entries(map_names::NAT, 64)
            .load(crate::bpf::lab::OBJECT)
            .map_err(Error::bpf(
                "loading the lab object (lb_tests::bpf::lab::OBJECT)",
            ))?;
        classifier(&mut ebpf)?
            .load()
            .map_err(|e| program_error("loading it into the kernel", e))?;
        Ok(Self { ebpf, link: None })
    }

    /// Attaches the TC program at `ifname`'s ingress (resolved in the calling thread's
    /// network namespace; a `clsact` qdisc is added if there is none): its answers leave
    /// through `ifname`'s egress.
    pub fn attach(&mut self, ifname: &str) -> Result<(), Error> {
        let name = CString::new(ifname).map_err(|e| {
            program_error(
                &format!("interface name {ifname:?}"),
                ProgramError::IOError(e.into()),
            )
        })?;
        // Already there is fine; anything else shows in the attach below.
        let _ = tc::qdisc_add_clsact(name.as_c_str());
        let link = classifier(&mut self.ebpf)?
            .attach(name.as_c_str(), TcAttachType::Ingress)
            .map_err(|e| program_error(&format!("attaching it to {ifname}'s ingress"), e))?;
        self.link = Some(link);
        Ok(())
    }

    /// Marks target `index` closed (answered with an RST-ACK) or open.
    pub fn set_closed(&mut self, index: u32, closed: bool) -> Result<(), Error> {
        if index >= TARGETS {
            return Err(Error::Unexpected(format!(
                "target index {index} is outside the responder's {TARGETS}"
            )));
        }
        let mut map: Array<&mut MapData, u8> = Array::try_from(
            self.ebpf
                .map_mut(CLOSED_MAP)
                .ok_or_else(|| missing(CLOSED_MAP))?,
        )
        .map_err(Error::bpf(format!("{PROGRAM}'s map {CLOSED_MAP}")))?;
        map.set(index, &u8::from(closed), 0)
            .map_err(Error::bpf(format!("{PROGRAM}'s map {CLOSED_MAP}")))
    }

    /// Runs it once on `frame` (BPF_PROG_TEST_RUN): its verdict (`TC_ACT_*`) and the
    /// frame it left.
    pub fn run(&mut self, frame: &[u8]) -> Result<(u32, Vec<u8>), Error> {
        let mut out = vec![0u8; frame.len() + 256];
        let result = classifier(&mut self.ebpf)?
            .test_run(TestRunOptions {
                data_in: Some(frame),
                data_out: Some(&mut out),
                ..Default::default()
            })
            .map_err(|e| program_error("BPF_PROG_TEST_RUN", e))?;
        out.truncate(result.data_size_out as usize);
        Ok((result.return_value, out))
    }
}

fn classifier(ebpf: &mut Ebpf) -> Result<&mut SchedClassifier, Error> {
    ebpf.program_mut(PROGRAM)
        .and_then(|p| p.try_into().ok())
        .ok_or_else(|| missing(PROGRAM))
}

impl Drop for SynResponder {
    fn drop(&mut self) {
        if let (Some(link), Ok(program)) = (self.link.take(), classifier(&mut self.ebpf)) {
            let _ = program.detach(link);
        }
    }
}

fn program_error(what: &str, source: ProgramError) -> Error {
    Error::bpf(format!("the SYN responder: {what}"))(source)
}

fn missing(name: &str) -> Error {
    Error::Unexpected(format!(
        "the object has no program or map {name:?} of the expected type"
    ))
}
