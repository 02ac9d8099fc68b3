//! `lb-agent import`: an lb.toml from the configs operators already have — keepalived's
//! IPVS `virtual_server` blocks ([`keepalived`]) and Angie/nginx `upstream` blocks
//! ([`angie`]). The output loads with `check-config`; every directive lb has no
//! equivalent for becomes a comment saying what lb does instead (docs/migrating.md).
//!
//! Both formats are read by one parser of their shared block syntax ([`syntax`]) into
//! a tree with line numbers, converted into a [`draft::Draft`], and written as TOML.

mod angie;
mod draft;
mod error;
mod keepalived;
mod syntax;

use std::net::IpAddr;

pub use error::ImportError;

/// The format of the file to convert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// keepalived.conf with `virtual_server` blocks (IPVS).
    Keepalived,
    /// Angie or nginx configuration with `upstream` blocks.
    Angie,
}

/// Converts `text`, the file `origin` in `format`, into lb.toml text.
pub fn convert(format: Format, text: &str, origin: &str) -> Result<String, ImportError> {
    let draft = match format {
        Format::Keepalived => {
            keepalived::convert(&syntax::parse(text, syntax::Dialect::Keepalived)?)?
        }
        Format::Angie => angie::convert(&syntax::parse(text, syntax::Dialect::Nginx)?)?,
    };
    Ok(draft.render(origin))
}

/// A service name from its VIP (names allow letters, digits, `_`, `-`, `.`), made unique
/// among `taken`.
fn service_name(base: &str, taken: &[draft::Service]) -> String {
    let clean: String = base
        .chars()
        .filter(|c| !matches!(c, '[' | ']'))
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_-.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(56)
        .collect();
    let used = |n: &str| {
        taken
            .iter()
            .any(|s| s.table.get("name") == Some(&draft::Value::str(n)))
    };
    let mut name = clean.clone();
    let mut i = 2;
    while used(&name) {
        name = format!("{clean}-{i}");
        i += 1;
    }
    name
}

/// `IP:PORT` as lb writes addresses (`[v6]:PORT`).
fn socket(ip: IpAddr, port: u16) -> String {
    std::net::SocketAddr::new(ip, port).to_string()
}

/// A weight lb accepts (1..=10000), with a note when `weight` had to change.
fn weight(weight: u64) -> (i64, Option<String>) {
    match weight {
        0 => (
            1,
            Some(
                "weight 0 (no new connections): lb weights are 1 to 10000; written as 1, \
                 run `lb-agent server drain SERVICE ADDRESS` after the start to keep it \
                 out of new flows"
                    .into(),
            ),
        ),
        1..=10000 => (weight as i64, None),
        _ => (
            10000,
            Some(format!(
                "weight {weight}: lb weights are 1 to 10000; written as 10000 (scale the \
                 others to keep the shares)"
            )),
        ),
    }
}

/// A duration in whole seconds as lb writes it.
fn secs(s: u64) -> draft::Value {
    draft::Value::str(format!("{s}s"))
}

/// The one argument of directive `d`, parsed.
fn arg<T: std::str::FromStr>(d: &syntax::Directive) -> Result<T, ImportError> {
    match d.args.as_slice() {
        [one] => one
            .parse()
            .map_err(|_| bad(d, &format!("cannot read {one:?}"))),
        _ => Err(bad(d, "expects one value")),
    }
}

fn bad(d: &syntax::Directive, what: &str) -> ImportError {
    ImportError::Value {
        line: d.line,
        directive: d.name.clone(),
        what: what.to_owned(),
    }
}
