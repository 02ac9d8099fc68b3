//! The switch of a bed: a namespace with the bridge [`BRIDGE`], each host's interface
//! plugged into a port of it by a veth pair, and, where the bed asks for it, `lb_pass`
//! on the ports (which native-mode `XDP_TX` on the host side needs, see
//! [`crate::bpf::pass_prog`]). Dropping it detaches the programs, deletes the ports and
//! the bridge, then the namespace.

use aya::programs::XdpMode;

use crate::{
    bpf::pass_prog::{self, PassPrograms},
    net::{
        link::{self, Link, Mac, Offloads, VethEnd},
        netns::NetNs,
        topology::BRIDGE,
    },
    util::error::Error,
};

/// A bridge in a namespace of its own, with the ports plugged so far.
#[derive(Debug)]
pub struct Switch {
    // Fields drop in this order: programs, ports, bridge, namespace.
    pass: Option<PassPrograms>,
    ports: Vec<(String, Link)>,
    _bridge: Link,
    ns: NetNs,
}

impl Switch {
    /// Creates namespace `{tag}-sw` with the bridge up.
    pub fn create(tag: &str) -> Result<Switch, Error> {
        let ns = NetNs::create(&format!("{tag}-sw"))?;
        let bridge = link::bridge(&ns, BRIDGE)?;
        Ok(Switch {
            pass: None,
            ports: Vec::new(),
            _bridge: bridge,
            ns,
        })
    }

    /// Plugs `host` (its namespace, interface name and MAC) into a new port `port`
    /// whose own MAC is `port_mac`.
    pub fn plug(&mut self, port: &str, port_mac: Mac, host: VethEnd<'_>) -> Result<(), Error> {
        self.plug_with_queues(port, port_mac, host, 1)
    }

    /// [`Switch::plug`] through a veth pair of `queues` receive and transmit queues on
    /// each end ([`link::veth_pair_with_queues`]).
    pub fn plug_with_queues(
        &mut self,
        port: &str,
        port_mac: Mac,
        host: VethEnd<'_>,
        queues: u32,
    ) -> Result<(), Error> {
        let link = plug_with_queues(&self.ns, BRIDGE, port, port_mac, host, queues)?;
        self.ports.push((port.to_owned(), link));
        Ok(())
    }

    /// Attaches `lb_pass` in `mode` to every port but those in `skip`.
    pub fn attach_pass(&mut self, mode: XdpMode, skip: &[String]) -> Result<(), Error> {
        let ports: Vec<&str> = self
            .ports
            .iter()
            .map(|(name, _)| name.as_str())
            .filter(|name| !skip.iter().any(|s| s == name))
            .collect();
        self.pass = Some(pass_prog::attach(&self.ns, &ports, mode)?);
        Ok(())
    }

    /// Readies the ports for `offloads` and attaches `lb_pass` in `mode` to them but
    /// those in `skip`. Beds whose hosts keep their offloads get it only on `p-lb`
    /// (native `XDP_TX` from the lb needs it; on a host's port it would take the host's
    /// TSO: a veth whose peer runs XDP loses GSO); the ports are readied as
    /// [`Switch::wire_ports`] does.
    pub fn attach_pass_for(
        &mut self,
        offloads: Offloads,
        mode: XdpMode,
        skip: &[String],
    ) -> Result<(), Error> {
        let mut skip = skip.to_vec();
        if offloads != Offloads::FullChecksums {
            skip.extend(
                self.ports
                    .iter()
                    .map(|(name, _)| name.clone())
                    .filter(|name| name != "p-lb"),
            );
        }
        self.wire_ports(offloads)?;
        self.attach_pass(mode, &skip)
    }

    /// Readies the ports for `offloads`: with [`Offloads::HostDefaults`] every port sends
    /// full checksums, so that the bridge segments TSO packets and completes checksums
    /// before they leave through a port, as a wire carries them; otherwise they keep
    /// veth's defaults.
    pub fn wire_ports(&self, offloads: Offloads) -> Result<(), Error> {
        if offloads == Offloads::HostDefaults {
            for (name, _) in &self.ports {
                link::set_tx_checksum(&self.ns, name, false)?;
            }
        }
        Ok(())
    }

    /// The switch's namespace.
    pub fn ns(&self) -> &NetNs {
        &self.ns
    }
}

/// Plugs `host` into `bridge` of namespace `ns` through a new port `port` (MAC
/// `port_mac`), set up; the returned guard deletes the veth pair.
pub fn plug(
    ns: &NetNs,
    bridge: &str,
    port: &str,
    port_mac: Mac,
    host: VethEnd<'_>,
) -> Result<Link, Error> {
    plug_with_queues(ns, bridge, port, port_mac, host, 1)
}

/// [`plug`] through a veth pair of `queues` receive and transmit queues on each end.
pub fn plug_with_queues(
    ns: &NetNs,
    bridge: &str,
    port: &str,
    port_mac: Mac,
    host: VethEnd<'_>,
    queues: u32,
) -> Result<Link, Error> {
    let link = link::veth_pair_with_queues(
        VethEnd {
            ns,
            name: port,
            mac: port_mac,
        },
        host,
        queues,
    )?;
    ns.ip_batch(&[
        format!("link set {port} master {bridge}"),
        format!("link set {port} up"),
    ])?;
    Ok(link)
}
