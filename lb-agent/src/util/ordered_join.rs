//! Pairs two address-ordered sequences (the agent's servers, the publisher's backends)
//! in one pass, instead of a map lookup per server.

use std::{iter::Peekable, net::SocketAddr};

/// Yields each item of `left` with the `right` value of the same address, if any. Both
/// must be in ascending address order (`BTreeMap` iteration order).
pub(crate) fn join<'a, L, R>(
    left: impl Iterator<Item = (&'a SocketAddr, L)>,
    right: impl Iterator<Item = (SocketAddr, R)>,
) -> impl Iterator<Item = (L, Option<R>)> {
    let mut right: Peekable<_> = right.peekable();
    left.map(move |(addr, l)| {
        while right.next_if(|(a, _)| a < addr).is_some() {}
        (l, right.next_if(|(a, _)| a == addr).map(|(_, r)| r))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn pairs_equal_addresses_and_skips_either_side_s_extras() {
        let left = [a("10.0.0.1:80"), a("10.0.0.3:80"), a("10.0.0.5:80")];
        let right = [
            (a("10.0.0.0:80"), 0),
            (a("10.0.0.3:80"), 3),
            (a("10.0.0.4:80"), 4),
            (a("10.0.0.5:80"), 5),
            (a("10.0.0.9:80"), 9),
        ];
        let got: Vec<_> = join(left.iter().map(|x| (x, *x)), right.into_iter()).collect();
        assert_eq!(
            got,
            vec![(left[0], None), (left[1], Some(3)), (left[2], Some(5))]
        );
    }
}
