//! lb-agent's CLI tests in one binary: the client commands against a real API, the log
//! format of `lb-agent run`, printing into a closed pipe, and `lb-agent import` on
//! keepalived's samples and the nginx and Angie documentation's examples.

mod broken_pipe;
mod client;
mod import;
mod log_format;
