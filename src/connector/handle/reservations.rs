//! Which reservations a step may name as new (R32): the one of the request's latest offer
//! (`reserve_prefix` answered tokens for it), once.
//!
//! Workflow:
//! 1. `reserve_prefix` records the reservation of an offer of tokens (`offered`), or none
//!    when it offered nothing: a later reservation replaces an earlier one;
//! 2. [`ConnectorHandle::check_step`] refuses a step that names another reservation, or
//!    one already reported, before anything of the step is done (the Python package
//!    raises it);
//! 3. `on_step` (`plan_load`) takes the offered reservation (`reported`): a step that
//!    was not checked gets a failed load for a reservation never offered, and nothing for
//!    one named again, so no load is ever reported twice or started without an offer.

use super::ConnectorHandle;
use crate::connector::{HookError, SchedulerOutput};
use crate::core::ids::{RequestId, ReservationId};

impl ConnectorHandle {
    /// Refuses a step that names as `new_reservation` a reservation that is not the
    /// request's latest offer, or that a step already reported (module docs). Checks
    /// only: the step is then given to `on_step` as it is.
    ///
    /// # Errors
    /// [`HookError::UnofferedReservation`] or [`HookError::ReservationReported`] for the
    /// first such reservation of the step.
    pub fn check_step(&self, output: &SchedulerOutput<'_>) -> Result<(), HookError> {
        if self.ranks == 0 && !output.requests.is_empty() {
            return Err(HookError::LookupOnly);
        }
        let mut named: Vec<(RequestId, ReservationId)> = Vec::new();
        for scheduled in &output.requests {
            let Some(reservation) = scheduled.new_reservation else {
                continue;
            };
            let request = scheduled.request;
            if named.contains(&(request, reservation)) {
                return Err(HookError::ReservationReported {
                    request,
                    reservation,
                });
            }
            named.push((request, reservation));
            self.reservation_verdict(request, reservation)?;
        }
        Ok(())
    }

    /// Whether a step may start the load of `reservation` now.
    pub(super) fn reservation_verdict(
        &self,
        request: RequestId,
        reservation: ReservationId,
    ) -> Result<(), HookError> {
        let state = self.requests.get(&request);
        match state {
            Some(state) if state.offered == Some(reservation) => Ok(()),
            Some(state) if state.reported == Some(reservation) => {
                Err(HookError::ReservationReported {
                    request,
                    reservation,
                })
            }
            _ => Err(HookError::UnofferedReservation {
                request,
                reservation,
                offered: state.and_then(|state| state.offered),
            }),
        }
    }

    /// The offered reservation's load is starting: it is no longer on offer.
    pub(super) fn mark_reported(&mut self, request: RequestId, reservation: ReservationId) {
        if let Some(state) = self.requests.get_mut(&request) {
            state.offered = None;
            state.reported = Some(reservation);
        }
    }
}
