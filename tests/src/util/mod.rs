//! What every other group builds on: short setup commands, child processes in a
//! namespace, the JSON reader for the agent's answers, and the Ctrl-C flag the harness's
//! waits check.

pub mod cmd;
pub mod interrupt;
pub mod json;
pub mod process;
