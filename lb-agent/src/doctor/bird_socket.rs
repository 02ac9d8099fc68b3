//! BIRD's control socket, when VIP announcement is configured (docs/multi-node.md).

use std::time::Duration;

use tokio::{io::AsyncReadExt, net::UnixStream};

use crate::config::Config;

use super::Finding;

/// How long BIRD may take to greet.
const GREETING: Duration = Duration::from_secs(2);

pub async fn check(cfg: &Config) -> Vec<Finding> {
    let check = "bird";
    if cfg.agent.announce_interface.is_none() {
        return Vec::new();
    }
    let Some(socket) = &cfg.agent.bird_socket else {
        return vec![Finding::warning(
            check,
            "announce_interface is set but bird_socket is not: doctor cannot tell whether BIRD \
             runs, and status shows no BGP sessions; set bird_socket (e.g. /run/bird/bird.ctl)",
        )];
    };
    let shown = socket.display();
    let mut stream = match UnixStream::connect(socket).await {
        Ok(s) => s,
        Err(err) => {
            return vec![Finding::blocker(
                check,
                format!(
                    "cannot connect to BIRD's socket {shown} ({err}): the VIPs would never be \
                     announced; start BIRD (`systemctl start bird`) with \
                     contrib/bird/lb-node.conf, or fix bird_socket"
                ),
            )];
        }
    };
    let mut buf = [0u8; 128];
    match tokio::time::timeout(GREETING, stream.read(&mut buf)).await {
        Ok(Ok(n)) if buf[..n].starts_with(b"0001 ") => {
            let hello = String::from_utf8_lossy(&buf[5..n]).trim().to_string();
            vec![Finding::ok(check, format!("{shown}: {hello}"))]
        }
        Ok(Ok(n)) => vec![Finding::warning(
            check,
            format!(
                "{shown} answered something other than BIRD's greeting: {:?}",
                String::from_utf8_lossy(&buf[..n])
            ),
        )],
        Ok(Err(err)) => vec![Finding::blocker(
            check,
            format!("reading BIRD's greeting on {shown}: {err}"),
        )],
        Err(_) => vec![Finding::blocker(
            check,
            format!("BIRD did not greet on {shown} within 2 s (is it hung?)"),
        )],
    }
}
