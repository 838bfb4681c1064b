//! Holds on the daily caps: every stage call of a capped run holds what it may spend in the
//! store before it is sent, atomically with every other run and gateway, and settles it after.

use std::collections::BTreeSet;
use std::sync::Arc;

use assay_domain::{StageError, Usage};

use super::caps::{NANO, SpendCaps, at_cap, today};
use crate::store::{HoldOutcome, SpendHold};

/// How long a hold on a cap lasts unsettled before it counts as spent (its gateway is taken to
/// have died with the call in flight). Longer than any stage call is allowed to take.
pub const HOLD_LEASE: std::time::Duration = std::time::Duration::from_secs(6 * 3600);

/// How soon a hold that must wait for other gateways' holds asks the store again (doubling up to
/// [`HOLD_POLL_MAX`]); a hold of this gateway settled wakes it at once.
pub(super) const HOLD_POLL: std::time::Duration = std::time::Duration::from_millis(50);
const HOLD_POLL_MAX: std::time::Duration = std::time::Duration::from_millis(800);

impl SpendCaps {
    /// What the caps of `backends` have free now (the least over them), nano-dollars, as last
    /// learned (holds of other runs not counted); None when none of them is capped.
    pub fn free(&self, backends: &BTreeSet<String>) -> Option<u64> {
        let day = today();
        let known = self.known.lock().ok()?;
        backends
            .iter()
            .filter_map(|b| {
                let cap = *self.caps.get(b)?;
                let total = known.get(b).filter(|(d, _)| *d == day).map_or(0, |(_, t)| *t);
                Some((cap - total).max(0) as u64)
            })
            .min()
    }

    /// Hold at least `min` and up to `want` nano-dollars on the cap of each capped backend in
    /// `backends` for one stage call of run `run_id` (the call may spend it on any of them):
    /// waits while other runs' holds take what it needs, refused (RESOURCE_EXHAUSTED, a budget
    /// refusal naming the backend and its cap) when the day's spend leaves less than `min`.
    pub async fn hold(
        self: &Arc<Self>,
        run_id: &str,
        backends: &BTreeSet<String>,
        min: u64,
        want: u64,
    ) -> Result<CapHold, StageError> {
        let day = today();
        let mut hold = CapHold { caps: self.clone(), day: day.clone(), held: Vec::new(), settled: false, sent: None };
        let mut want = want.max(min) as i64;
        let expires_at = std::time::SystemTime::now()
            .checked_add(HOLD_LEASE)
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(i64::MAX, |d| d.as_secs() as i64);
        for backend in backends {
            let Some(&cap) = self.caps.get(backend) else { continue };
            let request = SpendHold {
                id: uuid::Uuid::now_v7().to_string(),
                run_id: run_id.to_string(),
                day: day.clone(),
                backend: backend.clone(),
                nano_usd: want,
                expires_at,
            };
            // This gateway's waiters take turns (first come, first served): one at a time asks
            // the store again, when a hold of this gateway is settled or, for other gateways'
            // holds, after a backoff.
            let mut turn = None;
            let mut backoff = HOLD_POLL;
            loop {
                let settled = self.released.notified();
                tokio::pin!(settled);
                settled.as_mut().enable();
                match self.store.hold_spend(&request, min as i64, cap).await? {
                    HoldOutcome::Granted(n) => {
                        hold.held.push((backend.clone(), request.id.clone(), n));
                        want = want.min(n);
                        break;
                    }
                    HoldOutcome::Wait if turn.is_none() => turn = Some(self.waiting.lock().await),
                    HoldOutcome::Wait => {
                        tokio::select! {
                            () = settled => {}
                            () = tokio::time::sleep(backoff) => backoff = (backoff * 2).min(HOLD_POLL_MAX),
                        }
                    }
                    HoldOutcome::Refused(spent) => {
                        self.learn(backend, &day, spent);
                        if let Ok(mut refused) = self.refused.lock() {
                            let entry = refused.entry(backend.clone()).or_insert_with(|| (day.clone(), min as i64));
                            if entry.0 != day || entry.1 > min as i64 {
                                *entry = (day.clone(), min as i64);
                            }
                        }
                        // Kept in the store too: a new process (or another gateway) refuses new
                        // runs at admission instead of starting them to fail every call. A
                        // failure to keep it is logged: the call is refused all the same.
                        if let Err(e) = self.store.note_need(&day, backend, min as i64).await {
                            tracing::warn!(backend = %backend, error = %e, "could not store a refused call's need");
                        }
                        let reason = self
                            .reached(backend, &day, spent)
                            .unwrap_or_else(|| at_cap(backend, &day, cap, spent, min as i64));
                        return Err(StageError::ResourceExhausted(format!("{}: {reason}", assay_budget::EXHAUSTED)));
                    }
                }
            }
        }
        Ok(hold)
    }
}

/// Money held on the daily caps for one stage call. Settle it with the call's usage; dropped
/// unsettled (off the caller's path), it is given back, or counted as spent at the call's
/// estimate once the call was sent ([`CapHold::sent`]).
pub struct CapHold {
    caps: Arc<SpendCaps>,
    day: String,
    /// (backend, hold id, nano-dollars held).
    held: Vec<(String, String, i64)>,
    settled: bool,
    /// The call went out, estimated at this many nano-dollars: dropped unsettled now (its run
    /// cancelled, its caller gone), each hold counts as spent up to it, for the backend may serve
    /// what was sent.
    sent: Option<i64>,
}

impl CapHold {
    /// What is held on every capped backend: the least of the holds, nano-dollars (None when
    /// nothing is capped).
    pub fn granted(&self) -> Option<u64> {
        self.held.iter().map(|(_, _, n)| (*n).max(0) as u64).min()
    }

    /// The call is being sent, estimated at `nano_usd`: from now on, dropped unsettled, each
    /// hold counts as spent up to that.
    pub fn sent(&mut self, nano_usd: u64) {
        self.sent = Some(i64::try_from(nano_usd).unwrap_or(i64::MAX));
    }

    /// The call spent `usage`: each hold removed and the backend's priced cost added to its
    /// day's spend.
    pub async fn settle(mut self, usage: &Usage) {
        self.settled = true;
        let held = std::mem::take(&mut self.held);
        settle_holds(&self.caps, &self.day, held, Settled::Spent(usage)).await;
    }
}

/// What a hold on a cap becomes.
enum Settled<'a> {
    /// The call's usage: its cost on each backend.
    Spent(&'a Usage),
    /// Nothing was sent: given back.
    GivenBack,
    /// Sent and cut off: spent at this estimate, at most what was held.
    CutOff(i64),
}

async fn settle_holds(caps: &SpendCaps, day: &str, held: Vec<(String, String, i64)>, how: Settled<'_>) {
    for (backend, id, reserved) in held {
        let actual = match how {
            Settled::Spent(u) => u.cost_by_backend.get(&backend).map_or(0, |usd| (usd * NANO).round() as i64),
            Settled::GivenBack => 0,
            Settled::CutOff(estimate) => estimate.min(reserved),
        };
        // A store that fails now may answer in a moment: an unsettled hold would keep its money
        // from every run until it expires.
        let mut wait = HOLD_POLL;
        for attempt in 1..=5 {
            match caps.store.settle_spend(day, &backend, &id, reserved, actual).await {
                Ok(total) => {
                    caps.learn(&backend, day, total);
                    break;
                }
                Err(e) => {
                    tracing::warn!(backend = %backend, attempt, error = %e, "could not settle a hold on the backend's daily cap");
                    tokio::time::sleep(wait).await;
                    wait *= 4;
                }
            }
        }
    }
    caps.released.notify_waiters();
}

impl Drop for CapHold {
    fn drop(&mut self) {
        if self.settled || self.held.is_empty() {
            return;
        }
        let (caps, day, held) = (self.caps.clone(), self.day.clone(), std::mem::take(&mut self.held));
        let how = self.sent.map_or(Settled::GivenBack, Settled::CutOff);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { settle_holds(&caps, &day, held, how).await });
        }
    }
}
