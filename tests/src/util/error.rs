//! The library's error: what failed (a command, an I/O call, a BPF operation, a wait)
//! and on what. Only [`crate::agent::api::ApiError`] and
//! [`crate::agent::unit_file::UnitError`] are types of their own, because callers match
//! on their variants.

use std::{io, time::Duration};

use crate::{agent::api::ApiError, util::json::JsonError};

/// Why a step of the harness failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A command could not be started, fed or waited for.
    #[error("could not run `{cmd}`")]
    Spawn {
        cmd: String,
        #[source]
        source: io::Error,
    },
    /// A command ran and failed; `output` is what it said about it.
    #[error("`{cmd}` failed ({status}): {output}")]
    Command {
        cmd: String,
        status: String,
        output: String,
    },
    /// An I/O call failed (a file, a socket, a syscall); `what` names the call and its
    /// object.
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    /// Loading, attaching or reading a BPF object, program or map failed.
    #[error("{what}")]
    Bpf {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The agent's data-plane code, which the harness uses to find and read lb's maps,
    /// failed.
    #[error(transparent)]
    Dataplane(#[from] lb_agent::dataplane::DataplaneError),
    /// A wait ran out before what it waited for happened.
    #[error("waited {waited:?} for {what}; last seen:\n{last}")]
    Timeout {
        what: String,
        waited: Duration,
        last: String,
    },
    /// Ctrl-C or SIGTERM came during a wait.
    #[error("interrupted while waiting for {what}")]
    Interrupted { what: String },
    /// The host, an argument or a reading is not what the harness needs.
    #[error("{0}")]
    Unexpected(String),
    /// A JSON document (an answer of the agent, a DevTools message) is not valid JSON.
    #[error("{what}: {source}")]
    Json {
        what: String,
        #[source]
        source: JsonError,
    },
    /// The agent's API answered with an error, or with an answer that is not what was
    /// asked for.
    #[error(transparent)]
    Api(Box<ApiError>),
    /// A step failed inside a larger one, which `what` names.
    #[error("{what}: {source}")]
    Context {
        what: String,
        #[source]
        source: Box<Error>,
    },
}

impl Error {
    /// For `map_err`: an I/O error of the call `what` names (`what` is built before the
    /// call; where the call repeats, build the error in a closure instead).
    pub fn io(what: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }

    /// For `map_err`: a BPF loader's error of the operation `what` names.
    pub fn bpf<E>(what: impl Into<String>) -> impl FnOnce(E) -> Error
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        let what = what.into();
        move |source| Error::Bpf {
            what,
            source: Box::new(source),
        }
    }

    /// This error as a step of the larger one `what` names.
    pub fn context(self, what: impl Into<String>) -> Error {
        Error::Context {
            what: what.into(),
            source: Box::new(self),
        }
    }
}

impl From<ApiError> for Error {
    fn from(error: ApiError) -> Self {
        match error {
            ApiError::Harness(inner) => inner,
            answer => Error::Api(Box::new(answer)),
        }
    }
}
