//! The data plane's life around `lb-agent run` (docs/restarts.md): take the locks, find
//! and adopt what a previous agent left on the interface, attach after the config is
//! published, watch the attachment, and say truthfully at exit what stays behind.

use std::{path::Path, time::Duration};

use anyhow::Context;
use lb_agent::{
    dataplane::{
        AttachMode, AttachedProgram, BpfDataplane, DataplaneError, DataplaneLifecycle, LinkCheck,
        LinkWatch, MapSizes, PublishedState,
        adopt::{
            self, flow_tables, owner,
            pin::{self, PinDir},
            schema,
        },
        attach::caps,
        if_index,
    },
    doctor::native_xdp::{self, NativeXdp},
    event_loop::AttachmentWatch,
};
use lb_common::table::TableLayout;
use tracing::{error, info, warn};

/// The loaded (not yet attached) data plane and what it took over.
pub struct Prepared {
    pub dp: BpfDataplane,
    /// What the maps held when adopted (empty on a fresh start).
    pub adopted: PublishedState,
    /// lb's program found on the interface, replaced by [`attach`].
    pub previous: Option<AttachedProgram>,
    /// Held for the life of the agent: the pin directory's lock.
    pub pin_lock: Option<std::fs::File>,
}

/// Locks the interface (and pin directory), finds what runs on the interface, and loads
/// the program on the previous program's maps (unless `reset`), the backend maps sized
/// by `sizes` (a previous map of another size is created fresh, as a layout change).
pub fn prepare(
    interface: &str,
    pin_path: Option<&Path>,
    reset: bool,
    sizes: MapSizes,
) -> anyhow::Result<Prepared> {
    if let Some(missing) = caps::missing() {
        return Err(DataplaneError::MissingCapabilities { missing }.into());
    }
    let ifindex = if_index(interface)?;
    owner::claim_interface(ifindex, interface)?;
    let (pins, pin_lock) = match pin_path {
        Some(path) => {
            let pins = PinDir::prepare(path)
                .with_context(|| format!("preparing the pin directory {}", path.display()))?;
            let lock = owner::claim_pin_dir(pins.path())?;
            if pins.legacy_link(interface).exists() {
                warn!(
                    pin = %pins.legacy_link(interface).display(),
                    "an older lb-agent pinned its XDP bpf_link here; this agent swaps its \
                     program into that link (docs/restarts.md, migration)"
                );
            }
            (Some(pins), Some(lock))
        }
        None => (None, None),
    };
    let previous = adopt::attached_program(ifindex, interface)?;
    // The tables' seeds are the install's: a restart finds them in the running
    // program's `LB_CONFIG` (a first start, or `--reset`, draws new ones).
    let old_tables = match &previous {
        Some(p) if p.is_ours() && !reset => Some(
            flow_tables::previous_tables(p)
                .with_context(|| format!("reading the table layout of program id {}", p.id))?,
        ),
        _ => None,
    };
    let sizes = flow_tables::with_seeds(sizes, old_tables.as_ref())?;
    if flow_tables::inherits_public_seeds(sizes, old_tables.as_ref()) {
        warn!(
            interface,
            "the flow and nat tables keep the public hash seeds of the earlier release \
             running here, so that this upgrade and a rollback to it keep every flow; \
             another agent.max_flows, or --reset (which drops the flows), gives this \
             install its own secret seeds (docs/capacity.md)"
        );
    }
    let maps = match &previous {
        Some(p) if !p.is_ours() => return Err(p.in_the_way(interface).into()),
        Some(p) if reset => {
            warn!(
                interface,
                program_id = p.id,
                "--reset: replacing the running lb program with fresh maps (pinned flows and NAT \
                 state are dropped)"
            );
            None
        }
        Some(p) => Some(
            adopt::adopt_maps(
                p,
                lb_agent::EBPF_OBJECT,
                sizes,
                old_tables
                    .as_ref()
                    .map_or(TableLayout::BUILT_IN, |t| t.layout),
            )
            .with_context(|| format!("adopting the maps of program id {}", p.id))?,
        ),
        None => None,
    };
    let mut dp =
        BpfDataplane::load_sized(maps.as_ref(), pins, sizes).context("loading the XDP program")?;
    if let (Some(old), Some(m)) = (old_tables, &maps) {
        let was = old.layout;
        for (map, copied) in dp
            .copy_tables(old, m)
            .context("copying the previous flow and nat tables")?
        {
            info!(
                map,
                kept = copied.kept,
                dropped = copied.dropped,
                incompatible = copied.incompatible,
                was_buckets = if map == lb_common::map_names::FLOWS {
                    was.flow_buckets
                } else {
                    was.nat_buckets
                },
                "table resized or re-seeded: the previous table's live entries were copied"
            );
        }
    }
    let layout = sizes.tables();
    let memory = sizes.table_memory();
    info!(
        max_flows = sizes.max_flows(),
        flow_buckets = layout.flow_buckets,
        nat_buckets = layout.nat_buckets,
        source_entries = sizes.source_entries(),
        memory_mib = memory.total() / (1 << 20),
        "flow and nat tables"
    );
    let adopted = if maps.as_ref().is_some_and(|m| !m.maps.is_empty()) {
        dp.published_state().context("reading the adopted state")?
    } else {
        PublishedState::default()
    };
    match (&previous, &maps) {
        (Some(p), Some(m)) => {
            info!(
                interface,
                program_id = p.id,
                mode = p.mode.name(),
                services = adopted.services.len(),
                backends = adopted.backends.len(),
                maps_kept = m.maps.len(),
                maps_fresh = m.fresh.len(),
                "adopted the previous state: the running program's maps are kept"
            );
            for (name, why) in &m.fresh {
                warn!(
                    map = name,
                    reason = %why,
                    consequence = schema::consequence_of(name, why),
                    "map not adopted, created fresh"
                );
            }
            let fresh: Vec<&str> = m.fresh.iter().map(|(n, _)| *n).collect();
            let copied: Vec<&str> = m
                .fresh
                .iter()
                .filter(|(n, why)| schema::copies_entries(n) && why.entries_copyable())
                .map(|(n, _)| *n)
                .collect();
            let summary = schema::summary(m.maps.len(), &fresh, &copied, &m.recorded);
            if fresh.is_empty() {
                info!("maps adopted: {summary}");
            } else {
                warn!("maps adopted: {summary}");
            }
        }
        (Some(p), None) => info!(
            interface,
            program_id = p.id,
            "starting fresh (--reset): nothing adopted"
        ),
        (None, _) => info!(
            interface,
            "starting fresh: no lb program on the interface, nothing to adopt"
        ),
    }
    Ok(Prepared {
        dp,
        adopted,
        previous,
        pin_lock,
    })
}

/// Attaches (or swaps in) the program once its maps hold the configured state. A fresh
/// attach in `auto` mode takes generic mode where native XDP cannot forward (doctor's
/// judgement, docs/doctor.md); in `native` mode that is said loudly.
pub fn attach(
    dp: &mut impl DataplaneLifecycle,
    interface: &str,
    mode: AttachMode,
    previous: Option<&AttachedProgram>,
) -> anyhow::Result<()> {
    let mode = match (mode, previous) {
        (AttachMode::Auto | AttachMode::Native, None) => native_or_generic(interface, mode)?,
        _ => mode,
    };
    dp.attach(interface, mode, previous)
        .with_context(|| format!("attaching to {interface}"))?;
    Ok(())
}

/// `mode`, or generic mode for `auto` where native XDP cannot forward.
fn native_or_generic(interface: &str, mode: AttachMode) -> anyhow::Result<AttachMode> {
    let NativeXdp::CannotDeliver { why, .. } = native_xdp::judge(interface, if_index(interface)?)
    else {
        return Ok(mode);
    };
    if mode == AttachMode::Auto {
        warn!(
            interface,
            "{why}; xdp_mode \"auto\" attaches in generic mode, which delivers"
        );
        Ok(AttachMode::Generic)
    } else {
        error!(
            interface,
            "{why}; xdp_mode = \"native\" attaches as configured and nothing is forwarded \
             until that is fixed (\"auto\" takes generic mode here)"
        );
        Ok(mode)
    }
}

/// How often the agent checks that the interface still runs its XDP program, at least
/// (link notifications trigger a check at once).
const LINK_WATCH_EVERY: Duration = Duration::from_secs(1);

/// The watch over the program's attachment: checked on link notifications and every
/// [`LINK_WATCH_EVERY`], re-attached when removed behind the agent.
pub struct Attachment {
    link: LinkWatch,
    reattached: u64,
}

impl Attachment {
    /// Subscribes to link notifications (inside a tokio runtime).
    pub fn watch() -> Self {
        Attachment {
            link: LinkWatch::new(LINK_WATCH_EVERY),
            reattached: 0,
        }
    }
}

impl<D: DataplaneLifecycle> AttachmentWatch<D> for Attachment {
    async fn due(&mut self) {
        self.link.due().await
    }

    /// After a repair, returns the mode text for status (`native, re-attached N times
    /// after removal`); an error means the agent cannot serve and must stop.
    fn check(&mut self, dp: &mut D) -> Result<Option<String>, DataplaneError> {
        match dp.check_attachment() {
            Ok(LinkCheck::Intact) => Ok(None),
            Ok(LinkCheck::Reattached) => {
                self.reattached += 1;
                error!(
                    interface = dp.interface(),
                    mode = dp.mode_name(),
                    times = self.reattached,
                    "the XDP program was removed from the interface behind the agent (`ip link set \
                     ... xdp off`?); re-attached it. Use `lb-agent detach` after stopping the agent \
                     to remove it"
                );
                Ok(Some(format!(
                    "{}, re-attached {} times after removal",
                    dp.mode_name(),
                    self.reattached
                )))
            }
            Err(err @ DataplaneError::Netlink { .. }) => {
                // Reading the interface failed (not: it is gone); try again next period.
                warn!(error = %err, "could not check the XDP attachment");
                Ok(None)
            }
            Err(err) => {
                error!(error = %err, "the data plane is not ours any more; stopping");
                Err(err)
            }
        }
    }
}

/// The last log line, saying what actually stays behind.
pub fn log_shutdown(dp: &impl DataplaneLifecycle) {
    if dp.still_attached() {
        info!(
            interface = dp.interface(),
            mode = dp.mode_name(),
            "shutting down: the XDP program stays attached and forwarding with the last \
             published state; a restarted agent adopts it (`lb-agent detach` removes it)"
        );
    } else {
        warn!(
            interface = dp.interface(),
            "shutting down: the XDP program is NOT attached to the interface"
        );
    }
    if let Some(p) = dp.pins() {
        let scope = if pin::private_mount_namespace() {
            " (in this process's own mount namespace: they vanish with it)"
        } else {
            ""
        };
        info!(pins = %p.path().display(), "maps stay pinned{scope}");
    }
}
