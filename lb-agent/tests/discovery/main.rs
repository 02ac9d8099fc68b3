//! lb-agent's discovery tests in one binary: `resolve = true` servers against a real
//! DNS server on 127.0.0.1 (`util`): SRV and A/AAAA expansion, re-resolution, and the
//! whole agent over it.

mod agent;
mod refresh;
mod srv;
mod util;
