//! `lb-maglev-bench [--rounds R]`: one weighted Maglev build, the reference builder
//! (`maglev::reference`, every claim walks the table) against the current one
//! (`maglev::build_table`: occupancy bitset, solved tail), in alternating blocks in one
//! process; prints per case the median and range over the rounds of each, and checks
//! that both give the same table (BENCHMARKS.md §2).

use std::time::{Duration, Instant};

use anyhow::bail;
use lb_agent::maglev::{self, MaglevBackend};

/// One table to build: `backends` servers over `size` slots, weights `1..=distinct`.
struct Case {
    size: u32,
    backends: u32,
    distinct: u32,
}

const CASES: [Case; 5] = [
    Case {
        size: 262_147,
        backends: 10_000,
        distinct: 1,
    },
    Case {
        size: 262_147,
        backends: 10_000,
        distinct: 4,
    },
    Case {
        size: 262_147,
        backends: 2_000,
        distinct: 1,
    },
    Case {
        size: 65_537,
        backends: 500,
        distinct: 1,
    },
    Case {
        size: 16_411,
        backends: 100,
        distinct: 1,
    },
];

fn backends(case: &Case) -> Vec<MaglevBackend> {
    (0..case.backends)
        .map(|i| {
            let addr =
                std::net::SocketAddr::from(([10, (i >> 16) as u8, (i >> 8) as u8, i as u8], 8080));
            MaglevBackend {
                id: i + 1,
                key: maglev::stable_key(&addr),
                weight: 1 + i % case.distinct,
            }
        })
        .collect()
}

fn timed(
    build: fn(&[MaglevBackend], u32) -> Vec<u32>,
    b: &[MaglevBackend],
    size: u32,
) -> (Duration, Vec<u32>) {
    let t = Instant::now();
    let table = build(b, size);
    (t.elapsed(), table)
}

fn median_and_range(mut v: Vec<Duration>) -> String {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    format!(
        "{:.2} ms ({:.2}–{:.2})",
        ms(v[v.len() / 2]),
        ms(v[0]),
        ms(v[v.len() - 1])
    )
}

fn main() -> anyhow::Result<()> {
    let mut rounds = 15usize;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--rounds" => rounds = args.next().unwrap_or_default().parse()?,
            other => bail!("usage: lb-maglev-bench [--rounds R] (unknown {other:?})"),
        }
    }
    println!("| slots | backends | weights | reference p50 (range) | current p50 (range) |");
    println!("|---:|---:|---:|---:|---:|");
    for case in &CASES {
        let b = backends(case);
        let (mut reference, mut current) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            // Alternate which goes first, so neither always finds the caches warm.
            let order: [bool; 2] = if round % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            };
            let mut tables = [Vec::new(), Vec::new()];
            for fast in order {
                let (spent, table) = if fast {
                    timed(maglev::build_table, &b, case.size)
                } else {
                    timed(maglev::reference::build_table, &b, case.size)
                };
                if fast {
                    current.push(spent);
                    tables[1] = table;
                } else {
                    reference.push(spent);
                    tables[0] = table;
                }
            }
            if tables[0] != tables[1] {
                bail!(
                    "{} slots, {} backends: the builders disagree",
                    case.size,
                    case.backends
                );
            }
        }
        println!(
            "| {} | {} | 1–{} | {} | {} |",
            case.size,
            case.backends,
            case.distinct,
            median_and_range(reference),
            median_and_range(current)
        );
    }
    Ok(())
}
