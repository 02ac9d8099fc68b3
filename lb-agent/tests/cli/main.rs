//! lb-agent's CLI tests in one binary: the client commands against a real API, the log
//! format of `lb-agent run`, and `lb-agent import` on keepalived's samples and the
//! nginx and Angie documentation's examples.

mod client;
mod import;
mod log_format;
