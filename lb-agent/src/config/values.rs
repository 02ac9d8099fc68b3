//! Parsers for the string forms the config accepts: durations, sizes, port and status
//! ranges, payload escapes, server addresses and DNS names. Errors are plain messages;
//! the caller adds file, line and key.
//! [`human`] writes a duration back in the form the file takes (check-config and warnings).

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::ops::RangeInclusive;
use std::time::Duration;

use super::ServerAddress;

/// `"500ms"`, `"2s"`, `"1m"`, `"1h"`, `"1d"`, `"1m30s"`, `"1.5s"`, or `"0"`.
pub(crate) fn duration(s: &str) -> Result<Duration, String> {
    let bad = || {
        format!(
            "{s:?} is not a duration: write a number with a unit (ms, s, m, h, d), \
             e.g. \"500ms\", \"2s\", \"1m30s\""
        )
    };
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(bad());
    }
    let mut rest = s;
    let mut total_ns: u128 = 0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let (num, tail) = rest.split_at(num_len);
        let unit_len = tail
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let unit_ns: u128 = match unit {
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 3_600 * 1_000_000_000,
            "d" => 86_400 * 1_000_000_000,
            _ => return Err(bad()),
        };
        let (int, frac) = match num.split_once('.') {
            Some((i, f)) => (i, f),
            None => (num, ""),
        };
        if int.is_empty() || frac.contains('.') || (num.contains('.') && frac.is_empty()) {
            return Err(bad());
        }
        let int: u128 = int.parse().map_err(|_| bad())?;
        let frac_len = u32::try_from(frac.len()).map_err(|_| bad())?;
        let scale = 10u128.checked_pow(frac_len).ok_or_else(bad)?;
        let frac_val: u128 = if frac.is_empty() {
            0
        } else {
            frac.parse().map_err(|_| bad())?
        };
        let part = int
            .checked_mul(unit_ns)
            .and_then(|v| v.checked_add(frac_val.checked_mul(unit_ns)? / scale))
            .ok_or_else(|| format!("{s:?} is too long a duration"))?;
        total_ns = total_ns
            .checked_add(part)
            .ok_or_else(|| format!("{s:?} is too long a duration"))?;
        rest = tail;
    }
    let ns = u64::try_from(total_ns).map_err(|_| format!("{s:?} is too long a duration"))?;
    Ok(Duration::from_nanos(ns))
}

/// A duration as the config file writes it: `0s`, `250ms`, `1.5s`, `6s`, `1m30s`, `2h`.
pub fn human(d: Duration) -> String {
    if d.is_zero() {
        return "0s".to_string();
    }
    let nanos = d.subsec_nanos();
    let secs = d.as_secs();
    if secs == 0 {
        return if nanos.is_multiple_of(1_000_000) {
            format!("{}ms", nanos / 1_000_000)
        } else if nanos.is_multiple_of(1_000) {
            format!("{}us", nanos / 1_000)
        } else {
            format!("{nanos}ns")
        };
    }
    if nanos != 0 {
        let frac = format!("{:09}", nanos);
        return format!("{secs}.{}s", frac.trim_end_matches('0'));
    }
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        let _ = write!(out, "{h}h");
    }
    if m > 0 {
        let _ = write!(out, "{m}m");
    }
    if s > 0 {
        let _ = write!(out, "{s}s");
    }
    out
}

/// `"4096"`, `"256k"`, `"1m"`, `"1g"` (binary multiples: k = 1024).
pub(crate) fn size(s: &str) -> Result<usize, String> {
    let bad = || {
        format!(
            "{s:?} is not a size: write bytes with an optional k, m or g suffix, e.g. \"4096\", \"256k\", \"1m\""
        )
    };
    let (digits, mult): (&str, u64) = match s.as_bytes().last() {
        Some(b'k' | b'K') => (&s[..s.len() - 1], 1 << 10),
        Some(b'm' | b'M') => (&s[..s.len() - 1], 1 << 20),
        Some(b'g' | b'G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    n.checked_mul(mult)
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// `"20000-29999"` or a single port `"20000"`; ports 1..=65535, low <= high.
pub(crate) fn port_range(s: &str) -> Result<RangeInclusive<u16>, String> {
    let (lo, hi) = s.split_once('-').unwrap_or((s, s));
    let lo = port(lo.trim(), s)?;
    let hi = port(hi.trim(), s)?;
    if lo > hi {
        return Err(format!(
            "{s:?} is empty: the first port must not be above the last, e.g. \"20000-29999\""
        ));
    }
    Ok(lo..=hi)
}

fn port(p: &str, whole: &str) -> Result<u16, String> {
    match p.parse::<u32>() {
        Ok(n @ 1..=65535) => Ok(n as u16),
        _ => Err(format!(
            "{whole:?} is not a port range: write \"LOW-HIGH\" with ports 1..65535, e.g. \"20000-29999\""
        )),
    }
}

/// An HTTP status code 100..=599 as a one-code range.
pub(crate) fn status_code(n: i64) -> Result<RangeInclusive<u16>, String> {
    match n {
        100..=599 => Ok(n as u16..=n as u16),
        _ => Err(format!("{n} is not an HTTP status code (100..599)")),
    }
}

/// `"200-299"`, `"204"` or `"2xx"`.
pub(crate) fn status_range(s: &str) -> Result<RangeInclusive<u16>, String> {
    let bad = || {
        format!(
            "{s:?} is not a status code or range: write e.g. 200, \"200-299\" or \"2xx\" (codes 100..599)"
        )
    };
    let code = |t: &str| -> Result<u16, String> {
        match t.trim().parse::<u16>() {
            Ok(n @ 100..=599) => Ok(n),
            _ => Err(bad()),
        }
    };
    if let Some(class) = s.strip_suffix("xx").or_else(|| s.strip_suffix("XX")) {
        return match class.parse::<u16>() {
            Ok(c @ 1..=5) if class.len() == 1 => Ok(c * 100..=c * 100 + 99),
            _ => Err(bad()),
        };
    }
    let (lo, hi) = s.split_once('-').unwrap_or((s, s));
    let (lo, hi) = (code(lo)?, code(hi)?);
    if lo > hi {
        return Err(format!(
            "{s:?} is an empty range: the first code must not be above the last"
        ));
    }
    Ok(lo..=hi)
}

/// Decodes `\r`, `\n`, `\t`, `\0`, `\\`, `\"`, `\'` and `\xNN` in a probe payload.
///
/// TOML basic strings (`"..."`) already decode `\r`, `\n`, `\t` and `\\` but reject `\x`;
/// in a literal string (`'...'`) every escape reaches this function.
pub(crate) fn unescape(s: &str) -> Result<Vec<u8>, String> {
    let allowed = "allowed escapes: \\r \\n \\t \\0 \\\\ \\\" \\' \\xNN";
    let mut out = Vec::with_capacity(s.len());
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b != b'\\' {
            out.push(b);
            i += 1;
            continue;
        }
        let Some(&e) = bytes.get(i + 1) else {
            return Err(format!("ends with a lone backslash; {allowed}"));
        };
        i += 2;
        out.push(match e {
            b'r' => b'\r',
            b'n' => b'\n',
            b't' => b'\t',
            b'0' => 0,
            b'\\' => b'\\',
            b'"' => b'"',
            b'\'' => b'\'',
            b'x' => {
                let hex = bytes
                    .get(i..i + 2)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| format!("\\x needs two hex digits, e.g. \\x00; {allowed}"))?;
                i += 2;
                hex
            }
            other => {
                let shown =
                    String::from_utf8_lossy(&bytes[i - 1..(i - 1 + utf8_len(other))]).into_owned();
                return Err(format!("unknown escape \\{shown}; {allowed}"));
            }
        });
    }
    Ok(out)
}

fn utf8_len(first: u8) -> usize {
    match first {
        0xf0.. => 4,
        0xe0.. => 3,
        0xc0.. => 2,
        _ => 1,
    }
}

/// For an `"IP:PORT"` text that failed to parse only because its port is out of range
/// (`"10.0.0.1:70000"`, `"[::1]:0x50"`), the error that says exactly that; `None` otherwise.
pub(crate) fn port_out_of_range(s: &str) -> Option<String> {
    let (host, port) = s.rsplit_once(':')?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    host.parse::<IpAddr>().ok()?;
    match port.parse::<u64>() {
        Ok(n) if (1..=65535).contains(&n) => None,
        Ok(n) => Some(format!(
            "{s:?}: port {n} is out of range (ports are 1..65535)"
        )),
        Err(_) => Some(format!("{s:?}: {port:?} is not a port (1..65535)")),
    }
}

/// A server `address`: `"10.0.1.11:8080"`, `"[::1]:80"`, `"10.0.1.11"`, `"host"` or `"host:80"`.
///
/// Ports are 1..=65535. A name keeps `port: None` when it has none; the caller fills it in.
pub(crate) fn server_address(s: &str) -> Result<ServerAddress, String> {
    let hint = "write \"IP:PORT\", \"[IPv6]:PORT\", \"IP\", \"NAME\" or \"NAME:PORT\"";
    if let Ok(sa) = s.parse::<SocketAddr>() {
        if sa.port() == 0 {
            return Err(format!("{s:?}: port 0 is not allowed (ports are 1..65535)"));
        }
        return Ok(ServerAddress::Socket(sa));
    }
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok(ServerAddress::Socket(SocketAddr::new(ip, 0)));
    }
    if s.starts_with('[') || s.matches(':').count() > 1 {
        return Err(format!("{s:?} is not a valid IPv6 address; {hint}"));
    }
    let (host, port) = match s.rsplit_once(':') {
        Some((h, p)) => match p.parse::<u32>() {
            Ok(n @ 1..=65535) => (h, Some(n as u16)),
            _ => return Err(format!("{s:?}: {p:?} is not a port (1..65535); {hint}")),
        },
        None => (s, None),
    };
    if host.parse::<IpAddr>().is_ok() {
        return Err(format!("{s:?} is not a valid address; {hint}"));
    }
    dns_name(host).map_err(|e| format!("{s:?}: {e}; {hint}"))?;
    Ok(ServerAddress::Name {
        host: host.to_string(),
        port,
    })
}

/// A DNS name: labels of letters, digits, `-` and `_`, 1..=63 bytes each, at most 253 in
/// all, an optional trailing dot; not an IP address, and the last label is not all digits
/// (that is a mistyped IP).
pub(crate) fn dns_name(s: &str) -> Result<(), String> {
    if s.parse::<IpAddr>().is_ok() {
        return Err(format!("{s:?} is an IP address, not a host name"));
    }
    let name = s.strip_suffix('.').unwrap_or(s);
    if name.is_empty() {
        return Err("a host name cannot be empty".into());
    }
    if name.len() > 253 {
        return Err("a host name has at most 253 characters".into());
    }
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(format!(
                "{s:?} is not a host name: each dot-separated label has 1..63 characters"
            ));
        }
        if let Some(c) = label
            .chars()
            .find(|&c| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        {
            return Err(format!(
                "{s:?} is not a host name: {c:?} is not allowed (letters, digits, '-', '_', '.')"
            ));
        }
    }
    if name
        .rsplit('.')
        .next()
        .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(format!("{s:?} is neither an IP address nor a host name"));
    }
    Ok(())
}

/// An HTTP token (RFC 9110 `tchar`): method and header names.
pub(crate) fn http_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A value that can go on an HTTP request line or header line: no control characters.
pub(crate) fn http_text(s: &str) -> bool {
    !s.chars().any(|c| c.is_control())
}

/// Edit distance, for "did you mean" hints on unknown keys and values.
pub(crate) fn did_you_mean<'a>(got: &str, options: &[&'a str]) -> Option<&'a str> {
    options
        .iter()
        .map(|o| (levenshtein(got, o), *o))
        .filter(|(d, o)| *d <= 2.min(o.len() / 2))
        .min_by_key(|(d, _)| *d)
        .map(|(_, o)| o)
}

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn durations() {
        assert_eq!(duration("500ms"), Ok(ms(500)));
        assert_eq!(duration("2s"), Ok(ms(2000)));
        assert_eq!(duration("1m"), Ok(ms(60_000)));
        assert_eq!(duration("1h"), Ok(ms(3_600_000)));
        assert_eq!(duration("1d"), Ok(ms(86_400_000)));
        assert_eq!(duration("1m30s"), Ok(ms(90_000)));
        assert_eq!(duration("1h2m3s4ms"), Ok(ms(3_723_004)));
        assert_eq!(duration("1.5s"), Ok(ms(1500)));
        assert_eq!(duration("0.25s"), Ok(ms(250)));
        assert_eq!(duration("0"), Ok(Duration::ZERO));
        assert_eq!(duration("0s"), Ok(Duration::ZERO));
        for bad in [
            "", "5", "5 s", "5sec", "s", "1.s", ".5s", "1..5s", "-1s", "1s ", "2x",
        ] {
            let e = duration(bad).expect_err(bad);
            assert!(e.contains("is not a duration"), "{bad}: {e}");
        }
        assert!(duration("99999999999999999999d").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(size("4096"), Ok(4096));
        assert_eq!(size("256k"), Ok(256 * 1024));
        assert_eq!(size("256K"), Ok(256 * 1024));
        assert_eq!(size("1m"), Ok(1 << 20));
        assert_eq!(size("2g"), Ok(2 << 30));
        assert_eq!(size("0"), Ok(0));
        for bad in ["", "k", "1kb", "1.5k", "-1", " 1", "1t"] {
            assert!(size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn port_ranges() {
        assert_eq!(port_range("20000-29999"), Ok(20000..=29999));
        assert_eq!(port_range("1-65535"), Ok(1..=65535));
        assert_eq!(port_range("4000"), Ok(4000..=4000));
        assert!(port_range("0-10").is_err());
        assert!(port_range("10-65536").is_err());
        assert!(port_range("x-10").is_err());
        let e = port_range("30000-20000").unwrap_err();
        assert!(e.contains("empty"), "{e}");
    }

    #[test]
    fn status_ranges() {
        assert_eq!(status_range("200-299"), Ok(200..=299));
        assert_eq!(status_range("204"), Ok(204..=204));
        assert_eq!(status_range("3xx"), Ok(300..=399));
        assert_eq!(status_code(200), Ok(200..=200));
        assert!(status_code(99).is_err());
        assert!(status_code(600).is_err());
        assert!(status_range("6xx").is_err());
        assert!(status_range("299-200").is_err());
        assert!(status_range("abc").is_err());
    }

    #[test]
    fn escapes() {
        assert_eq!(
            unescape(r"GET / HTTP/1.0\r\n\r\n").unwrap(),
            b"GET / HTTP/1.0\r\n\r\n"
        );
        assert_eq!(unescape(r"\x00\xff\t\\\0").unwrap(), b"\x00\xff\t\\\x00");
        assert_eq!(unescape("already\r\n").unwrap(), b"already\r\n");
        assert_eq!(unescape("é").unwrap(), "é".as_bytes());
        assert!(unescape(r"\q").unwrap_err().contains("unknown escape \\q"));
        assert!(unescape(r"\é").unwrap_err().contains("unknown escape \\é"));
        assert!(unescape(r"\x0").unwrap_err().contains("two hex digits"));
        assert!(unescape(r"\xzz").is_err());
        assert!(unescape("end\\").unwrap_err().contains("lone backslash"));
    }

    #[test]
    fn out_of_range_ports_are_named() {
        assert_eq!(
            port_out_of_range("10.0.0.1:70000").as_deref(),
            Some("\"10.0.0.1:70000\": port 70000 is out of range (ports are 1..65535)")
        );
        assert_eq!(
            port_out_of_range("[::1]:65536").as_deref(),
            Some("\"[::1]:65536\": port 65536 is out of range (ports are 1..65535)")
        );
        assert_eq!(
            port_out_of_range("10.0.0.1:http").as_deref(),
            Some("\"10.0.0.1:http\": \"http\" is not a port (1..65535)")
        );
        assert_eq!(port_out_of_range("10.0.0.1:80"), None);
        assert_eq!(port_out_of_range("10.0.0.300:80"), None);
        assert_eq!(port_out_of_range("web"), None);
    }

    #[test]
    fn server_addresses() {
        use ServerAddress::*;
        assert_eq!(
            server_address("10.0.1.11:8080"),
            Ok(Socket("10.0.1.11:8080".parse().unwrap()))
        );
        assert_eq!(
            server_address("[::1]:80"),
            Ok(Socket("[::1]:80".parse().unwrap()))
        );
        assert_eq!(
            server_address("10.0.1.11"),
            Ok(Socket("10.0.1.11:0".parse().unwrap()))
        );
        assert_eq!(
            server_address("fd00::1"),
            Ok(Socket("[fd00::1]:0".parse().unwrap()))
        );
        assert_eq!(
            server_address("backends.example"),
            Ok(Name {
                host: "backends.example".into(),
                port: None
            })
        );
        assert_eq!(
            server_address("host:80"),
            Ok(Name {
                host: "host".into(),
                port: Some(80)
            })
        );
        for bad in [
            "10.0.1.11:0",
            "10.0.1.11:65536",
            "10.0.1.256",
            "10.0.1.256:80",
            "[::1]",
            "[::1]:x",
            "host:",
            "host:0",
            "bad host",
            "a..b",
            "",
            "host/x",
        ] {
            assert!(server_address(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tokens_and_hints() {
        assert!(http_token("GET"));
        assert!(http_token("X-Custom_Header"));
        assert!(!http_token("Bad Header"));
        assert!(!http_token(""));
        assert!(http_text("value with spaces"));
        assert!(!http_text("a\r\nb"));
        assert_eq!(did_you_mean("weigth", &["weight", "spare"]), Some("weight"));
        assert_eq!(did_you_mean("zzz", &["weight", "spare"]), None);
    }

    #[test]
    fn durations_print_as_the_config_writes_them() {
        let ms = Duration::from_millis;
        assert_eq!(human(Duration::ZERO), "0s");
        assert_eq!(human(ms(250)), "250ms");
        assert_eq!(human(ms(1500)), "1.5s");
        assert_eq!(human(ms(6000)), "6s");
        assert_eq!(human(ms(90_000)), "1m30s");
        assert_eq!(human(ms(7_200_000)), "2h");
        assert_eq!(human(Duration::from_micros(1500)), "1500us");
    }
}
