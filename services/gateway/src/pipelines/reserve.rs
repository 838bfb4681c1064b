//! How much work a budget lets be in flight ([`Reserve`]), shared by the pipelines that start
//! units of work (records, debate problems) while their run's budget can still pay for them.

/// How many records a budget lets be in flight: what is left of it over the mean cost of a scored
/// record, so the calls started never owe much more than is left (the overshoot is then about one
/// record's cost, however many the gateway could score at once). Before any record was scored,
/// [`Reserve::starting`]'s number at a time (4 records, 1 debate problem).
#[derive(Debug)]
pub(crate) struct Reserve {
    /// Units of work (records, problems) in flight before any was measured.
    first: usize,
    scored: u64,
    tokens: u64,
    usd: f64,
}

impl Default for Reserve {
    fn default() -> Self {
        Self::starting(4)
    }
}

impl Reserve {
    /// `first` units at a time until one was measured.
    pub(crate) fn starting(first: usize) -> Self {
        Reserve { first: first.max(1), scored: 0, tokens: 0, usd: 0.0 }
    }

    pub(crate) fn add(&mut self, usage: &assay_domain::Usage) {
        self.scored += 1;
        self.tokens += usage.tokens();
        self.usd += usage.cost_usd;
    }

    /// What a record's work cost besides its scoring (answering it, with responders).
    pub(crate) fn charge(&mut self, usage: &assay_domain::Usage) {
        self.tokens += usage.tokens();
        self.usd += usage.cost_usd;
    }

    pub(crate) fn in_flight(&self, left: &assay_budget::Limits) -> usize {
        if self.scored == 0 {
            return self.first;
        }
        let n = self.scored as f64;
        let fits = |left: f64, spent: f64| if spent > 0.0 { left / (spent / n) } else { f64::INFINITY };
        let by_tokens = left.max_tokens.map_or(f64::INFINITY, |t| fits(t as f64, self.tokens as f64));
        let by_usd = left.max_cost_usd.map_or(f64::INFINITY, |u| fits(u, self.usd));
        let fit = by_tokens.min(by_usd);
        if fit.is_finite() { (fit.ceil() as usize).max(1) } else { usize::MAX }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(tokens: u64, usd: f64) -> assay_domain::Usage {
        assay_domain::Usage { calls: 1, prompt_tokens: tokens, cost_usd: usd, ..Default::default() }
    }

    #[test]
    fn a_budget_lets_as_many_records_fly_as_it_still_pays_for() {
        let mut r = Reserve::default();
        let tokens = |t| assay_budget::Limits { max_tokens: Some(t), max_cost_usd: None };
        assert_eq!(r.in_flight(&tokens(1_000_000)), 4, "nothing known yet");
        r.add(&usage(100, 0.001));
        r.add(&usage(120, 0.001));
        assert_eq!(r.in_flight(&tokens(1_100)), 10, "1,100 tokens left at 110 a record");
        assert_eq!(r.in_flight(&tokens(1_101)), 11, "a part of a record left starts one more");
        assert_eq!(r.in_flight(&tokens(0)), 1, "the budget's own check stops the last one");
        let both = assay_budget::Limits { max_tokens: Some(1_100), max_cost_usd: Some(0.003) };
        assert_eq!(r.in_flight(&both), 3, "the tighter limit decides");
        assert_eq!(r.in_flight(&assay_budget::Limits::default()), usize::MAX, "no limit");
        let mut free = Reserve::default();
        free.add(&usage(100, 0.0));
        let dollars = assay_budget::Limits { max_tokens: None, max_cost_usd: Some(1.0) };
        assert_eq!(free.in_flight(&dollars), usize::MAX, "records that cost nothing are not limited by dollars");
    }
}
