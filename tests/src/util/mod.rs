//! What every other group builds on: the library's error, short setup commands, child
//! processes in a namespace, temporary directories, the JSON reader for the agent's
//! answers, and the Ctrl-C flag the harness's waits check.

pub mod cmd;
pub mod error;
pub mod interrupt;
pub mod json;
pub mod process;
pub mod temp_dir;
