//! lb-agent's documentation tests in one binary: the citations resolve, the examples
//! load, docs/configuration.md agrees with the parser, and `check-config`'s text
//! matches its golden files.

mod check_config_golden;
mod citations;
mod config_keys_documented;
mod examples;
