//! What one model call's HTTP attempts may have cost beyond the reply it returns.
//!
//! A backend serves (and a provider bills) a request whether or not its client is still waiting:
//! an attempt given up on at its timeout, a reply cut off, a 200 whose body could not be read, a
//! hedge that lost its race. The transport says so here for the call being made ([`abandoned`],
//! [`duplicated`]); the priced wrapper ([`crate::pricing`]) opens a [`Ledger`] around each call
//! ([`scope`]) and counts them into the call's usage:
//! - an **abandoned** attempt at its reservation (the worst case: the prompt estimated plus the
//!   completion limit), unless the backend is known not to have run it (the connection was
//!   refused, or it answered an error status). It is charged to the budget the moment it is given
//!   up on, out of the call's reservation;
//! - a **duplicate** whose reply was not used at the usage of the reply that was (it is the same
//!   request), with the call's reply.
//!
//! The attempt sent after an abandoned one has no reservation left, so it reserves its own worst
//! case first ([`reserve_next`]), waiting for room like any call, and is not sent when the budget
//! cannot pay for it. (No call waits on its own spent reservation: a call waiting for room holds
//! none.)

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use assay_budget::{Budget, Cost, Exhaustion, Hold};

use crate::types::{LlmError, Usage};

tokio::task_local! {
    static LEDGER: Arc<Ledger>;
}

/// One model call's attempts that went out without their reply being used, and its reservation.
#[derive(Debug)]
pub struct Ledger {
    /// The budget the call reserves from, if the work has one.
    budget: Option<Arc<Budget>>,
    /// One attempt's reservation.
    worst: Cost,
    /// One abandoned attempt as usage (priced): what it is charged.
    one: Usage,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    abandoned: u32,
    duplicates: u32,
    /// The reservation of the attempt going out now: the call's own at first; spent by an
    /// abandoned attempt; made again before the next one.
    hold: Option<Hold>,
}

impl Ledger {
    /// A ledger for a call whose attempts each reserve `worst` from `budget` (the call's first
    /// reservation is `hold`) and are charged `one` when abandoned.
    pub fn new(budget: Option<Arc<Budget>>, worst: Cost, one: Usage, hold: Option<Hold>) -> Arc<Ledger> {
        Arc::new(Ledger { budget, worst, one, state: Mutex::new(State { hold, ..State::default() }) })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Attempts given up on after they were sent.
    pub fn abandoned(&self) -> u32 {
        self.state().abandoned
    }

    /// Duplicate requests whose reply was not used.
    pub fn duplicates(&self) -> u32 {
        self.state().duplicates
    }

    /// What the abandoned attempts were charged (already charged to the budget).
    pub fn abandoned_usage(&self) -> Usage {
        times(&self.one, self.abandoned())
    }

    /// The reservation of the last attempt, for the call's reply to settle (None when that
    /// attempt was abandoned, or the work has no budget).
    pub fn take_hold(&self) -> Option<Hold> {
        self.state().hold.take()
    }

    fn abandon(&self, n: u32) {
        let mut s = self.state();
        s.abandoned += n;
        let spent = times(&self.one, n);
        match s.hold.take() {
            Some(hold) => hold.settle(&spent),
            None => {
                if let Some(b) = &self.budget {
                    b.charge(&spent);
                }
            }
        }
    }
}

/// `one` counted `n` times.
fn times(one: &Usage, n: u32) -> Usage {
    let mut total = Usage::default();
    for _ in 0..n {
        total.add(one);
    }
    total
}

/// Run `fut` (one model call) with `ledger` counting its attempts.
pub async fn scope<F: Future>(ledger: Arc<Ledger>, fut: F) -> F::Output {
    LEDGER.scope(ledger, fut).await
}

/// `n` attempts of the current call were given up on after they were sent: charged now.
pub(crate) fn abandoned(n: u32) {
    if n > 0 {
        let _ = LEDGER.try_with(|l| l.abandon(n));
    }
}

/// `n` duplicate requests of the current call went out and their replies were not used.
pub(crate) fn duplicated(n: u32) {
    if n > 0 {
        let _ = LEDGER.try_with(|l| l.state().duplicates += n);
    }
}

/// Before an attempt is sent: when the call's reservation was spent by an abandoned attempt,
/// reserve this one's worst case, waiting for room until `deadline`. Refused (or past the
/// deadline) the attempt is not sent.
pub(crate) async fn reserve_next(deadline: Option<Instant>) -> Result<(), LlmError> {
    let Ok(ledger) = LEDGER.try_with(Arc::clone) else { return Ok(()) };
    let Some(budget) = ledger.budget.clone() else { return Ok(()) };
    {
        let s = ledger.state();
        if s.hold.is_some() || s.abandoned == 0 {
            return Ok(());
        }
    }
    let reserve = budget.reserve(ledger.worst);
    let hold = match deadline {
        Some(d) => tokio::time::timeout_at(d.into(), reserve).await.map_err(|_| LlmError::DeadlineExceeded)?,
        None => reserve.await,
    };
    match hold {
        Ok(hold) => {
            ledger.state().hold = Some(hold);
            Ok(())
        }
        Err(refusal) if refusal.cause == Exhaustion::Unpriced => Err(LlmError::BudgetExhausted(refusal)),
        Err(mut refusal) => {
            refusal.message.push_str(" (to send again a call whose earlier attempt was given up on)");
            Err(LlmError::BudgetExhausted(refusal))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use assay_budget::Limits;

    fn one(tokens: u64) -> Usage {
        Usage { calls: 1, prompt_tokens: tokens, abandoned_calls: 1, abandoned_tokens: tokens, ..Usage::default() }
    }

    #[tokio::test]
    async fn an_abandoned_attempt_is_charged_and_the_next_reserves_its_own_worst_case() {
        let budget = Budget::new(Limits { max_tokens: Some(1000), max_cost_usd: None });
        let first = budget.reserve(Cost::new(100, 0)).await.unwrap();
        let ledger = Ledger::new(Some(budget.clone()), Cost::new(100, 0), one(100), Some(first));
        scope(ledger.clone(), async {
            reserve_next(None).await.unwrap();
            assert_eq!(budget.held().tokens, 100, "nothing abandoned: the call's own reservation is enough");
            abandoned(1);
            assert_eq!((budget.held().tokens, budget.spent_tokens()), (0, 100), "spent at its reservation");
            reserve_next(None).await.unwrap();
            assert_eq!(budget.held().tokens, 100, "the retry reserved its own");
            reserve_next(None).await.unwrap();
            assert_eq!(budget.held().tokens, 100, "once per abandoned attempt");
        })
        .await;
        assert_eq!((ledger.abandoned(), ledger.duplicates()), (1, 0));
        assert_eq!(ledger.abandoned_usage().abandoned_tokens, 100);
        ledger.take_hold().unwrap().settle(&one(40));
        assert_eq!((budget.held().tokens, budget.spent_tokens()), (0, 140));
    }

    /// A call alone in its budget (a stage call's slice) never waits on its own reservation: the
    /// retry fits in what the abandoned attempt left, or is refused at once.
    #[tokio::test]
    async fn an_attempt_after_an_abandoned_one_is_not_sent_when_the_budget_cannot_pay_for_it() {
        let budget = Budget::new(Limits { max_tokens: Some(150), max_cost_usd: None });
        let first = budget.reserve(Cost::new(100, 0)).await.unwrap();
        let ledger = Ledger::new(Some(budget.clone()), Cost::new(100, 0), one(100), Some(first));
        let refused = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            scope(ledger, async {
                abandoned(1);
                reserve_next(None).await
            }),
        )
        .await
        .expect("decided at once, not waiting on itself");
        let Err(LlmError::BudgetExhausted(why)) = refused else { panic!("100 tokens do not fit in the 50 left") };
        assert!(why.message.contains("given up on"), "{}", why.message);
        assert_eq!((budget.held().tokens, budget.spent_tokens()), (0, 100));
    }

    #[tokio::test]
    async fn without_a_ledger_or_a_limit_nothing_is_reserved_and_spend_is_still_counted() {
        reserve_next(None).await.unwrap();
        abandoned(3);
        let budget = Budget::new(Limits::default());
        let first = budget.reserve(Cost::new(100, 0)).await.unwrap();
        let ledger = Ledger::new(Some(budget.clone()), Cost::new(100, 0), one(100), Some(first));
        scope(ledger.clone(), async {
            abandoned(2);
            duplicated(1);
            reserve_next(None).await.unwrap();
        })
        .await;
        assert_eq!((ledger.abandoned(), ledger.duplicates()), (2, 1));
        assert_eq!((budget.held().tokens, budget.spent_tokens()), (100, 200), "an unlimited budget counts it");
    }
}
