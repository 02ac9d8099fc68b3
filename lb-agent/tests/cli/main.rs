//! lb-agent's CLI tests in one binary: the client commands against a real API, the log
//! format of `lb-agent run`, and printing into a closed pipe.

mod broken_pipe;
mod client;
mod log_format;
