//! Splits a `test` condition into tokens: variables, values, operators, each with the
//! column it starts at.

use std::fmt;

use super::ConditionError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Tok {
    Var(String),
    Value(String),
    Op(&'static str),
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Var(v) => write!(f, "`${v}`"),
            Tok::Value(v) => write!(f, "{v:?}"),
            Tok::Op(o) => write!(f, "`{o}`"),
        }
    }
}

pub(super) struct Spanned {
    pub(super) tok: Tok,
    pub(super) column: usize,
}

impl Spanned {
    pub(super) fn error(&self, message: String) -> ConditionError {
        ConditionError {
            column: self.column,
            message,
        }
    }
}

/// Longest first, so that `!~*` is not read as `!` `~*`.
const OPS: &[&str] = &[
    "!~*", "&&", "||", "==", "!=", "!~", "~*", "!", "~", "=", "(", ")",
];

/// A bare word runs to a space, a parenthesis, a quote, `&` or `|`.
fn word_char(c: char) -> bool {
    !c.is_whitespace() && !matches!(c, '(' | ')' | '"' | '&' | '|')
}

/// The value around the `|` at `bar` as it should be written, quoted: alternatives of
/// plain words (`200|204`) anchored as a whole (`"^(200|204)$"`), anything else (`^(2|3)..$`)
/// as written, so that the hint matches what was meant.
fn quoted_alternatives(chars: &[char], bar: usize) -> String {
    let start = chars[..bar]
        .iter()
        .rposition(|c| c.is_whitespace() || matches!(c, '~' | '*' | '"'))
        .map_or(0, |p| p + 1);
    let end = chars[bar..]
        .iter()
        .position(|c| c.is_whitespace() || *c == '"')
        .map_or(chars.len(), |p| bar + p);
    let mut raw: String = chars[start..end].iter().collect();
    // A `)` closing the condition's own group is not part of the value.
    while raw.ends_with(')') && raw.matches(')').count() > raw.matches('(').count() {
        raw.pop();
    }
    if raw.chars().all(|c| word_char(c) || c == '|') {
        format!("\"^({raw})$\"")
    } else {
        format!("{raw:?}")
    }
}

/// A bare word cannot start like a variable or an operator.
fn word_start(c: char) -> bool {
    word_char(c) && !matches!(c, '$' | '!' | '~' | '=')
}

pub(super) fn lex(s: &str) -> Result<Vec<Spanned>, ConditionError> {
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let column = i + 1;
        let err = |message: String| ConditionError { column, message };
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        if c == '$' {
            let start = i + 1;
            i = start;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            if i == start {
                return Err(err("`$` must start a variable name".into()));
            }
            let name: String = chars[start..i].iter().collect();
            if chars.get(i) == Some(&'-') && name.starts_with("upstream_http_") {
                // `$upstream_http_X-Foo`: Angie's header variables are lower case with `_`.
                let mut end = i;
                while end < chars.len()
                    && (chars[end].is_ascii_alphanumeric() || matches!(chars[end], '_' | '-'))
                {
                    end += 1;
                }
                let written: String = chars[start..end].iter().collect();
                return Err(err(format!(
                    "`${written}`: a header variable writes `-` as `_` (and any case as lower \
                     case): write ${}",
                    written.to_ascii_lowercase().replace('-', "_")
                )));
            }
            out.push(Spanned {
                tok: Tok::Var(name),
                column,
            });
            continue;
        }
        if c == '"' {
            let mut text = String::new();
            i += 1;
            loop {
                match chars.get(i) {
                    None => return Err(err("the quoted string is not closed".into())),
                    Some('"') => break,
                    Some('\\') => {
                        match chars.get(i + 1) {
                            Some(e @ ('"' | '\\')) => text.push(*e),
                            _ => {
                                return Err(ConditionError {
                                    column: i + 1,
                                    message: "in a quoted string only \\\" and \\\\ are escapes (a regex escape such as \\d needs \\\\d)".into(),
                                });
                            }
                        }
                        i += 2;
                    }
                    Some(&c) => {
                        text.push(c);
                        i += 1;
                    }
                }
            }
            i += 1;
            out.push(Spanned {
                tok: Tok::Value(text),
                column,
            });
            continue;
        }
        if let Some(op) = OPS.iter().find(|op| {
            op.chars()
                .enumerate()
                .all(|(k, o)| chars.get(i + k) == Some(&o))
        }) {
            i += op.chars().count();
            out.push(Spanned {
                tok: Tok::Op(op),
                column,
            });
            continue;
        }
        if word_start(c) {
            let start = i;
            while i < chars.len() && word_char(chars[i]) {
                i += 1;
            }
            out.push(Spanned {
                tok: Tok::Value(chars[start..i].iter().collect()),
                column,
            });
            continue;
        }
        return Err(err(match c {
            '&' => "a single `&`: write `&&` for \"both\"".to_string(),
            '|' if matches!(
                out.last(),
                Some(Spanned {
                    tok: Tok::Value(_),
                    ..
                })
            ) =>
            {
                let prev = match out.last() {
                    Some(Spanned {
                        tok: Tok::Value(v), ..
                    }) => v.clone(),
                    _ => String::new(),
                };
                format!(
                    "a single `|` ends the bare value {prev:?}: quote a value with `|` in it, e.g. \
                     ~ {} (a regular expression), or write `||` for \"either\"",
                    quoted_alternatives(&chars, i)
                )
            }
            '|' => "a single `|`: write `||` for \"either\"".to_string(),
            _ => format!("unexpected {c:?}"),
        }));
    }
    Ok(out)
}
