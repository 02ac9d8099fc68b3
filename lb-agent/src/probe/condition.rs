//! A probe's `test` condition, after Angie's `test=`: variables of the response, compared
//! or matched, combined with `!`, `&&`, `||` and parentheses (docs/probes.md).
//!
//! ```text
//! expr    = and { "||" and }
//! and     = unary { "&&" unary }
//! unary   = "!" unary | "(" expr ")" | operand
//! operand = VAR [ ( "==" | "=" | "!=" ) VALUE | ( "~" | "~*" | "!~" | "!~*" ) VALUE ]
//! VAR     = $upstream_status | $upstream_http_<name> | $upstream_probe_response
//! VALUE   = "quoted string" (escapes \" and \\) | bare word (up to a space, ( ) " & |)
//! ```
//!
//! A bare variable holds when its value is neither empty nor `0` (Angie's rule for
//! `test=$var`). `~` matches a regular expression (`~*` ignoring case), `!~`/`!~*` holds
//! when it does not match. A header that is absent is empty; one sent several times is
//! its values joined by `, `.

use std::borrow::Cow;
use std::fmt;

use regex::bytes::{Regex, RegexBuilder};

use lex::{Spanned, Tok, lex};

mod lex;

/// Which variables a probe type provides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// http: status, response headers and body.
    Http,
    /// tcp and udp: the reply.
    Stream,
}

/// A parsed `test` condition. Two conditions are equal when their text is.
#[derive(Debug, Clone)]
pub struct Condition {
    source: String,
    expr: Expr,
}

impl PartialEq for Condition {
    fn eq(&self, o: &Self) -> bool {
        self.source == o.source
    }
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

/// What the condition is evaluated against.
#[derive(Debug, Clone, Copy, Default)]
pub struct Response<'a> {
    /// The http status; `None` for tcp/udp.
    pub status: Option<u16>,
    /// Response headers, names in lower case, in arrival order.
    pub headers: &'a [(String, Vec<u8>)],
    /// The body (http) or the reply (tcp/udp), as far as it was read.
    pub body: &'a [u8],
}

/// Why a condition does not parse: the column (1-based, in characters) and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("at column {column}: {message}")]
pub struct ConditionError {
    pub column: usize,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Var {
    Status,
    /// Lower case, `-` between words.
    Header(String),
    Response,
}

#[derive(Debug, Clone)]
enum Expr {
    Any(Vec<Expr>),
    All(Vec<Expr>),
    Not(Box<Expr>),
    Set(Var),
    Equals(Var, Vec<u8>),
    Matches(Var, Regex),
}

impl Condition {
    /// Parses `source` for a probe of `scope`.
    pub fn parse(source: &str, scope: Scope) -> Result<Self, ConditionError> {
        let tokens = lex(source)?;
        let mut p = Parser {
            tokens,
            pos: 0,
            scope,
            end: source.chars().count() + 1,
        };
        let expr = p.expr()?;
        if let Some(t) = p.tokens.get(p.pos) {
            return Err(t.error(format!("expected `&&`, `||` or the end, found {}", t.tok)));
        }
        Ok(Condition {
            source: source.to_string(),
            expr,
        })
    }

    /// Whether `response` meets the condition.
    pub fn holds(&self, response: &Response<'_>) -> bool {
        self.expr.holds(response)
    }

    /// Whether the condition looks at the body or reply (`$upstream_probe_response`).
    pub fn reads_response(&self) -> bool {
        self.expr.reads_response()
    }
}

impl Expr {
    fn reads_response(&self) -> bool {
        match self {
            Expr::Any(all) | Expr::All(all) => all.iter().any(Expr::reads_response),
            Expr::Not(e) => e.reads_response(),
            Expr::Set(v) | Expr::Equals(v, _) | Expr::Matches(v, _) => *v == Var::Response,
        }
    }

    fn holds(&self, r: &Response<'_>) -> bool {
        match self {
            Expr::Any(all) => all.iter().any(|e| e.holds(r)),
            Expr::All(all) => all.iter().all(|e| e.holds(r)),
            Expr::Not(e) => !e.holds(r),
            Expr::Set(v) => {
                let v = value(v, r);
                !v.is_empty() && *v != b"0"[..]
            }
            Expr::Equals(v, want) => *value(v, r) == want[..],
            Expr::Matches(v, re) => re.is_match(&value(v, r)),
        }
    }
}

fn value<'a>(var: &Var, r: &Response<'a>) -> Cow<'a, [u8]> {
    match var {
        Var::Status => Cow::Owned(r.status.map(|s| s.to_string()).unwrap_or_default().into()),
        Var::Response => Cow::Borrowed(r.body),
        Var::Header(name) => {
            let mut found = r.headers.iter().filter(|(n, _)| n == name);
            let Some((_, first)) = found.next() else {
                return Cow::Borrowed(&[]);
            };
            let mut joined: Option<Vec<u8>> = None;
            for (_, more) in found {
                let j = joined.get_or_insert_with(|| first.clone());
                j.extend_from_slice(b", ");
                j.extend_from_slice(more);
            }
            match joined {
                Some(j) => Cow::Owned(j),
                None => Cow::Borrowed(first),
            }
        }
    }
}

struct Parser {
    tokens: Vec<Spanned>,
    pos: usize,
    scope: Scope,
    /// The column just past the end, for "expected … at the end".
    end: usize,
}

impl Parser {
    fn peek_op(&self, op: &str) -> bool {
        matches!(self.tokens.get(self.pos), Some(Spanned { tok: Tok::Op(o), .. }) if *o == op)
    }

    fn next(&mut self, wanted: &str) -> Result<&Spanned, ConditionError> {
        let end = self.end;
        let t = self.tokens.get(self.pos).ok_or_else(|| ConditionError {
            column: end,
            message: format!("expected {wanted}, found the end"),
        })?;
        self.pos += 1;
        Ok(t)
    }

    fn expr(&mut self) -> Result<Expr, ConditionError> {
        let mut any = vec![self.and()?];
        while self.peek_op("||") {
            self.pos += 1;
            any.push(self.and()?);
        }
        Ok(if any.len() == 1 {
            any.pop().expect("one")
        } else {
            Expr::Any(any)
        })
    }

    fn and(&mut self) -> Result<Expr, ConditionError> {
        let mut all = vec![self.unary()?];
        while self.peek_op("&&") {
            self.pos += 1;
            all.push(self.unary()?);
        }
        Ok(if all.len() == 1 {
            all.pop().expect("one")
        } else {
            Expr::All(all)
        })
    }

    fn unary(&mut self) -> Result<Expr, ConditionError> {
        let scope = self.scope;
        let t = self.next("a variable such as $upstream_status, `!` or `(`")?;
        let (column, tok) = (t.column, t.tok.clone());
        match tok {
            Tok::Op("!") => Ok(Expr::Not(Box::new(self.unary()?))),
            Tok::Op("(") => {
                let e = self.expr()?;
                let close = self.next("`)`")?;
                if close.tok != Tok::Op(")") {
                    return Err(close.error(format!("expected `)`, found {}", close.tok)));
                }
                Ok(e)
            }
            Tok::Var(name) => {
                let var =
                    variable(&name, scope).map_err(|message| ConditionError { column, message })?;
                self.operand(var)
            }
            other => Err(ConditionError {
                column,
                message: format!(
                    "expected a variable such as $upstream_status, `!` or `(`, found {other}"
                ),
            }),
        }
    }

    fn operand(&mut self, var: Var) -> Result<Expr, ConditionError> {
        let Some(Spanned {
            tok: Tok::Op(op), ..
        }) = self.tokens.get(self.pos)
        else {
            return Ok(Expr::Set(var));
        };
        let op = *op;
        if !matches!(op, "==" | "=" | "!=" | "~" | "~*" | "!~" | "!~*") {
            return Ok(Expr::Set(var));
        }
        self.pos += 1;
        let t = self.next("a value after the operator")?;
        let Tok::Value(text) = &t.tok else {
            return Err(t.error(format!(
                "expected a value (a quoted string or a word) after `{op}`, found {}",
                t.tok
            )));
        };
        let column = t.column;
        if var == Var::Status
            && matches!(op, "==" | "=" | "!=")
            && !(text.len() == 3 && text.bytes().all(|b| b.is_ascii_digit()))
        {
            let never = if op == "!=" {
                "always holds"
            } else {
                "never holds"
            };
            let class = text
                .chars()
                .next()
                .filter(char::is_ascii_digit)
                .map_or_else(|| "^2".to_string(), |d| format!("^{d}"));
            return Err(ConditionError {
                column,
                message: format!(
                    "$upstream_status is a three-digit code such as 200: `{op} {text}` {never}; \
                     for a class of codes match it, e.g. $upstream_status {}~ {class}",
                    if op == "!=" { "!" } else { "" }
                ),
            });
        }
        let expr = match op {
            "==" | "=" | "!=" => Expr::Equals(var, text.clone().into_bytes()),
            _ => {
                let re = RegexBuilder::new(text)
                    .case_insensitive(op.ends_with('*'))
                    .build()
                    .map_err(|e| ConditionError {
                        column,
                        message: format!(
                            "{text:?} is not a valid regular expression: {}",
                            regex_verdict(&e)
                        ),
                    })?;
                if var == Var::Status
                    && !(100..=599).any(|c: u16| re.is_match(c.to_string().as_bytes()))
                {
                    return Err(ConditionError {
                        column,
                        message: format!(
                            "{text:?} matches no status code (100 to 599: three digits): `{op} \
                             {text}` {}; for a class of codes match its first digit, e.g. \
                             $upstream_status {}~ ^2",
                            if op.starts_with('!') {
                                "always holds"
                            } else {
                                "never holds"
                            },
                            if op.starts_with('!') { "!" } else { "" }
                        ),
                    });
                }
                Expr::Matches(var, re)
            }
        };
        Ok(if op.starts_with('!') {
            Expr::Not(Box::new(expr))
        } else {
            expr
        })
    }
}

/// The regex crate's one-line verdict (its message draws a caret diagram over lines).
fn regex_verdict(e: &regex::Error) -> String {
    let text = e.to_string();
    text.lines()
        .find_map(|l| l.strip_prefix("error: "))
        .unwrap_or(&text)
        .trim()
        .to_string()
}

fn variable(name: &str, scope: Scope) -> Result<Var, String> {
    let known = match scope {
        Scope::Http => "$upstream_status, $upstream_http_<header>, $upstream_probe_response",
        Scope::Stream => "$upstream_probe_response",
    };
    match (name, scope) {
        ("upstream_probe_response", _) => Ok(Var::Response),
        ("upstream_status", Scope::Http) => Ok(Var::Status),
        (n, Scope::Http) if n.starts_with("upstream_http_") => {
            let header = &n["upstream_http_".len()..];
            if header.is_empty() {
                return Err(
                    "$upstream_http_ needs a header name, e.g. $upstream_http_content_type".into(),
                );
            }
            Ok(Var::Header(header.to_ascii_lowercase().replace('_', "-")))
        }
        ("upstream_status", Scope::Stream) => Err(format!(
            "${name} is an http variable; tcp and udp probes have {known}"
        )),
        (n, Scope::Stream) if n.starts_with("upstream_http_") => Err(format!(
            "${name} is an http variable; tcp and udp probes have {known}"
        )),
        _ => Err(format!(
            "unknown variable ${name}; this probe type has {known}"
        )),
    }
}

#[cfg(test)]
mod tests;
