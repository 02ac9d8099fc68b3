//! `lb-agent status`: services and servers as a table (or JSON), read from the API.

use std::process::ExitCode;

use hyper::Method;
use lb_agent::status::ServiceStatus;

use super::http;

pub async fn status(api: &http::Target, json: bool) -> anyhow::Result<ExitCode> {
    let body = http::request_ok(api, Method::GET, "/api/v1/services", None).await?;
    if json {
        println!("{body}");
        return Ok(ExitCode::SUCCESS);
    }
    let services: Vec<ServiceStatus> = serde_json::from_str(&body)?;
    print!("{}", render(&services));
    Ok(ExitCode::SUCCESS)
}

/// The human table.
pub fn render(services: &[ServiceStatus]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    for s in services {
        let _ = writeln!(
            out,
            "service {} {} {}/{}  weight {}/{}  spares running {}  backup level {}{}",
            s.name,
            s.vip,
            s.protocol,
            s.forwarding,
            s.active_weight,
            s.main_weight,
            s.spare_num,
            s.active_backup_level,
            if s.fail_open { "  FAIL-OPEN" } else { "" }
        );
        let _ = writeln!(
            out,
            "  {:<24} {:>6} {:<12} {:<8} {:>6} {:>6} {:>10} {:>8}  note",
            "server", "weight", "state", "spare", "backup", "active", "packets", "flows"
        );
        for srv in &s.servers {
            let mut notes = srv.differs_from_config.clone();
            if srv.mac.is_none() {
                notes.push("MAC unknown".into());
            }
            let _ = writeln!(
                out,
                "  {:<24} {:>6} {:<12} {:<8} {:>6} {:>6} {:>10} {:>8}  {}",
                srv.address,
                srv.weight,
                srv.state,
                srv.spare.as_deref().unwrap_or("-"),
                srv.backup,
                if srv.active { "yes" } else { "no" },
                srv.stats.packets,
                srv.stats.flows,
                notes.join(", ")
            );
        }
    }
    out
}
