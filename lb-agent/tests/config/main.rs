//! lb-agent's config tests in one binary: files that load, and files that are rejected
//! with file, line and key path (`util`: parse, find a marker's line, assert the
//! error). `config_probe_test_keys` runs alone: it sets an environment variable.

mod agent_keys;
mod announce_keys;
mod errors;
mod max_backends;
mod max_flows;
mod parse;
mod probe_errors;
mod probe_tcp_check;
mod util;
