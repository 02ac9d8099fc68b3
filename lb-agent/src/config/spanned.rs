//! A span-aware view of a parsed TOML document: typed getters whose errors carry the
//! file, the 1-based line and the key path (`service[0].server[1].weight`).

use std::ops::Range;
use std::path::Path;

use toml_edit::{Item, TableLike, Value};

use super::ConfigError;
use super::values;

/// The file name and text the spans point into.
pub(crate) struct Source<'s> {
    file: &'s Path,
    /// Byte offset of the start of every line.
    line_starts: Vec<usize>,
}

impl<'s> Source<'s> {
    pub(crate) fn new(file: &'s Path, text: &str) -> Self {
        let line_starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        Source { file, line_starts }
    }

    /// 1-based line of a byte span's start.
    pub(crate) fn line_of(&self, span: Option<Range<usize>>) -> Option<usize> {
        let start = span?.start;
        Some(self.line_starts.partition_point(|&s| s <= start))
    }

    pub(crate) fn error(
        &self,
        line: Option<usize>,
        key: Option<String>,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError {
            file: self.file.to_path_buf(),
            line,
            key,
            message: message.into(),
            io_kind: None,
        }
    }
}

/// A table (`[x]`, `[[x]]` entry or inline `{ .. }`) with its key path and header line.
#[derive(Clone)]
pub(crate) struct Table<'a> {
    src: &'a Source<'a>,
    inner: &'a dyn TableLike,
    pub(crate) path: String,
    pub(crate) line: Option<usize>,
}

/// One value (or sub-table) found under a key, with its key path and line.
#[derive(Clone)]
pub(crate) struct Field<'a> {
    src: &'a Source<'a>,
    node: Node<'a>,
    pub(crate) path: String,
    pub(crate) line: Option<usize>,
}

#[derive(Clone, Copy)]
enum Node<'a> {
    Item(&'a Item),
    Value(&'a Value),
}

impl<'a> Node<'a> {
    fn value(self) -> Option<&'a Value> {
        match self {
            Node::Item(i) => i.as_value(),
            Node::Value(v) => Some(v),
        }
    }

    fn table_like(self) -> Option<&'a dyn TableLike> {
        match self {
            Node::Item(i) => i.as_table_like(),
            Node::Value(v) => v.as_inline_table().map(|t| t as &dyn TableLike),
        }
    }

    /// "a string", "an integer", ... for "must be X (got Y)" messages.
    fn describe(self) -> &'static str {
        match self {
            Node::Item(Item::Table(_)) => "a table",
            Node::Item(Item::ArrayOfTables(_)) => "an array of tables",
            Node::Item(Item::None) => "nothing",
            Node::Item(Item::Value(v)) | Node::Value(v) => match v {
                Value::String(_) => "a string",
                Value::Integer(_) => "an integer",
                Value::Float(_) => "a float",
                Value::Boolean(_) => "a boolean",
                Value::Datetime(_) => "a date-time",
                Value::Array(_) => "an array",
                Value::InlineTable(_) => "a table",
            },
        }
    }
}

impl<'a> Table<'a> {
    /// The document root.
    pub(crate) fn root(src: &'a Source<'a>, root: &'a toml_edit::Table) -> Self {
        Table {
            src,
            inner: root,
            path: String::new(),
            line: None,
        }
    }

    fn child_path(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// An error about `key` of this table, which is absent or whose line is unknown.
    pub(crate) fn err_key(&self, key: &str, message: impl Into<String>) -> ConfigError {
        self.src
            .error(self.line, Some(self.child_path(key)), message)
    }

    /// Rejects keys not in `allowed`, listing the allowed ones.
    pub(crate) fn check_keys(&self, allowed: &[&str]) -> Result<(), ConfigError> {
        self.check_keys_hinted(allowed, |_| None)
    }

    /// [`check_keys`](Self::check_keys), with `hint` saying more about a key it knows
    /// (a key of another table, another product's name for a key).
    pub(crate) fn check_keys_hinted(
        &self,
        allowed: &[&str],
        hint: impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        for (key, _) in self.inner.iter() {
            if allowed.contains(&key) {
                continue;
            }
            let field = self.get(key).expect("iterated key exists");
            if let Some(h) = hint(key) {
                return Err(field.err(format!("unknown key here: {h}")));
            }
            let hint = values::did_you_mean(key, allowed)
                .map(|k| format!(" (did you mean `{k}`?)"))
                .unwrap_or_default();
            return Err(field.err(format!(
                "unknown key{hint}; allowed here: {}",
                allowed.join(", ")
            )));
        }
        Ok(())
    }

    /// All keys with their fields, in file order.
    pub(crate) fn entries(&self) -> Vec<(&'a str, Field<'a>)> {
        self.inner
            .iter()
            .map(|(k, _)| (k, self.get(k).expect("iterated key exists")))
            .collect()
    }

    pub(crate) fn get(&self, key: &str) -> Option<Field<'a>> {
        let (k, item) = self.inner.get_key_value(key)?;
        if item.is_none() {
            return None;
        }
        let line = self
            .src
            .line_of(item.span())
            .or(self.src.line_of(k.span()))
            .or(self.line);
        Some(Field {
            src: self.src,
            node: Node::Item(item),
            path: self.child_path(key),
            line,
        })
    }

    /// A required key; when missing the error points at the table header.
    pub(crate) fn require(&self, key: &str, example: &str) -> Result<Field<'a>, ConfigError> {
        self.get(key).ok_or_else(|| {
            self.err_key(
                key,
                format!("required key is missing, e.g. {key} = {example}"),
            )
        })
    }
}

impl<'a> Field<'a> {
    pub(crate) fn err(&self, message: impl Into<String>) -> ConfigError {
        self.src.error(self.line, Some(self.path.clone()), message)
    }

    fn wrong_type(&self, expected: &str) -> ConfigError {
        self.err(format!("must be {expected} (got {})", self.node.describe()))
    }

    /// The value when it is a string; `None` for other types (for keys that take several).
    pub(crate) fn as_str_opt(&self) -> Option<&'a str> {
        self.node.value().and_then(Value::as_str)
    }

    pub(crate) fn as_int_opt(&self) -> Option<i64> {
        self.node.value().and_then(Value::as_integer)
    }

    pub(crate) fn as_bool_opt(&self) -> Option<bool> {
        self.node.value().and_then(Value::as_bool)
    }

    pub(crate) fn str(&self) -> Result<&'a str, ConfigError> {
        self.as_str_opt().ok_or_else(|| self.wrong_type("a string"))
    }

    pub(crate) fn bool(&self) -> Result<bool, ConfigError> {
        self.as_bool_opt()
            .ok_or_else(|| self.wrong_type("true or false"))
    }

    pub(crate) fn int(&self) -> Result<i64, ConfigError> {
        self.as_int_opt()
            .ok_or_else(|| self.wrong_type("an integer"))
    }

    /// An integer in `min..=max`.
    pub(crate) fn int_in(&self, min: i64, max: i64) -> Result<i64, ConfigError> {
        let n = self.int()?;
        if n < min {
            return Err(self.err(format!("must be at least {min} (got {n})")));
        }
        if n > max {
            return Err(self.err(format!("must be at most {max} (got {n})")));
        }
        Ok(n)
    }

    /// A string parsed by `parse`, whose error message is reported at this field.
    pub(crate) fn parse<T>(
        &self,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<T, ConfigError> {
        parse(self.str()?).map_err(|m| self.err(m))
    }

    /// One of a fixed set of strings.
    pub(crate) fn choice<T: Copy>(&self, options: &[(&str, T)]) -> Result<T, ConfigError> {
        let names: Vec<String> = options.iter().map(|(n, _)| format!("\"{n}\"")).collect();
        let Some(s) = self.as_str_opt() else {
            return Err(self.wrong_type(&format!("one of {}", names.join(", "))));
        };
        if let Some((_, v)) = options.iter().find(|(n, _)| *n == s) {
            return Ok(*v);
        }
        let keys: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
        let hint = values::did_you_mean(s, &keys)
            .map(|k| format!(" (did you mean \"{k}\"?)"))
            .unwrap_or_default();
        Err(self.err(format!(
            "must be one of {} (got {s:?}){hint}",
            names.join(", ")
        )))
    }

    /// A table: `[x]` or an inline `{ .. }`.
    pub(crate) fn table(&self) -> Result<Table<'a>, ConfigError> {
        let inner = self
            .node
            .table_like()
            .ok_or_else(|| self.wrong_type("a table"))?;
        Ok(Table {
            src: self.src,
            inner,
            path: self.path.clone(),
            line: self.line,
        })
    }

    /// An array of tables: `[[x]]` entries or an array of inline tables.
    pub(crate) fn tables(&self) -> Result<Vec<Table<'a>>, ConfigError> {
        let mut out = Vec::new();
        match self.node {
            Node::Item(Item::ArrayOfTables(a)) => {
                for (i, t) in a.iter().enumerate() {
                    let line = self.src.line_of(t.span()).or(self.line);
                    out.push(Table {
                        src: self.src,
                        inner: t,
                        path: format!("{}[{i}]", self.path),
                        line,
                    });
                }
            }
            Node::Item(Item::Table(_)) => {
                let header: String = self
                    .path
                    .split('[')
                    .map(|p| p.split_once(']').map_or(p, |(_, r)| r))
                    .collect();
                return Err(self.err(format!(
                    "must be an array of tables: write [[{header}]] with double brackets (got a table)"
                )));
            }
            _ => {
                let elems = self
                    .array()
                    .map_err(|_| self.wrong_type("an array of tables"))?;
                for e in elems {
                    let inner = e.node.table_like().ok_or_else(|| e.wrong_type("a table"))?;
                    out.push(Table {
                        src: self.src,
                        inner,
                        path: e.path,
                        line: e.line,
                    });
                }
            }
        }
        Ok(out)
    }

    /// The elements of an array.
    pub(crate) fn array(&self) -> Result<Vec<Field<'a>>, ConfigError> {
        let arr = self
            .node
            .value()
            .and_then(Value::as_array)
            .ok_or_else(|| self.wrong_type("an array"))?;
        Ok(arr
            .iter()
            .enumerate()
            .map(|(i, v)| Field {
                src: self.src,
                node: Node::Value(v),
                path: format!("{}[{i}]", self.path),
                line: self.src.line_of(v.span()).or(self.line),
            })
            .collect())
    }

    pub(crate) fn is_array(&self) -> bool {
        self.node.value().is_some_and(Value::is_array)
    }
}
