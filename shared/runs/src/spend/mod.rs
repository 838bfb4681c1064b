//! Spend per model backend and UTC day, and the daily spend caps (`backends.<name>.daily_spend_usd`).
//!
//! Every stage call's usage carries its priced cost by backend (`Usage.cost_by_backend`, priced
//! where the model is called). The gateway adds it to the run store's `spend` table, one row per
//! (UTC day, backend), atomically with every other gateway sharing the store, and learns the
//! day's total from the same statement. With a cap on a backend:
//! - a new run that uses the backend (the configured phases route to it, or the request names it
//!   in a model spec) is refused with RESOURCE_EXHAUSTED naming the backend and the cap once the
//!   day's total reached it;
//! - a running run that uses it gets the cap's remainder as a ceiling on its budget, lowered after
//!   every charge with the total the store returned (so spend by other gateways counts too): the
//!   remainder travels with each stage call like a budget, and once it is spent no new model call
//!   starts and the run ends as at the end of a budget.
//!
//! The count is of priced calls: a call whose model has no price costs an unknown amount and is
//! not counted (a cap therefore needs the backend's price table).

mod backends;
mod caps;
mod hold;
#[cfg(test)]
mod tests;

pub use caps::SpendCaps;
