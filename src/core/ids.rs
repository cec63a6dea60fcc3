//! Identifier newtypes shared by the ledger, the save queue and the actors.
//!
//! The engine hands the connector plain integers; wrapping each in its own type keeps a
//! request id from being passed where a reservation id is expected (same-typed arguments
//! are easy to swap). All three are `Copy`, ordered and hashable, and print as
//! the bare number so log fields read `request=17 reservation=4`.

use std::fmt;

/// The engine's identifier of one request (one prompt and its generation).
///
/// Unique among the requests the engine has in flight; the connector never invents one.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct RequestId(pub u64);

/// The engine's identifier of one prefix reservation (`reserve_prefix`, R23-R26).
///
/// The engine may re-reserve a request under a new id; completions for the old id are
/// then stale (R26). An id is only unique while it is live: the engine may reuse it after
/// releasing it, which is why the ledger pairs it with a generation in its load tickets.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct ReservationId(pub u64);

/// The connector's own number for one lookup of a request (R32).
///
/// Issued by the engine's handle, one per `lookup_prefix`, never reused within a
/// connector: a lookup result is accepted only by the request record that started it, so
/// a result that outlived its request (ended while the lookup ran) never reaches a later
/// request under the same id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct LookupTicket(pub u64);

/// Index of one page in a layer group's page table on this rank.
///
/// A page holds one block of one layer group (all layers of the group). The engine's
/// `-1` ("no page in this group") is never a `PageIndex`: callers map it to "absent"
/// before building one.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct PageIndex(pub u32);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for ReservationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for PageIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::{PageIndex, RequestId, ReservationId};

    #[test]
    fn ids_display_as_the_bare_number() {
        assert_eq!(RequestId(17).to_string(), "17");
        assert_eq!(ReservationId(4).to_string(), "4");
        assert_eq!(PageIndex(0).to_string(), "0");
    }

    #[test]
    fn ids_order_by_their_number() {
        let ids: BTreeSet<ReservationId> = [3, 1, 2].into_iter().map(ReservationId).collect();
        let in_order: Vec<u64> = ids.into_iter().map(|id| id.0).collect();
        assert_eq!(in_order, vec![1, 2, 3]);
        assert!(PageIndex(1) < PageIndex(2));
    }

    #[test]
    fn ids_serialize_transparently() -> Result<(), serde_json::Error> {
        assert_eq!(serde_json::to_string(&RequestId(9))?, "9");
        let page: PageIndex = serde_json::from_str("12")?;
        assert_eq!(page, PageIndex(12));
        Ok(())
    }
}
