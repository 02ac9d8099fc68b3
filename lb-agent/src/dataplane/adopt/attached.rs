//! The state a previous agent left on the interface, found without bpffs: the
//! interface's XDP program (netlink) → its descriptor by id → its map ids → each map by
//! id, matched to the object's maps by name and checked for the same layout.

use std::os::fd::{AsFd, OwnedFd};

use aya::maps::MapData;
use lb_common::{
    FULL_PATH_INDEX, FULL_PROGRAM_NAME, PROGRAM_NAME, map_names, schema as versions,
    table::TableLayout,
};

use crate::netlink::{self, XdpAttached, XdpProgram};

use super::{
    flow_tables,
    schema::{self, Fresh, Layout, Recorded, Verdict},
    schema_map,
};
use crate::dataplane::{DataplaneError, sizing::MapSizes, sys};

/// Kernel object names are cut to 15 bytes.
const KERNEL_NAME_LEN: usize = 15;

/// Maps a new program takes over from the previous one (the clock cache is not state).
pub const ADOPTED_MAPS: [&str; 15] = [
    map_names::VIP_INDEX,
    map_names::VIP_GEN,
    map_names::VIP_HDR,
    map_names::MAGLEV,
    map_names::MAGLEV_GEN,
    map_names::BACKENDS,
    map_names::FLOWS,
    map_names::NAT,
    map_names::COUNTERS,
    map_names::SERVICE_STATS,
    map_names::BACKEND_STATS,
    map_names::EVENTS,
    map_names::PEER_FLOWS,
    map_names::PEER_NAT,
    map_names::CONN_EVENTS,
];

/// An XDP program on the interface.
#[derive(Debug)]
pub struct AttachedProgram {
    pub id: u32,
    /// Kernel name (at most 15 bytes).
    pub name: String,
    pub mode: XdpAttached,
    /// Held to replace exactly this program (`IFLA_XDP_EXPECTED_FD`).
    pub fd: OwnedFd,
    map_ids: Vec<u32>,
}

impl AttachedProgram {
    /// Whether it is lb's balancer (`lb_xdp`, or `lb_xdp_full` attached on its own).
    pub fn is_ours(&self) -> bool {
        self.name == PROGRAM_NAME || self.name == FULL_PROGRAM_NAME
    }

    /// Ids of its maps (with its tail-call target's), `LB_SCHEMA` among them when the
    /// build that loaded it recorded its versions.
    pub fn map_ids(&self) -> &[u32] {
        &self.map_ids
    }

    /// The refusal for an interface this program occupies: names it and how to remove it.
    pub fn in_the_way(&self, interface: &str) -> DataplaneError {
        DataplaneError::Occupied {
            interface: interface.to_string(),
            id: self.id,
            name: self.name.clone(),
            mode: self.mode.name(),
            off: match self.mode {
                XdpAttached::Generic => "xdpgeneric off",
                XdpAttached::Driver => "xdpdrv off",
                XdpAttached::Offload => "xdpoffload off",
                XdpAttached::Multi => "xdp off",
            },
        }
    }
}

/// The previous program's maps that the new program adopts.
#[derive(Debug, Default)]
pub struct AdoptedMaps {
    /// By object map name; only maps whose layout matches the new object's.
    pub maps: Vec<(&'static str, MapData)>,
    /// Maps created fresh instead, with the reason (schema or layout changed, missing).
    pub fresh: Vec<(&'static str, Fresh)>,
    /// The schema versions the previous program recorded.
    pub recorded: Recorded,
}

/// The program attached to `ifindex`, with a descriptor of it, if any.
pub fn attached_program(
    ifindex: u32,
    interface: &str,
) -> Result<Option<AttachedProgram>, DataplaneError> {
    let Some(XdpProgram { id, mode }) =
        netlink::query_xdp(ifindex).map_err(|source| DataplaneError::Netlink {
            what: format!("reading the XDP program of `{interface}`"),
            source,
        })?
    else {
        return Ok(None);
    };
    let fd = sys::prog_fd_by_id(id).map_err(|source| DataplaneError::Previous {
        what: format!(
            "opening XDP program id {id} of `{interface}` (BPF_PROG_GET_FD_BY_ID needs \
             CAP_SYS_ADMIN: grant it, e.g. `docker run --cap-add SYS_ADMIN`, to adopt the \
             running program; or remove that program first, `ip link set dev {interface} \
             xdp off`, and start fresh, dropping its flows)"
        ),
        source,
    })?;
    let info = sys::prog_info(fd.as_fd()).map_err(|source| DataplaneError::Previous {
        what: format!("reading XDP program id {id} of `{interface}`"),
        source,
    })?;
    let mut map_ids = info.map_ids;
    // `lb_xdp` reaches most maps through its tail call: `lb_xdp_full`'s count too.
    if let Some(full) = tail_call_target(&map_ids) {
        let more = sys::prog_fd_by_id(full)
            .and_then(|fd| sys::prog_info(fd.as_fd()))
            .map_err(|source| DataplaneError::Previous {
                what: format!("reading program id {full}, the tail-call target of id {id}"),
                source,
            })?;
        for m in more.map_ids {
            if !map_ids.contains(&m) {
                map_ids.push(m);
            }
        }
    }
    Ok(Some(AttachedProgram {
        id,
        name: info.name,
        mode,
        fd,
        map_ids,
    }))
}

/// The program in `LB_PROGRAMS` among the maps `map_ids`, if one is there.
fn tail_call_target(map_ids: &[u32]) -> Option<u32> {
    for &id in map_ids {
        let Ok(map) = MapData::from_id(id) else {
            continue;
        };
        let Ok(info) = map.info() else { continue };
        if info.name() != map_names::PROGRAMS.as_bytes() {
            continue;
        }
        let fd = map.fd().as_fd();
        return sys::prog_array_entry(fd, FULL_PATH_INDEX).ok().flatten();
    }
    None
}

/// Opens the maps of `program` that the object `object` (ELF bytes), loaded with
/// `sizes`, can use as they are.
///
/// `was` is the layout the previous program's tables were built with
/// (`super::flow_tables::previous_tables`): `LB_FLOWS` and `LB_NAT` are adopted only with the
/// same buckets and seed.
pub fn adopt_maps(
    program: &AttachedProgram,
    object: &[u8],
    sizes: MapSizes,
    was: TableLayout,
) -> Result<AdoptedMaps, DataplaneError> {
    let parsed = aya_obj::Object::parse(object).map_err(|e| DataplaneError::Previous {
        what: "parsing the embedded XDP object".to_string(),
        source: std::io::Error::other(e.to_string()),
    })?;
    let mut by_name = Vec::new();
    for &id in &program.map_ids {
        let map = MapData::from_id(id).map_err(|e| DataplaneError::Previous {
            what: format!("opening map id {id} of program id {}", program.id),
            source: std::io::Error::other(e.to_string()),
        })?;
        let info = map.info().map_err(|e| DataplaneError::Previous {
            what: format!("reading map id {id}"),
            source: std::io::Error::other(e.to_string()),
        })?;
        let name = String::from_utf8_lossy(info.name()).into_owned();
        by_name.push((name, info, map));
    }
    // The versions the previous build recorded (none: a build from before them).
    let recorded = match by_name.iter().position(|(n, _, _)| n == versions::META_MAP) {
        Some(at) => {
            let (_, info, map) = by_name.swap_remove(at);
            schema_map::read(map.fd().as_fd(), info.key_size(), info.value_size())
        }
        None => Recorded::Nothing,
    };
    let mut out = AdoptedMaps {
        recorded: recorded.clone(),
        ..AdoptedMaps::default()
    };
    for name in ADOPTED_MAPS {
        let short = &name[..name.len().min(KERNEL_NAME_LEN)];
        let found = by_name
            .iter()
            .position(|(n, _, _)| n == short)
            .map(|at| by_name.swap_remove(at));
        let have = found.as_ref().map(|(_, info, _)| Layout {
            kind: info.map_type().map_or(u32::MAX, |t| t as u32),
            key: info.key_size(),
            value: info.value_size(),
            entries: info.max_entries(),
            flags: info.map_flags(),
        });
        let wanted = parsed.maps.get(name).map(|want| Layout {
            kind: want.map_type(),
            key: want.key_size(),
            value: created_value_size(want),
            entries: sizes.entries(name).unwrap_or(want.max_entries()),
            flags: want.map_flags(),
        });
        let verdict = match schema::decide(name, have, wanted, &recorded) {
            // Same layout and version, but hashed with another seed (an earlier
            // release's public one): fresh, and the live entries are copied.
            Verdict::Adopt
                if !flow_tables::same_table(name, &was, &sizes.tables(), sizes.cluster()) =>
            {
                Verdict::Fresh(Fresh::Reseeded)
            }
            v => v,
        };
        match (verdict, found) {
            (Verdict::Adopt, Some((_, _, map))) => out.maps.push((name, map)),
            (Verdict::Fresh(why), _) => out.fresh.push((name, why)),
            (Verdict::Adopt, None) => out.fresh.push((name, Fresh::NotInPrevious)),
        }
    }
    Ok(out)
}

/// The value size the kernel reports for a map created from `def`: a ring buffer's BTF
/// definition carries its event type (aya-ebpf 0.3), but aya creates it with value size 0,
/// as the kernel requires.
fn created_value_size(def: &aya_obj::maps::Map) -> u32 {
    if def.map_type() == aya_obj::generated::bpf_map_type::BPF_MAP_TYPE_RINGBUF as u32 {
        0
    } else {
        def.value_size()
    }
}
