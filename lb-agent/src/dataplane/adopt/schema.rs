//! Which of a previous program's maps a new build may adopt, and what starting a map
//! fresh costs: the decision from each map's layout and schema version
//! (`lb_common::schema`), kept free of the kernel so it is tested on its own.
//!
//! A map is adopted when the previous program has it, the new object has it, both
//! layouts are equal and both schema versions are equal. A previous program that
//! recorded no versions (a build from before `LB_SCHEMA`) counts as the baseline for
//! every map, so maps are judged by layout alone as before.

use std::{collections::BTreeMap, fmt};

use lb_common::{map_names, schema};

/// What the kernel says about a map's shape: type, key size, value size, entries, flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// `bpf_map_type`.
    pub kind: u32,
    pub key: u32,
    pub value: u32,
    pub entries: u32,
    pub flags: u32,
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match type_name(self.kind) {
            Some(name) => write!(f, "{name}")?,
            None => write!(f, "type {}", self.kind)?,
        }
        write!(
            f,
            ", key {} B, value {} B, {} entries, flags {:#x}",
            self.key, self.value, self.entries, self.flags
        )
    }
}

/// The kernel's name of the map types lb uses (`bpf_map_type`).
fn type_name(kind: u32) -> Option<&'static str> {
    Some(match kind {
        1 => "hash",
        2 => "array",
        3 => "prog_array",
        5 => "percpu_hash",
        6 => "percpu_array",
        9 => "lru_hash",
        10 => "lru_percpu_hash",
        27 => "ringbuf",
        _ => return None,
    })
}

/// The schema versions the previous program recorded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Recorded {
    /// No `LB_SCHEMA` map: a build from before versions; every map is the baseline.
    #[default]
    Nothing,
    /// `LB_SCHEMA` read: map name → version.
    Versions(BTreeMap<String, u32>),
    /// An `LB_SCHEMA` this build cannot read (another format or shape): every version
    /// is unknown, so nothing is adopted.
    Unreadable(String),
}

impl Recorded {
    /// The previous program's version of map `name` (`None`: unknown).
    pub fn version(&self, name: &str) -> Option<u32> {
        match self {
            Recorded::Nothing => Some(schema::BASELINE),
            Recorded::Versions(v) => v.get(name).copied(),
            Recorded::Unreadable(_) => None,
        }
    }

    /// For the summary line: where the previous versions came from.
    pub fn describe(&self) -> String {
        match self {
            Recorded::Nothing => format!(
                "none recorded (a build from before schema versions: baseline v{} for every \
                 map, judged by layout)",
                schema::BASELINE
            ),
            Recorded::Versions(v) => format!("recorded for {} maps", v.len()),
            Recorded::Unreadable(why) => format!("unreadable ({why}): nothing adopted"),
        }
    }
}

/// Why a map is created fresh instead of adopted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fresh {
    /// The previous program has no such map.
    NotInPrevious,
    /// The new object has no such map.
    NotInObject,
    /// The schema versions differ (or the previous one is unknown); the layouts may too.
    Schema {
        was: Option<u32>,
        now: u32,
        layouts: (Layout, Layout),
    },
    /// Same version, another layout (a resized table: `agent.max_backends`,
    /// `agent.max_flows`, or a build that changed a size).
    Layout { was: Layout, now: Layout },
    /// Same layout and version, but the previous table was hashed with another seed (an
    /// earlier release's public one, docs/capacity.md).
    Reseeded,
}

impl Fresh {
    /// Whether the previous map's live entries can be copied into the fresh one: the
    /// same schema and entry layout, only another size or seed (`LB_FLOWS` and
    /// `LB_NAT`, `super::flow_tables`). A schema change never copies: its entries mean
    /// something else.
    pub fn entries_copyable(&self) -> bool {
        match self {
            Fresh::Reseeded => true,
            Fresh::Layout { was, now } => {
                was.kind == now.kind && was.key == now.key && was.value == now.value
            }
            _ => false,
        }
    }
}

/// Whether `name` is a table whose live entries are copied when it cannot be adopted
/// but [`Fresh::entries_copyable`] holds.
pub fn copies_entries(name: &str) -> bool {
    name == map_names::FLOWS || name == map_names::NAT
}

/// The verdict for one map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Adopt,
    Fresh(Fresh),
}

/// Decides for map `name`: `previous` is its layout in the running program (if it has
/// the map), `new` its layout in this build (if the object has it).
pub fn decide(
    name: &str,
    previous: Option<Layout>,
    new: Option<Layout>,
    recorded: &Recorded,
) -> Verdict {
    let Some(was) = previous else {
        return Verdict::Fresh(Fresh::NotInPrevious);
    };
    let Some(now) = new else {
        return Verdict::Fresh(Fresh::NotInObject);
    };
    let ours = schema::version(name).unwrap_or(schema::BASELINE);
    let theirs = recorded.version(name);
    if theirs != Some(ours) {
        return Verdict::Fresh(Fresh::Schema {
            was: theirs,
            now: ours,
            layouts: (was, now),
        });
    }
    if was != now {
        return Verdict::Fresh(Fresh::Layout { was, now });
    }
    Verdict::Adopt
}

impl fmt::Display for Fresh {
    /// Both versions or layouts, as the log line names them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fresh::NotInPrevious => write!(f, "the previous program has no such map"),
            Fresh::NotInObject => write!(f, "this build has no such map"),
            Fresh::Schema {
                was,
                now,
                layouts: (lw, ln),
            } => {
                let was = was.map_or("unknown".to_string(), |v| format!("v{v}"));
                write!(f, "schema {was} -> v{now}")?;
                if lw == ln {
                    write!(f, " (same layout: {ln})")
                } else {
                    write!(f, " (layout was {lw}; now {ln})")
                }
            }
            Fresh::Layout { was, now } => {
                write!(
                    f,
                    "layout changed, same schema version: was {was}; now {now}"
                )
            }
            Fresh::Reseeded => write!(
                f,
                "re-seeded: same layout and schema, but the previous table was hashed with \
                 another seed (an earlier release's public one)"
            ),
        }
    }
}

/// What a fresh `name` means for traffic and state, for operators.
pub fn consequence(name: &str) -> &'static str {
    match name {
        map_names::FLOWS => {
            "new flow table: established flows are re-hashed by Maglev (dsr connections \
             whose service keeps the same servers and weights keep their backend, others \
             may move and break; established nat connections break: the backend resets \
             them); new connections are not affected"
        }
        map_names::NAT => {
            "new nat table: each established nat connection's reverse entry is made again \
             from its next client packet (a reply arriving before it is not translated: \
             the host's kernel resets that connection); with a new LB_FLOWS too, \
             connections get a new source port and break"
        }
        map_names::VIP_INDEX | map_names::VIP_GEN | map_names::VIP_HDR => {
            "services published again from the configuration before the swap (no traffic \
             impact)"
        }
        map_names::MAGLEV | map_names::MAGLEV_GEN => {
            "Maglev tables rebuilt from the configuration before the swap (the same servers \
             and weights give the same tables)"
        }
        map_names::BACKENDS => {
            "backends written again from the configuration before the swap (ids handed \
             out in configuration order: a flow may move if the order changed)"
        }
        map_names::COUNTERS | map_names::SERVICE_STATS | map_names::BACKEND_STATS => {
            "counters restart from zero"
        }
        map_names::EVENTS => "passive events the previous agent had not read are lost",
        map_names::PEER_FLOWS | map_names::PEER_NAT => {
            "cluster mode: the other nodes' connections are installed again by the agent's \
             resync before it announces anything (until then a packet of one of them that \
             reaches this node is handled as a new flow)"
        }
        map_names::CONN_EVENTS => {
            "cluster mode: connection events the previous agent had not read are lost (the \
             other nodes learn those connections from the next refresh)"
        }
        _ => "its previous contents are dropped",
    }
}

/// What a fresh `name` means, given why it is fresh: a table whose entries are
/// copied keeps them.
pub fn consequence_of(name: &str, why: &Fresh) -> &'static str {
    if copies_entries(name) && why.entries_copyable() {
        "the previous table's live entries are copied into the new one before the swap \
         (established connections keep their backends and nat translations; entries the \
         previous program writes between the copy and the swap are not carried over)"
    } else {
        consequence(name)
    }
}

/// The warning line of one map created fresh: the map, both versions or layouts, and
/// the consequence.
pub fn fresh_line(name: &str, why: &Fresh) -> String {
    format!("{name}: {why}: {}", consequence_of(name, why))
}

/// The summary of an adoption: `kept` and `fresh` map names (fresh in the order given),
/// `copied` the fresh tables whose live entries were copied.
pub fn summary(kept: usize, fresh: &[&str], copied: &[&str], recorded: &Recorded) -> String {
    let total = kept + fresh.len();
    if fresh.is_empty() {
        return format!(
            "all {total} maps kept: established connections keep their backends and nat \
             translations; the previous build's schema versions: {}",
            recorded.describe()
        );
    }
    let flows = if copied.contains(&map_names::FLOWS) {
        "established flows copied into the new flow table (they keep their backends)"
    } else if fresh.contains(&map_names::FLOWS) {
        "established flows re-hashed by Maglev (nat connections break)"
    } else {
        "established flows keep their backends"
    };
    let nat = if copied.contains(&map_names::NAT) {
        "nat reverse entries copied into the new nat table"
    } else if fresh.contains(&map_names::NAT) {
        "nat reverse entries made again from each flow's next client packet"
    } else {
        "nat reverse entries kept"
    };
    format!(
        "{kept} of {total} maps kept, {} created fresh ({}): {flows}, {nat}; the \
         previous build's schema versions: {}",
        fresh.len(),
        fresh.join(", "),
        recorded.describe()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLOWS_LAYOUT: Layout = Layout {
        kind: 2,
        key: 4,
        value: 64,
        entries: 262_144,
        flags: 0x400,
    };

    fn versions(pairs: &[(&str, u32)]) -> Recorded {
        Recorded::Versions(pairs.iter().map(|&(n, v)| (n.to_string(), v)).collect())
    }

    #[test]
    fn a_build_without_versions_is_the_baseline_and_judged_by_layout() {
        let same = Some(FLOWS_LAYOUT);
        assert_eq!(
            decide(map_names::FLOWS, same, same, &Recorded::Nothing),
            Verdict::Adopt
        );
        let bigger = Layout {
            entries: 524_288,
            ..FLOWS_LAYOUT
        };
        assert_eq!(
            decide(map_names::FLOWS, same, Some(bigger), &Recorded::Nothing),
            Verdict::Fresh(Fresh::Layout {
                was: FLOWS_LAYOUT,
                now: bigger
            })
        );
    }

    #[test]
    fn equal_versions_and_layouts_adopt_a_differing_version_does_not() {
        let ours = schema::version(map_names::FLOWS).expect("adopted map");
        let l = Some(FLOWS_LAYOUT);
        assert_eq!(
            decide(
                map_names::FLOWS,
                l,
                l,
                &versions(&[(map_names::FLOWS, ours)])
            ),
            Verdict::Adopt
        );
        let other = versions(&[(map_names::FLOWS, ours + 1)]);
        let v = decide(map_names::FLOWS, l, l, &other);
        assert_eq!(
            v,
            Verdict::Fresh(Fresh::Schema {
                was: Some(ours + 1),
                now: ours,
                layouts: (FLOWS_LAYOUT, FLOWS_LAYOUT)
            })
        );
        // The line names the map, both versions, the layout and the consequence.
        let Verdict::Fresh(why) = v else {
            unreachable!()
        };
        let line = fresh_line(map_names::FLOWS, &why);
        assert!(line.starts_with("LB_FLOWS: schema v2 -> v1 (same layout: array, key 4 B"));
        assert!(line.contains("re-hashed by Maglev"), "{line}");
    }

    #[test]
    fn a_map_missing_from_recorded_versions_or_unreadable_metadata_is_not_adopted() {
        let l = Some(FLOWS_LAYOUT);
        let others_only = versions(&[(map_names::NAT, 1)]);
        assert!(matches!(
            decide(map_names::FLOWS, l, l, &others_only),
            Verdict::Fresh(Fresh::Schema { was: None, .. })
        ));
        let bad = Recorded::Unreadable("format v9".into());
        assert!(matches!(
            decide(map_names::NAT, l, l, &bad),
            Verdict::Fresh(Fresh::Schema { was: None, .. })
        ));
    }

    #[test]
    fn a_schema_change_with_a_layout_change_names_both_layouts() {
        let was = FLOWS_LAYOUT;
        let now = Layout {
            value: 72,
            ..FLOWS_LAYOUT
        };
        let v = decide(
            map_names::NAT,
            Some(was),
            Some(now),
            &versions(&[(map_names::NAT, 7)]),
        );
        let Verdict::Fresh(why) = v else {
            panic!("adopted across a schema change")
        };
        let line = fresh_line(map_names::NAT, &why);
        assert!(
            line.contains("schema v7 -> v1 (layout was array, key 4 B, value 64 B"),
            "{line}"
        );
        assert!(line.contains("now array, key 4 B, value 72 B"), "{line}");
        assert!(line.contains("reverse entry is made again"), "{line}");
    }

    #[test]
    fn another_map_type_of_the_same_sizes_is_a_layout_change() {
        let lru = Layout {
            kind: 9,
            ..FLOWS_LAYOUT
        };
        let v = decide(
            map_names::FLOWS,
            Some(lru),
            Some(FLOWS_LAYOUT),
            &Recorded::Nothing,
        );
        let Verdict::Fresh(why) = v else {
            panic!("adopted a map of another type")
        };
        assert_eq!(
            why.to_string(),
            "layout changed, same schema version: was lru_hash, key 4 B, value 64 B, 262144 \
             entries, flags 0x400; now array, key 4 B, value 64 B, 262144 entries, flags 0x400"
        );
    }

    #[test]
    fn missing_maps_on_either_side_are_fresh() {
        let l = Some(FLOWS_LAYOUT);
        assert_eq!(
            decide(map_names::EVENTS, None, l, &Recorded::Nothing),
            Verdict::Fresh(Fresh::NotInPrevious)
        );
        assert_eq!(
            decide(map_names::EVENTS, l, None, &Recorded::Nothing),
            Verdict::Fresh(Fresh::NotInObject)
        );
    }

    #[test]
    fn every_adopted_map_has_a_consequence_and_the_summary_counts() {
        for (name, _) in schema::VERSIONS {
            assert_ne!(consequence(name), consequence("LB_UNKNOWN"), "{name}");
        }
        let all = summary(12, &[], &[], &Recorded::Nothing);
        assert!(all.starts_with("all 12 maps kept: established connections keep"));
        assert!(all.ends_with(
            "schema versions: none recorded (a build from before schema \
             versions: baseline v1 for every map, judged by layout)"
        ));
        let some = summary(
            10,
            &[map_names::FLOWS, map_names::COUNTERS],
            &[],
            &versions(&[]),
        );
        assert_eq!(
            some,
            "10 of 12 maps kept, 2 created fresh (LB_FLOWS, LB_COUNTERS): established flows \
             re-hashed by Maglev (nat connections break), nat reverse entries kept; the previous build's schema \
             versions: recorded for 0 maps"
        );
    }
}
