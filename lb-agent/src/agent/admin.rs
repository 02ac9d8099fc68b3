//! Runtime admin requests from the API: patch (weight, spare, drain, down, reset), add
//! and remove a server, node drain. Each is checked with the config loader's rules,
//! recorded in the runtime admin state (`admin_state.rs`) and published at once.

use std::net::{IpAddr, SocketAddr};

use tokio::time::Instant;

use super::{Agent, Configured, Neighbours};
use crate::{
    api::{AdminChange, AdminError, AdminRequest},
    dataplane::Dataplane,
    health::Transition,
    membership::Admin,
    probe::Prober,
};

impl<D: Dataplane, P: Prober, N: Neighbours> Agent<D, P, N> {
    /// A runtime change from the API.
    pub async fn on_admin(&mut self, req: AdminRequest) {
        if let AdminChange::NodeDrain(drained) = req.change {
            let _ = req.reply.send(self.set_node_drained(drained));
            return;
        }
        let result = self.admin(&req.service, &req.address, req.change).await;
        // The caller's next GET must see its change: that read rebuilds the snapshot
        // (not this answer: at 10,000 servers a rebuild costs more than the change).
        if result.is_ok() {
            self.persistence.save_admin_state();
            self.snapshot.changed_by_admin();
        }
        let _ = req.reply.send(result);
    }

    pub(super) async fn admin(
        &mut self,
        service: &str,
        address: &str,
        change: AdminChange,
    ) -> Result<(), AdminError> {
        let now = Instant::now();
        let started = std::time::Instant::now();
        let si = self
            .services
            .iter()
            .position(|s| s.cfg.name == service)
            .ok_or_else(|| AdminError::NoService(service.to_string()))?;
        let no_server = || AdminError::NoServer {
            service: service.to_string(),
            address: address.to_string(),
        };
        let addr = match (&change, address.parse::<SocketAddr>()) {
            (_, Ok(addr)) => addr,
            (AdminChange::Add(_), Err(_)) => {
                return Err(AdminError::Invalid(format!(
                    "`{address}` is not an address:port"
                )));
            }
            // A server given without its port, as the config allows: the service's one
            // server at that IP.
            (_, Err(_)) => {
                let ip: IpAddr = address.parse().map_err(|_| {
                    AdminError::Invalid(format!("`{address}` is not an address or address:port"))
                })?;
                let mut at_ip = self.services[si].servers.keys().filter(|a| a.ip() == ip);
                match (at_ip.next(), at_ip.next()) {
                    (Some(addr), None) => *addr,
                    (None, _) => return Err(no_server()),
                    (Some(_), Some(_)) => {
                        return Err(AdminError::Invalid(format!(
                            "service {service:?} has several servers at {ip}: give the port"
                        )));
                    }
                }
            }
        };
        let invalid = |e: crate::config::ServerRuleError| AdminError::Invalid(e.0);
        let change_kind = match &change {
            AdminChange::Add(_) => ChangeKind::Add,
            _ => ChangeKind::Other,
        };
        let mut added_or_removed = None;
        match change {
            AdminChange::Patch(p) => {
                let server = self.services[si]
                    .servers
                    .get_mut(&addr)
                    .ok_or_else(no_server)?;
                if let Some(w) = p.weight {
                    crate::config::check_weight(w).map_err(invalid)?;
                }
                if let Some(spare) = p.spare {
                    crate::config::check_backup(server.backup, spare).map_err(invalid)?;
                }
                let before = server.state_name();
                if p.reset == Some(true) {
                    if let Some(file) = server.configured {
                        server.weight = file.weight;
                        server.spare = file.spare;
                    }
                    server.admin = Admin::Up;
                }
                if let Some(w) = p.weight {
                    server.weight = w;
                }
                if let Some(s) = p.spare {
                    server.spare = s;
                }
                match (p.down, p.drain) {
                    (Some(true), _) => server.admin = Admin::Down,
                    (Some(false), _) if server.admin == Admin::Down => server.admin = Admin::Up,
                    _ => {}
                }
                match p.drain {
                    Some(true) if server.admin != Admin::Down => server.admin = Admin::Drain,
                    Some(false) if server.admin == Admin::Drain => server.admin = Admin::Up,
                    _ => {}
                }
                let after = server.state_name();
                self.persistence
                    .admin_state_mut()
                    .record_patch(service, server, &p);
                if before != after {
                    let t = Transition {
                        from: server.health.state(),
                        to: server.health.state(),
                        cause: "admin".into(),
                    };
                    self.record_names(service, address, before, after, &t.cause);
                }
            }
            AdminChange::Add(new) => {
                if self.services[si].servers.contains_key(&new.address) {
                    return Err(AdminError::Invalid(format!(
                        "{} is already a server",
                        new.address
                    )));
                }
                // The config loader's rules (config::server_rules).
                crate::config::check_server(
                    &self.services[si].cfg,
                    new.address,
                    new.weight,
                    new.spare,
                    new.backup,
                )
                .map_err(invalid)?;
                let max = self.publishing.publisher().max_backends() as usize;
                if self.services.iter().map(|s| s.servers.len()).sum::<usize>() >= max {
                    return Err(AdminError::Invalid(format!(
                        "the data plane holds at most {max} servers over all services \
                         (`agent.max_backends`)"
                    )));
                }
                self.persistence.admin_state_mut().record_add(service, &new);
                let cfg = self.services[si].cfg.clone();
                let conf = Configured {
                    weight: new.weight,
                    spare: new.spare, // with a backup level refused above (check_server)
                    backup: new.backup,
                };
                let mut server = self.probing.start(
                    &cfg,
                    new.address,
                    conf,
                    self.services[si].added_start(new.address),
                    now,
                    self.persistence.passive_kept(),
                );
                server.configured = None;
                self.services[si].servers.insert(new.address, server);
                added_or_removed = Some(new.address);
                self.record_names(service, address, "-", "added", "admin");
                self.refresh_macs_after_add(new.address.ip()).await;
            }
            AdminChange::NodeDrain(_) => {
                return Err(AdminError::Invalid(
                    "node drain is not a server change".into(),
                ));
            }
            AdminChange::Remove => {
                self.services[si]
                    .servers
                    .remove(&addr)
                    .ok_or_else(no_server)?;
                self.persistence
                    .admin_state_mut()
                    .record_remove(service, addr);
                added_or_removed = Some(addr);
                self.record_names(
                    service,
                    address,
                    "-",
                    "removed",
                    "admin (established flows kept until idle)",
                );
            }
        }
        // Only an added or removed address can start or stop departing (a patch moves none).
        if let Some(addr) = added_or_removed {
            self.sync_departing_server(si, addr, now);
        }
        // An added server may have brought MACs that other services' servers share.
        let published = if matches!(change_kind, ChangeKind::Add) {
            self.recompute(now, started)
        } else {
            // An operator's change is tried now, also on a service waiting for a retry.
            self.publishing
                .retry_mut()
                .release(&self.services[si].cfg.name);
            self.services[si].mark();
            self.recompute_marked(now, started)
        };
        published.map_err(|e| AdminError::Invalid(format!("publishing failed: {e}")))
    }
}

/// Which kind of admin change (decides how much is recomputed).
enum ChangeKind {
    Add,
    Other,
}
