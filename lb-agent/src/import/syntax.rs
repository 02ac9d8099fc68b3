//! The block syntax keepalived and nginx/Angie share: directives of words, `{ … }`
//! blocks, comments and quoted words, read into a tree that keeps each directive's line.
//!
//! keepalived ends a directive at the end of its line and starts comments with `!` or
//! `#`; nginx ends one with `;` and starts comments with `#`.

use super::ImportError;

/// One directive: its name, its arguments and, for a block, what it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Directive {
    pub name: String,
    pub args: Vec<String>,
    pub line: usize,
    pub block: Option<Vec<Directive>>,
}

impl Directive {
    /// The directive as written (name and arguments), for notes.
    pub fn text(&self) -> String {
        std::iter::once(self.name.as_str())
            .chain(self.args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// What the block holds (nothing for a plain directive).
    pub fn children(&self) -> &[Directive] {
        self.block.as_deref().unwrap_or(&[])
    }
}

/// Which of the two dialects a file is written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// Lines end directives; `!` and `#` start comments.
    Keepalived,
    /// `;` ends directives; `#` starts comments.
    Nginx,
}

#[derive(Debug, PartialEq, Eq)]
enum Token {
    Word(String),
    Open,
    Close,
    End,
}

/// Reads `text` into its top-level directives.
pub fn parse(text: &str, dialect: Dialect) -> Result<Vec<Directive>, ImportError> {
    let tokens = tokenize(text, dialect)?;
    let mut stack: Vec<(Directive, Vec<Directive>)> = Vec::new();
    let mut top: Vec<Directive> = Vec::new();
    let mut words: Vec<String> = Vec::new();
    let mut first_line = 0;
    for (token, line) in tokens {
        let level = stack.last_mut().map_or(&mut top, |(_, children)| children);
        match token {
            Token::Word(w) => {
                if words.is_empty() {
                    first_line = line;
                }
                words.push(w);
            }
            Token::End => {
                if let Some(d) = directive(&mut words, first_line) {
                    level.push(d);
                } else if dialect == Dialect::Nginx {
                    return Err(syntax(line, "';' without a directive"));
                }
            }
            Token::Open => {
                let opened = match directive(&mut words, first_line) {
                    Some(d) => d,
                    // keepalived allows the brace on the line after the directive.
                    None if dialect == Dialect::Keepalived
                        && level.last().is_some_and(|d| d.block.is_none()) =>
                    {
                        level.pop().expect("checked above")
                    }
                    None => return Err(syntax(line, "'{' without a directive")),
                };
                stack.push((opened, Vec::new()));
            }
            Token::Close => {
                if !words.is_empty() {
                    if dialect == Dialect::Nginx {
                        return Err(syntax(line, "expected ';' before '}'"));
                    }
                    let d = directive(&mut words, first_line).expect("words are not empty");
                    level.push(d);
                }
                let Some((mut opened, children)) = stack.pop() else {
                    return Err(syntax(line, "'}' without an open block"));
                };
                opened.block = Some(children);
                stack
                    .last_mut()
                    .map_or(&mut top, |(_, children)| children)
                    .push(opened);
            }
        }
    }
    if !words.is_empty() {
        if dialect == Dialect::Nginx {
            return Err(syntax(first_line, "expected ';' at the end of the file"));
        }
        let d = directive(&mut words, first_line).expect("words are not empty");
        stack
            .last_mut()
            .map_or(&mut top, |(_, children)| children)
            .push(d);
    }
    if let Some((open, _)) = stack.last() {
        return Err(syntax(
            open.line,
            &format!("the block of '{}' is not closed", open.name),
        ));
    }
    Ok(top)
}

fn directive(words: &mut Vec<String>, line: usize) -> Option<Directive> {
    if words.is_empty() {
        return None;
    }
    let mut all = std::mem::take(words).into_iter();
    Some(Directive {
        name: all.next().expect("not empty"),
        args: all.collect(),
        line,
        block: None,
    })
}

fn syntax(line: usize, what: &str) -> ImportError {
    ImportError::Syntax {
        line,
        what: what.to_owned(),
    }
}

/// Words, braces and terminators with their lines (1-based).
fn tokenize(text: &str, dialect: Dialect) -> Result<Vec<(Token, usize)>, ImportError> {
    let is_comment = |c: char| c == '#' || (dialect == Dialect::Keepalived && c == '!');
    let mut tokens = Vec::new();
    let mut chars = text.chars().peekable();
    let mut line = 1;
    while let Some(c) = chars.next() {
        match c {
            '\n' => {
                if dialect == Dialect::Keepalived {
                    tokens.push((Token::End, line));
                }
                line += 1;
            }
            c if c.is_whitespace() => {}
            c if is_comment(c) => {
                while chars.peek().is_some_and(|&n| n != '\n') {
                    chars.next();
                }
            }
            '{' => tokens.push((Token::Open, line)),
            '}' => tokens.push((Token::Close, line)),
            ';' if dialect == Dialect::Nginx => tokens.push((Token::End, line)),
            '"' | '\'' => {
                let start = line;
                let mut word = String::new();
                loop {
                    match chars.next() {
                        None => return Err(syntax(start, "a quoted word is not closed")),
                        Some(q) if q == c => break,
                        Some('\\') if dialect == Dialect::Nginx => match chars.next() {
                            Some(e @ ('"' | '\'' | '\\')) => word.push(e),
                            Some('n') => word.push('\n'),
                            Some('r') => word.push('\r'),
                            Some('t') => word.push('\t'),
                            Some(other) => {
                                word.push('\\');
                                word.push(other);
                            }
                            None => return Err(syntax(start, "a quoted word is not closed")),
                        },
                        Some(ch) => {
                            if ch == '\n' {
                                line += 1;
                            }
                            word.push(ch);
                        }
                    }
                }
                tokens.push((Token::Word(word), start));
            }
            c => {
                let mut word = String::from(c);
                while let Some(&n) = chars.peek() {
                    let ends = n.is_whitespace()
                        || n == '{'
                        || n == '}'
                        || (n == ';' && dialect == Dialect::Nginx);
                    if ends {
                        break;
                    }
                    word.push(n);
                    chars.next();
                }
                tokens.push((Token::Word(word), line));
            }
        }
    }
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keepalived_blocks_lines_and_comments() {
        let text = "! a comment\nvirtual_server 10.0.0.1 80\n{\n  delay_loop 6 # six\n  real_server 10.0.1.1 80 {\n    weight 2\n  }\n}\n";
        let tree = parse(text, Dialect::Keepalived).unwrap();
        assert_eq!(tree.len(), 1);
        let vs = &tree[0];
        assert_eq!((vs.name.as_str(), vs.line), ("virtual_server", 2));
        assert_eq!(vs.args, ["10.0.0.1", "80"]);
        let children = vs.children();
        assert_eq!(children[0].text(), "delay_loop 6");
        assert_eq!(
            (children[1].name.as_str(), children[1].line),
            ("real_server", 5)
        );
        assert_eq!(children[1].children()[0].text(), "weight 2");
    }

    #[test]
    fn nginx_statements_quotes_and_errors() {
        let text = "upstream u {\n  server a:80 weight=2;\n  upstream_probe p \"send=data:x\\r\\n\" uri=/;\n}\n";
        let tree = parse(text, Dialect::Nginx).unwrap();
        let servers = tree[0].children();
        assert_eq!(servers[0].args, ["a:80", "weight=2"]);
        assert_eq!(servers[1].args, ["p", "send=data:x\r\n", "uri=/"]);
        assert_eq!(servers[1].line, 3);

        let err = parse("upstream u {\n  server a:80\n}\n", Dialect::Nginx).unwrap_err();
        assert_eq!(err.to_string(), "line 3: expected ';' before '}'");
        let err = parse("upstream u {\n  server a:80;\n", Dialect::Nginx).unwrap_err();
        assert_eq!(
            err.to_string(),
            "line 1: the block of 'upstream' is not closed"
        );
        let err = parse("a {\n}\n}\n", Dialect::Keepalived).unwrap_err();
        assert_eq!(err.to_string(), "line 3: '}' without an open block");
    }
}
