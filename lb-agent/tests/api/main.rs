//! lb-agent's API tests in one binary: the listeners on real sockets (`util`), who may
//! do what on which, the API's limits, the status page. `api_fd_limit` runs alone: it
//! lowers the process's file limit.

mod access;
mod limits;
mod page;
mod util;
