//! The real `lb-agent` as the scenarios run and operate it: started, reloaded and
//! stopped with a config rendered from a bed ([`daemon`]), its REST API ([`api`]) and
//! status page in a browser ([`browser`]), its tables read from outside
//! ([`flow_snapshot`], [`nat_census`]), the metric families it documents and the contrib
//! dashboard and alerts query ([`metric_families`]), its private bpffs ([`bpffs`]), and what an
//! operator does: a systemd unit or a container ([`operator`], [`unit_file`],
//! [`confine`]) and upgrades between releases ([`upgrade`]).

pub mod api;
pub mod attached_maps;
pub mod bpffs;
pub mod browser;
pub mod confine;
pub mod daemon;
pub mod flow_snapshot;
pub mod metric_families;
pub mod nat_census;
pub mod operator;
pub mod unit_file;
pub mod upgrade;
