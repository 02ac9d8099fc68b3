//! lb-agent's agent tests in one binary: the whole agent under paused time (`util`: a
//! scripted prober, the in-memory data plane and the event loop of `lb-agent run`,
//! stepped by the test), a module per behaviour.

mod admin;
mod admin_state;
mod admin_validation;
mod announce;
mod backup;
mod cap;
mod cluster;
mod detection;
mod essential;
mod event_loop;
mod fail_open;
mod local_faults;
mod mac_updates;
mod passive;
mod passive_coverage;
mod propagation;
mod publish_failure;
mod recompute_scope;
mod reload;
mod report_routes;
mod snapshot;
mod snapshot_incremental;
mod snapshot_on_demand;
mod spares;
mod util;
