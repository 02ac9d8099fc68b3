//! Why a file could not be converted: where (the line) and what.

/// A file `lb-agent import` cannot read or convert.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The file does not parse as its format: an unbalanced brace, an unclosed quote, a
    /// directive without its terminator.
    #[error("line {line}: {what}")]
    Syntax { line: usize, what: String },
    /// A directive lb needs to understand has a value it cannot read.
    #[error("line {line}: {directive}: {what}")]
    Value {
        line: usize,
        directive: String,
        what: String,
    },
}
