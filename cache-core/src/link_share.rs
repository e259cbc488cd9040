//! Demand before prefetch on the store link (issue 13, item 4): how one link's
//! bandwidth is split between the two priority classes of store requests while both
//! have transfers in progress. Pure logic: the replay's link model splits its rates with
//! it, and [`crate::scheduler::StoreScheduler`] bounds the prefetch requests it starts by
//! the same cap.
//!
//! Within a class transfers share equally (processor sharing, as concurrent TCP
//! connections to one store do). Between classes, prefetch takes at most
//! [`LinkShare::prefetch_cap`] of the link while any demand transfer is active, and
//! never more than it would get by plain sharing (`n_p / (n_d + n_p)`), so demand is
//! never slower than without the cap. Work-conserving: a class alone gets the whole
//! link, so an idle link still prefetches at full speed.

/// The split of one link between demand and prefetch transfers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkShare {
    /// Most of the link prefetch may take while demand transfers are active: 0.2, so a
    /// waiting demand read is slowed by prefetch by at most 1 / (1 - 0.2) = 1.25x
    /// (plain sharing lets 20 prefetches in flight, the controller's 20 MB backlog of
    /// 1 MiB blocks, slow one demand fetch 21x).
    pub prefetch_cap: f64,
}

impl Default for LinkShare {
    fn default() -> Self {
        LinkShare { prefetch_cap: 0.2 }
    }
}

impl LinkShare {
    /// Shares of the link `(demand, prefetch)` with `demand` and `prefetch` transfers
    /// active; they sum to 1 when either is non-zero, and a class without transfers
    /// gets 0.
    pub fn shares(&self, demand: usize, prefetch: usize) -> (f64, f64) {
        match (demand, prefetch) {
            (0, 0) => (0.0, 0.0),
            (_, 0) => (1.0, 0.0),
            (0, _) => (0.0, 1.0),
            (d, p) => {
                let fair = p as f64 / (d + p) as f64;
                let pf = fair.min(self.prefetch_cap.clamp(0.0, 1.0));
                (1.0 - pf, pf)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_class_alone_gets_the_whole_link() {
        let s = LinkShare::default();
        assert_eq!(s.shares(3, 0), (1.0, 0.0));
        assert_eq!(s.shares(0, 7), (0.0, 1.0));
        assert_eq!(s.shares(0, 0), (0.0, 0.0));
    }

    #[test]
    fn many_prefetches_take_at_most_the_cap_from_one_demand() {
        let (d, p) = LinkShare::default().shares(1, 20);
        assert!(
            (p - 0.2).abs() < 1e-12 && (d - 0.8).abs() < 1e-12,
            "{d} {p}"
        );
    }

    proptest! {
        /// Demand never gets less than plain processor sharing would give it, the
        /// shares sum to 1, and prefetch stays within the cap while demand is active.
        #[test]
        fn demand_is_never_worse_than_plain_sharing(d in 1usize..64, p in 1usize..64, cap in 0.0f64..1.0) {
            let (ds, ps) = LinkShare { prefetch_cap: cap }.shares(d, p);
            prop_assert!((ds + ps - 1.0).abs() < 1e-12);
            prop_assert!(ds + 1e-12 >= d as f64 / (d + p) as f64);
            prop_assert!(ps <= cap + 1e-12);
        }
    }
}
