//! Where a probe report's server is, without searching for it: each server incarnation
//! gets a slot in a dense table (slot and generation packed into its report key,
//! `ServerKey::service`), and the slot holds the server's service and position
//! (`server_table.rs`). A removed server's slot gets a new generation before it is
//! reused, so a late report of the old incarnation can never reach the new one.
//!
//! Routes are recomputed in one pass over every server after a reload, and lazily when
//! a report finds its route out of date after a server was added or removed (the tables'
//! layout epoch moved): a report costs an index, a compare, and the health update.

/// Route of a slot that is allocated but not yet placed (its server was just made).
const UNPLACED: u32 = u32::MAX;
/// Route of a slot on the free list.
const FREE: u32 = u32::MAX - 1;

#[derive(Clone, Copy, Debug)]
struct Route {
    generation: u32,
    /// Index into the agent's services, or [`UNPLACED`] / [`FREE`].
    service: u32,
    /// Position in that service's server table.
    index: u32,
}

// A key packs a 32-bit slot and a 32-bit generation.
const _: () = assert!(usize::BITS >= 64);

fn pack(slot: u32, generation: u32) -> usize {
    ((generation as usize) << 32) | slot as usize
}

fn unpack(key: usize) -> (usize, u32) {
    (key & 0xffff_ffff, (key >> 32) as u32)
}

/// What the table says about a report key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Lookup {
    /// Not a live incarnation: its server was removed or replaced.
    Stale,
    /// Live, and placed at (service, position) as of the last [`ReportRoutes::place`].
    At(usize, usize),
    /// Live, not placed since it was made.
    Unplaced,
}

/// The slots of every server incarnation of one agent.
#[derive(Debug, Default)]
pub(super) struct ReportRoutes {
    routes: Vec<Route>,
    free: Vec<u32>,
    /// The layout epoch (`server_table::layout_epoch`) the routes were placed at.
    placed_at: Option<u64>,
}

impl ReportRoutes {
    /// A key for a new server incarnation (`ServerKey::service`), unique among every key
    /// this table has handed out while its slot is in use.
    pub fn allocate(&mut self) -> usize {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                let slot = u32::try_from(self.routes.len()).expect("fewer than 2^32 servers");
                self.routes.push(Route {
                    generation: 0,
                    service: UNPLACED,
                    index: 0,
                });
                slot
            }
        };
        let route = &mut self.routes[slot as usize];
        route.service = UNPLACED;
        pack(slot, route.generation)
    }

    pub fn lookup(&self, key: usize) -> Lookup {
        let (slot, generation) = unpack(key);
        match self.routes.get(slot) {
            Some(r) if r.generation == generation && r.service == UNPLACED => Lookup::Unplaced,
            Some(r) if r.generation == generation && r.service != FREE => {
                Lookup::At(r.service as usize, r.index as usize)
            }
            _ => Lookup::Stale,
        }
    }

    /// Whether the routes were placed at `epoch` (nothing moved since).
    pub fn placed_at(&self, epoch: u64) -> bool {
        self.placed_at == Some(epoch)
    }

    /// Places every live server: `servers` yields (service index, position, key) for
    /// each server of every service. Slots of keys not yielded are freed, their
    /// generation moved on.
    pub fn place(&mut self, servers: impl Iterator<Item = (usize, usize, usize)>, epoch: u64) {
        let mut live = vec![false; self.routes.len()];
        for (service, index, key) in servers {
            let (slot, generation) = unpack(key);
            let Some(r) = self.routes.get_mut(slot) else {
                continue;
            };
            if r.generation != generation || r.service == FREE {
                continue;
            }
            r.service = u32::try_from(service).unwrap_or(UNPLACED);
            r.index = u32::try_from(index).unwrap_or(0);
            live[slot] = true;
        }
        for (slot, r) in self.routes.iter_mut().enumerate() {
            if !live[slot] && r.service != FREE {
                r.generation = r.generation.wrapping_add(1);
                r.service = FREE;
                self.free.push(slot as u32);
            }
        }
        self.placed_at = Some(epoch);
    }

    /// Slots in use (tests).
    #[cfg(test)]
    pub fn in_use(&self) -> usize {
        self.routes.len() - self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_routes_to_where_it_was_placed_and_is_stale_once_its_slot_is_freed() {
        let mut t = ReportRoutes::default();
        let a = t.allocate();
        let b = t.allocate();
        assert_eq!(t.lookup(a), Lookup::Unplaced);
        t.place([(0, 0, a), (1, 5, b)].into_iter(), 1);
        assert_eq!(t.lookup(a), Lookup::At(0, 0));
        assert_eq!(t.lookup(b), Lookup::At(1, 5));
        assert!(t.placed_at(1) && !t.placed_at(2));
        // `a` is gone: its slot is freed and reused under a new generation.
        t.place([(1, 4, b)].into_iter(), 2);
        assert_eq!(t.lookup(a), Lookup::Stale);
        let c = t.allocate();
        assert_ne!(c, a, "a reused slot must not give the old key");
        assert_eq!(unpack(c).0, unpack(a).0, "the freed slot is reused");
        assert_eq!(t.lookup(a), Lookup::Stale);
        assert_eq!(t.lookup(c), Lookup::Unplaced);
        t.place([(1, 4, b), (0, 0, c)].into_iter(), 3);
        assert_eq!(t.lookup(c), Lookup::At(0, 0));
        assert_eq!(t.lookup(a), Lookup::Stale);
        assert_eq!(t.in_use(), 2);
    }

    #[test]
    fn keys_never_handed_out_are_stale() {
        let mut t = ReportRoutes::default();
        assert_eq!(t.lookup(0), Lookup::Stale);
        let a = t.allocate();
        assert_eq!(t.lookup(a + (1 << 32)), Lookup::Stale);
        assert_eq!(t.lookup(a + 1), Lookup::Stale);
    }
}
