//! The lb.toml an import writes: services with their servers and probes as ordered
//! keys, and notes (TOML comments) on what the source said that lb does differently or
//! not at all, each with the source line.

use std::fmt::Write;

/// A TOML value as it is written.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Str(String),
    Int(i64),
    Bool(bool),
    /// Written as it is (an inline table or an array built by the converter).
    Raw(String),
}

impl Value {
    pub fn str(s: impl Into<String>) -> Value {
        Value::Str(s.into())
    }

    pub fn render(&self) -> String {
        match self {
            Value::Str(s) => toml::Value::String(s.clone()).to_string(),
            Value::Int(i) => i.to_string(),
            Value::Bool(b) => b.to_string(),
            Value::Raw(r) => r.clone(),
        }
    }
}

/// One TOML table: its keys in order and the notes written above it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Table {
    pub notes: Vec<String>,
    keys: Vec<(String, Value)>,
}

impl Table {
    /// An empty table under `notes`.
    pub fn with_notes(notes: Vec<String>) -> Table {
        Table {
            notes,
            keys: Vec::new(),
        }
    }

    /// Sets `key` (replacing an earlier value of it).
    pub fn set(&mut self, key: &str, value: Value) {
        match self.keys.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => self.keys.push((key.to_owned(), value)),
        }
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.keys.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The keys as written, for comparing two tables.
    pub fn keys(&self) -> &[(String, Value)] {
        &self.keys
    }

    /// A note from source line `line`.
    pub fn note(&mut self, line: usize, text: impl AsRef<str>) {
        self.notes.push(format!("line {line}: {}", text.as_ref()));
    }

    fn write(&self, out: &mut String, header: &str) {
        for n in &self.notes {
            comment(out, n);
        }
        let _ = writeln!(out, "{header}");
        for (k, v) in &self.keys {
            let _ = writeln!(out, "{k} = {}", v.render());
        }
    }
}

/// A service with its servers and probes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Service {
    pub table: Table,
    pub servers: Vec<Table>,
    pub probes: Vec<Table>,
}

/// The whole lb.toml.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Draft {
    /// Notes on directives that concern no service (written at the top).
    pub notes: Vec<String>,
    pub services: Vec<Service>,
}

impl Draft {
    pub fn note(&mut self, line: usize, text: impl AsRef<str>) {
        self.notes.push(format!("line {line}: {}", text.as_ref()));
    }

    /// The lb.toml text, opening with where it came from.
    pub fn render(&self, origin: &str) -> String {
        let mut out = String::new();
        comment(
            &mut out,
            &format!("lb.toml converted from {origin} by lb-agent import."),
        );
        comment(
            &mut out,
            "Check it with `lb-agent check-config FILE`; the notes below say what the source \
             configured that lb does differently or not at all (docs/migrating.md).",
        );
        if !self.notes.is_empty() {
            out.push('\n');
            for n in &self.notes {
                comment(&mut out, n);
            }
        }
        out.push_str("\n[agent]\n");
        comment(
            &mut out,
            "interface = \"eth0\"  # the NIC clients' packets arrive on (or run --interface)",
        );
        if self.services.is_empty() {
            out.push('\n');
            comment(&mut out, "No service could be converted.");
        }
        for s in &self.services {
            out.push('\n');
            s.table.write(&mut out, "[[service]]");
            for server in &s.servers {
                out.push('\n');
                server.write(&mut out, "[[service.server]]");
            }
            for probe in &s.probes {
                out.push('\n');
                probe.write(&mut out, "[[service.probe]]");
            }
        }
        out
    }
}

/// `text` as `# ` lines, wrapped at about 88 columns.
fn comment(out: &mut String, text: &str) {
    let mut line = String::from("#");
    for word in text.split(' ') {
        if line.len() > 1 && line.len() + 1 + word.len() > 88 {
            let _ = writeln!(out, "{line}");
            line = String::from("#  ");
        }
        line.push(' ');
        line.push_str(word);
    }
    let _ = writeln!(out, "{line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_tables_in_order_with_notes() {
        let mut table = Table::default();
        table.set("name", Value::str("web"));
        table.set("weight", Value::Int(2));
        table.set("name", Value::str("w\"eb"));
        table.note(7, "lb_algo wrr: no equivalent");
        let mut draft = Draft::default();
        draft.services.push(Service {
            table,
            ..Service::default()
        });
        let text = draft.render("k.conf");
        assert!(
            text.ends_with(
                "\n# line 7: lb_algo wrr: no equivalent\n[[service]]\nname = 'w\"eb'\nweight = 2\n"
            ),
            "{text}"
        );
    }
}
