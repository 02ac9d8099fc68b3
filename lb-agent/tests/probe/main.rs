//! lb-agent's probe tests in one binary: the probes against servers on 127.0.0.1
//! started by each test, and the probe scheduler under paused time.
//! `probe_local_emfile` runs alone: it lowers the process's file limit.

mod http;
mod icmp;
mod late_agent;
mod schedule;
mod tcp_udp;
mod test_condition;
