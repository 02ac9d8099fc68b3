//! lb-agent's CLI tests in one binary: the client commands against a real API, and the
//! log format of `lb-agent run`.

mod client;
mod log_format;
