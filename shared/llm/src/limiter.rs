//! An adaptive concurrency limit for one backend (AIMD, after Netflix's concurrency-limits).
//!
//! A fixed cap is wrong both ways: a vLLM or OpenAI endpoint takes hundreds of requests at once, a
//! llama.cpp server with four slots takes four. The limit starts at `initial` and grows while the
//! calls actually fill it (at least half of it in flight): by one per answered call until the first
//! cut (slow start: it doubles each round trip), then by one per round of `limit` answered calls
//! (additive increase, as TCP Reno). It is cut multiplicatively when the backend says it is
//! overloaded: a rise in latency (a call class's short-term latency average at `latency_tolerance`
//! times or more its long-term one), or refusals (a 429 or 503, an attempt timing out; not a
//! connection that could not be made, which says the backend is down, not loaded) once they are the
//! majority of the recent answers (an average over about the last `limit` answers, at least
//! [`REFUSAL_WINDOW`]). A backend past its capacity refuses most of what it is sent; a minority of
//! refusals is what a backend with transient faults gives at any load, and cutting on each of them
//! would take the limit down to one slot (20% of 429s did, in a few hundred milliseconds) and
//! serialise every pipeline for no relief: those calls are retried, with backoff, and hedged. Cuts
//! are at most one per round trip (the smoothed latency of answered calls, at least `cut_interval`,
//! at most 2 s); later refusals of the same round each take one slot away (not below the calls
//! still in flight), so a fast 429 frees no slot for the next waiter to be refused in turn. `max`
//! is a hard cap, `min` a floor.
//!
//! **A server that queues** (llama.cpp's `llama-server` with its `--parallel` slots,
//! llama-cpp-python one call at a time, Ollama with `OLLAMA_NUM_PARALLEL`) refuses nothing: past
//! its slots it holds calls in a queue, and a call waits for those ahead of it. Its latency then
//! grows with the calls in flight when it was sent, by one service time per slot's worth of calls
//! ahead: `wait = ahead x S / k`. Each answered call is noted with the calls that were in flight
//! ahead of it and its wait (its latency over its class's fastest answer, the class's service time
//! without a queue); over the last [`QUEUE_WINDOW`] answers, when the wait follows the calls ahead
//! closely (correlation at least [`QUEUE_CORRELATION`], calls ahead spread over at least two
//! values, and at least twice the slots it gives in flight at once), the slope of that line is `S / k` and the server's slots are `k = S / slope`, with `S`
//! the mean service time of the answers in the window (Little's law for a FIFO server; the
//! estimate is the one Vegas-style limiters make from the least round trip, but from many answers at
//! once, so a call whose answer was long for its own reasons does not read as queueing). The limit
//! is then held at `k` rounded up (`k` or `k + 1`): every slot busy and at most one call waiting to
//! follow, so the server never
//! idles between calls and nothing waits longer than one service time (see [`queue_ceiling`]). A server that serves
//! everything at once (vLLM, a cloud API) shows no such line (its latency does not follow the calls
//! ahead) and keeps the AIMD limit. The estimate stands until a new line gives another, or the
//! calls with the most ahead find a slot free (see [`queue_model`]). [`AdaptiveLimit::server_slots`] reads it.
//!
//! Waiters queue on the limit (first come, first served through [`tokio::sync::Notify`]); a
//! dropped waiter leaves the queue. The current limit is logged when it changes by a tenth or
//! more and read with [`AdaptiveLimit::limit`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tracing::info;

/// Settings of an [`AdaptiveLimit`].
#[derive(Debug, Clone, PartialEq)]
pub struct LimitSettings {
    /// Calls in flight at the start.
    pub initial: usize,
    /// Lowest limit a cut reaches.
    pub min: usize,
    /// Hard cap.
    pub max: usize,
    /// Factor of a cut (0 < backoff < 1).
    pub backoff: f64,
    /// Short-term over long-term latency ratio that counts as overload.
    pub latency_tolerance: f64,
    /// Shortest time between two cuts (the round trip time is used when longer).
    pub cut_interval: Duration,
}

impl LimitSettings {
    /// Adaptive between 1 and `max`, starting at 64 (or `max` when lower).
    pub fn adaptive(max: usize) -> Self {
        let max = max.max(1);
        Self {
            initial: 64.min(max),
            min: 1,
            max,
            backoff: 0.75,
            latency_tolerance: 2.0,
            cut_interval: Duration::from_millis(5),
        }
    }

    /// A fixed limit (never grows nor shrinks).
    pub fn fixed(n: usize) -> Self {
        let n = n.max(1);
        Self { initial: n, min: n, max: n, ..Self::adaptive(n) }
    }
}

/// How a call under a permit ended, for the limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Signal {
    /// Answered in this time (any answer that is not an overload: also 4xx and unusable bodies).
    Answered(Duration),
    /// The backend is overloaded: 429, 503, an attempt timeout, a refused connection.
    Overloaded,
    /// Says nothing about load (cancelled, deadline reached before the answer).
    Ignore,
}

#[derive(Debug)]
struct Latency {
    short: f64,
    long: f64,
    samples: u32,
    /// The fastest answer of the class, seconds: its service time without a queue.
    fastest: f64,
}

/// One answered call for the queue model: calls in flight ahead of it when it was sent, its
/// latency over its class's fastest answer, and that fastest answer (seconds); when it was
/// answered, and whether it waited (half a call's share of the queue, `S / k` for the slots found
/// so far: every slot was taken when it came).
#[derive(Debug, Clone, Copy)]
struct Queued {
    ahead: f64,
    wait: f64,
    service: f64,
    at: Instant,
    busy: bool,
}

#[derive(Debug)]
struct State {
    limit: f64,
    in_flight: usize,
    last_cut: Option<Instant>,
    /// No cut yet: grow by one per answered call.
    slow_start: bool,
    /// Smoothed latency of answered calls, seconds.
    round_trip: f64,
    logged: usize,
    classes: HashMap<String, Latency>,
    /// Average share of refusals among recent answers (1 = refused, 0 = answered).
    refused: f64,
    /// The last [`QUEUE_WINDOW`] answers, for the queue model.
    queued: std::collections::VecDeque<Queued>,
    /// The server's slots, once its answers show that it queues (or it said so).
    slots: Option<f64>,
    /// The slots came from the server itself ([`AdaptiveLimit::report_slots`]): the queue model
    /// does not revise them.
    reported: bool,
    /// When the slots were last lowered for want of room ([`AdaptiveLimit::out_of_room`]).
    last_shrink: Option<Instant>,
}

/// Calls failing for want of room within this of a first one are the same event.
const SHRINK_EVERY: Duration = Duration::from_secs(2);
/// Classes whose latency is tracked at most; beyond it the table starts over.
const MAX_CLASSES: usize = 64;
/// Samples before a class's latency can signal overload.
const WARM_SAMPLES: u32 = 20;
/// Answers the refusal average spans at least: its weight is one over the larger of this and the
/// current limit, so the share is measured over about one limit's worth of answers. Over ten
/// answers, 30% of transient refusals crossed the majority every few seconds by chance (and a
/// start's fast refusals, all back before the first success, crossed it at once), each crossing
/// a cut: 64 slots fell to one in 30 s of a 50-problem debate. Over 50, the same share is more
/// than four standard deviations below the majority, so a limit that has come down does not
/// keep falling by chance.
pub const REFUSAL_WINDOW: f64 = 50.0;
/// Share of refusals among the recent answers above which a refusal cuts the limit.
const REFUSAL_MAJORITY: f64 = 0.5;
/// Answers the queue model looks at.
pub const QUEUE_WINDOW: usize = 64;
/// Answers the queue model needs before it says anything.
const QUEUE_MIN_ANSWERS: usize = 8;
/// Correlation between calls ahead and wait from which the wait is read as a queue. A FIFO
/// server's is above 0.95; a server that serves all at once, around 0.
pub const QUEUE_CORRELATION: f64 = 0.8;

/// The adaptive limit of one backend. Cheap to share behind an [`Arc`].
#[derive(Debug)]
pub struct AdaptiveLimit {
    name: String,
    settings: LimitSettings,
    state: Mutex<State>,
    freed: Notify,
}

/// A slot under the limit; give it its [`Signal`] with [`Permit::finish`], or drop it (counts as
/// [`Signal::Ignore`]).
#[derive(Debug)]
pub struct Permit {
    limit: Arc<AdaptiveLimit>,
    done: bool,
    /// Calls in flight when this one took its slot.
    ahead: usize,
}

impl AdaptiveLimit {
    pub fn new(name: impl Into<String>, settings: LimitSettings) -> Arc<Self> {
        let mut settings = settings;
        settings.max = settings.max.max(1);
        settings.min = settings.min.clamp(1, settings.max);
        settings.initial = settings.initial.clamp(settings.min, settings.max);
        let initial = settings.initial;
        Arc::new(Self {
            name: name.into(),
            settings,
            state: Mutex::new(State {
                limit: initial as f64,
                in_flight: 0,
                last_cut: None,
                slow_start: true,
                round_trip: 0.0,
                logged: initial,
                classes: HashMap::new(),
                refused: 0.0,
                queued: std::collections::VecDeque::with_capacity(QUEUE_WINDOW),
                slots: None,
                reported: false,
                last_shrink: None,
            }),
            freed: Notify::new(),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The current limit.
    pub fn limit(&self) -> usize {
        self.state().limit as usize
    }

    /// Calls holding a permit now.
    pub fn in_flight(&self) -> usize {
        self.state().in_flight
    }

    pub fn settings(&self) -> &LimitSettings {
        &self.settings
    }

    /// The server's slots as its answers show them, once they show a queue (see the module
    /// docs); `None` for a server that has shown none.
    pub fn server_slots(&self) -> Option<f64> {
        self.state().slots
    }

    /// The slots the server said it has ([`Self::report_slots`]), not those found from its answers.
    pub fn reported_slots(&self) -> Option<usize> {
        let s = self.state();
        s.slots.filter(|_| s.reported).map(|k| k as usize)
    }

    /// Whether the server has shown it serves at least `few` calls at once: it said so, or its
    /// answers have been read and show no queue (at least [`QUEUE_MIN_ANSWERS`] of them, sent
    /// with differing calls ahead, and no slots found). Until then a duplicate request could wait
    /// in the server's queue behind the one it duplicates.
    pub fn serves_at_once(&self, few: f64) -> bool {
        let s = self.state();
        match s.slots {
            Some(k) => k >= few,
            None => {
                let (least, most) =
                    s.queued.iter().fold((f64::MAX, f64::MIN), |(lo, hi), q| (lo.min(q.ahead), hi.max(q.ahead)));
                s.queued.len() >= QUEUE_MIN_ANSWERS && most - least >= 2.0
            }
        }
    }

    /// The server says it serves `slots` calls at once (llama.cpp's `/props` `total_slots`): the
    /// limit holds at that many (under the configured cap), and the queue model stops guessing.
    /// Refusals and timeouts still cut it.
    pub fn report_slots(&self, slots: usize) {
        let mut s = self.state();
        s.slots = Some(slots.max(1) as f64);
        s.reported = true;
        let ceiling = self.ceiling(&s);
        if s.limit > ceiling {
            s.limit = ceiling;
        }
        s.slow_start = false;
        info!(backend = %self.name, server_slots = slots, concurrency_limit = s.limit as usize,
              "the server says how many calls it serves at once");
    }

    /// The server ran out of room for the calls it served at once: llama.cpp's `llama-server`
    /// fails every call in service with a 500 "Context size has been exceeded" when their
    /// sequences outgrow the one KV cache its slots share (at its defaults: four slots in the
    /// model's context). The server is held to one slot fewer than it had (said or found), at
    /// least one; the calls that failed together are one event ([`SHRINK_EVERY`]). The new count
    /// when it was lowered.
    pub fn out_of_room(&self) -> Option<usize> {
        let mut s = self.state();
        let now = Instant::now();
        if s.last_shrink.is_some_and(|t| now.duration_since(t) < SHRINK_EVERY) {
            return None;
        }
        let k = (s.slots.unwrap_or(s.limit).floor() as usize).max(1);
        if k <= 1 {
            return None;
        }
        s.last_shrink = Some(now);
        s.slots = Some((k - 1) as f64);
        s.reported = true;
        let ceiling = self.ceiling(&s);
        if s.limit > ceiling {
            s.limit = ceiling;
        }
        tracing::warn!(backend = %self.name, server_slots = k - 1, concurrency_limit = s.limit as usize,
                       "the server ran out of room for the calls it served at once: holding it to one fewer");
        Some(k - 1)
    }

    /// The highest the limit may go now: the cap, or one past the server's slots once known.
    fn ceiling(&self, s: &State) -> f64 {
        let cap = self.settings.max as f64;
        s.slots.map_or(cap, |k| queue_ceiling(k).min(cap).max(self.settings.min as f64))
    }

    /// Wait for a slot.
    pub async fn acquire(self: &Arc<Self>) -> Permit {
        loop {
            let notified = self.freed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = self.state();
                if s.in_flight < s.limit as usize {
                    let ahead = s.in_flight;
                    s.in_flight += 1;
                    return Permit { limit: Arc::clone(self), done: false, ahead };
                }
            }
            notified.await;
        }
    }

    /// A slot if one is free now (a hedged duplicate takes one only then: it never queues, so
    /// hedging cannot add load to a backend already at its limit).
    pub fn try_acquire(self: &Arc<Self>) -> Option<Permit> {
        let mut s = self.state();
        (s.in_flight < s.limit as usize).then(|| {
            let ahead = s.in_flight;
            s.in_flight += 1;
            Permit { limit: Arc::clone(self), done: false, ahead }
        })
    }

    fn release(&self, class: Option<&str>, signal: Signal, ahead: usize) {
        let mut s = self.state();
        let filled = s.in_flight as f64 >= s.limit / 2.0;
        s.in_flight = s.in_flight.saturating_sub(1);
        let now = Instant::now();
        if let Signal::Answered(latency) = signal {
            let x = latency.as_secs_f64();
            s.round_trip = if s.round_trip == 0.0 { x } else { s.round_trip + 0.1 * (x - s.round_trip) };
        }
        let overloaded = match signal {
            Signal::Overloaded => {
                let weight = 1.0 / s.limit.max(REFUSAL_WINDOW);
                s.refused += weight * (1.0 - s.refused);
                s.refused > REFUSAL_MAJORITY
            }
            Signal::Answered(latency) => {
                s.refused -= s.refused / s.limit.max(REFUSAL_WINDOW);
                class.is_some_and(|c| self.latency_rose(&mut s, c, latency, ahead))
            }
            Signal::Ignore => false,
        };
        if overloaded {
            tracing::debug!(backend = %self.name, ?signal, refused = s.refused, class, "overload signal");
        }
        let before = s.limit;
        if overloaded {
            let round = Duration::from_secs_f64(s.round_trip.min(2.0)).max(self.settings.cut_interval);
            if s.last_cut.is_none_or(|t| now.duration_since(t) >= round) {
                s.limit = (s.limit * self.settings.backoff).max(self.settings.min as f64);
                s.last_cut = Some(now);
                s.slow_start = false;
            } else {
                // Later refusals of the same round take their slot with them (down to what is
                // still in flight), so fast 429s do not admit the next waiter only to be refused.
                s.limit = (s.limit - 1.0).max(s.in_flight as f64).max(self.settings.min as f64);
            }
        } else if matches!(signal, Signal::Answered(_)) && filled {
            let step = if s.slow_start { 1.0 } else { 1.0 / s.limit };
            s.limit = (s.limit + step).min(self.settings.max as f64);
        }
        // A server that queues: never more than one call waiting at it.
        let ceiling = self.ceiling(&s);
        if s.limit > ceiling {
            s.limit = ceiling;
            s.slow_start = false;
        }
        let (limit, logged) = (s.limit as usize, s.logged);
        if limit.abs_diff(logged) * 10 >= logged.max(1) && limit != logged {
            s.logged = limit;
            info!(backend = %self.name, concurrency_limit = limit, in_flight = s.in_flight, "concurrency limit changed");
        }
        drop(s);
        // One freed slot wakes one waiter; a raised limit may admit more.
        if limit > before as usize {
            self.freed.notify_waiters();
        } else {
            self.freed.notify_one();
        }
    }

    /// Note a latency of a call sent with `ahead` calls in flight; whether the class's short-term
    /// average has risen to the tolerance. Feeds the queue model.
    fn latency_rose(&self, s: &mut State, class: &str, latency: Duration, ahead: usize) -> bool {
        if !s.classes.contains_key(class) && s.classes.len() >= MAX_CLASSES {
            s.classes.clear();
        }
        let x = latency.as_secs_f64();
        let l = s.classes.entry(class.to_owned()).or_insert(Latency { short: x, long: x, samples: 0, fastest: x });
        l.samples = l.samples.saturating_add(1);
        l.short += 0.2 * (x - l.short);
        l.long += 0.02 * (x - l.long);
        l.fastest = l.fastest.min(x);
        let rose = l.samples >= WARM_SAMPLES && l.long > 0.0 && l.short >= self.settings.latency_tolerance * l.long;
        let service = l.fastest;
        if s.queued.len() == QUEUE_WINDOW {
            s.queued.pop_front();
        }
        // It waited: every slot was taken when it came.
        let busy = s.slots.is_some_and(|k| x - service > 0.5 * service / k);
        let at = Instant::now();
        s.queued.push_back(Queued { ahead: ahead as f64, wait: x - service, service, at, busy });
        if let Some(found) = queue_model(&s.queued, s.slots).filter(|_| !s.reported) {
            if s.slots.map(queue_ceiling) != Some(queue_ceiling(found)) {
                info!(backend = %self.name, server_slots = found, concurrency_limit = queue_ceiling(found),
                      "the server's answers show how many calls it serves at once");
            }
            if s.slots.is_some_and(|k| found > k + 0.4) {
                // Grown by one at the top: the queue seen so far is stale.
                s.queued.clear();
            }
            s.slots = Some(found);
        }
        rose
    }
}

/// The limit for a server found to have `k` slots: `k` rounded up. The estimate runs above the
/// slots by the share of an answer's time that is not the server's (the client's own work and the
/// connection, in the fastest answer taken as the service time), so rounded up it is the slots or
/// one more: every slot busy, and at most one call waiting to follow.
fn queue_ceiling(k: f64) -> f64 {
    (k - 0.05).ceil().max(1.0)
}

/// What the answers in the window say about the server's slots, `current` the estimate so far:
/// a new estimate, or `None` to keep it. A line of wait against calls ahead (see the module docs)
/// gives one. Once the limit holds the calls ahead below the slots found, no line shows any more
/// (below its slots a server does not queue); then the calls sent with the most ahead say whether
/// they still found a slot free: when none of them waited half a call's share of the queue
/// (`S / k`), the server has another slot, and the estimate grows to let one more call in. So an estimate that came out low
/// recovers, and one that is right stays (at `k` calls ahead, calls wait for the next answer).
fn queue_model(window: &std::collections::VecDeque<Queued>, current: Option<f64>) -> Option<f64> {
    let n = window.len() as f64;
    if window.len() < QUEUE_MIN_ANSWERS {
        return None;
    }
    let mean = |f: fn(&Queued) -> f64| window.iter().map(f).sum::<f64>() / n;
    let (mx, my, service) = (mean(|q| q.ahead), mean(|q| q.wait), mean(|q| q.service));
    // Kept busy over the window (every call in it waited), the server answers `k / S` calls
    // a second (Little's law):
    // once a queue has been seen, that rate gives the slots whatever the order calls were sent
    // in (the line of wait against calls ahead is steeper in a burst sent at once than in a
    // steady flow, and over a window holding both it gave 19.6 slots for 16).
    if current.is_some() && window.len() >= QUEUE_WINDOW / 2 && window.iter().all(|q| q.busy) {
        let (first, last) = (window.front()?.at, window.back()?.at);
        let span = last.duration_since(first).as_secs_f64();
        if span > 0.0 && service > 0.0 {
            return Some((service * (n - 1.0) / span).max(1.0));
        }
    }
    let (mut sxx, mut syy, mut sxy) = (0.0, 0.0, 0.0);
    let (mut least, mut most) = (f64::MAX, f64::MIN);
    for q in window {
        let (dx, dy) = (q.ahead - mx, q.wait - my);
        sxx += dx * dx;
        syy += dy * dy;
        sxy += dx * dy;
        least = least.min(q.ahead);
        most = most.max(q.ahead);
    }
    if most - least >= 2.0 && sxx > 0.0 && syy > 0.0 && sxy > 0.0 && service > 0.0 {
        let r = sxy / (sxx * syy).sqrt();
        let slope = sxy / sxx;
        let k = (service / slope).max(1.0);
        // A queue, not a slowdown: at least twice the slots found were in flight at once, and
        // the line meets zero wait near the slots (a server with k slots keeps k - 1 calls ahead
        // from waiting at all: wait = (ahead + 1 - k) S / k). A client short of CPU (or a server
        // slowing under load) answers later the more it has in flight, from the first call on:
        // its line meets zero wait near no call ahead, whatever slots its slope makes up.
        let meets_zero = mx - my / slope;
        if r >= QUEUE_CORRELATION && k <= most / 2.0 && meets_zero >= (k - 1.0) / 2.0 - 0.5 {
            return Some(k);
        }
    }
    let k = current?;
    let top: Vec<f64> = window.iter().filter(|q| q.ahead >= most).map(|q| q.wait).collect();
    let full = most + 1.0 >= queue_ceiling(k);
    let free = top.iter().all(|wait| *wait < 0.5 * service / k);
    // Half way to the next slot: the limit rounds it up, one more than before.
    (full && top.len() >= QUEUE_MIN_ANSWERS && free).then_some(queue_ceiling(k) + 0.5)
}

impl Permit {
    /// Release the slot with how the call went, for class `class` (latency is compared within a
    /// class: an embedding call is not a long generation).
    pub fn finish(mut self, class: &str, signal: Signal) {
        self.done = true;
        self.limit.release(Some(class), signal, self.ahead);
    }

    /// Calls that were in flight when this one took its slot.
    pub fn ahead(&self) -> usize {
        self.ahead
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.done {
            self.limit.release(None, Signal::Ignore, self.ahead);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quick(initial: usize, max: usize) -> LimitSettings {
        LimitSettings { initial, max, cut_interval: Duration::ZERO, ..LimitSettings::adaptive(max) }
    }

    /// A window of answers with `ahead` calls ahead each and the wait `wait(ahead)`, service 50 ms.
    fn window(wait: impl Fn(f64) -> f64) -> std::collections::VecDeque<Queued> {
        let at = Instant::now();
        (0..64)
            .map(|i| {
                let ahead = f64::from(i);
                Queued { ahead, wait: wait(ahead), service: 0.05, at, busy: false }
            })
            .collect()
    }

    #[test]
    fn a_queue_is_told_from_a_client_short_of_cpu() {
        // A FIFO server with 16 slots: no wait until the slots are taken, then a sixteenth of a
        // service time per call ahead.
        let fifo = window(|ahead| (ahead - 15.0).max(0.0) * 0.05 / 16.0);
        let k = queue_model(&fifo, None).expect("a queue");
        assert!((14.0..20.0).contains(&k), "{k}");
        let one = window(|ahead| ahead * 0.05);
        assert!(queue_model(&one, None).is_some_and(|k| (k - 1.0).abs() < 0.1), "one slot");
        // A client short of CPU: every call in flight slows every answer a little, from the first
        // (2 ms a call: its slope would make 25 slots of it).
        let starved = window(|ahead| ahead * 0.002);
        assert_eq!(queue_model(&starved, None), None);
    }

    #[tokio::test]
    async fn admits_up_to_the_limit_and_queues_the_rest() {
        let limit = AdaptiveLimit::new("t", LimitSettings::fixed(2));
        let a = limit.acquire().await;
        let _b = limit.acquire().await;
        let waiting = tokio::spawn({
            let limit = Arc::clone(&limit);
            async move { limit.acquire().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        assert_eq!(limit.in_flight(), 2);
        a.finish("c", Signal::Answered(Duration::from_millis(5)));
        let c = waiting.await.expect("the waiter gets the freed slot");
        assert_eq!(limit.in_flight(), 2);
        drop(c);
        assert_eq!(limit.in_flight(), 1);
        assert_eq!(limit.limit(), 2, "a fixed limit never moves");
    }

    #[tokio::test]
    async fn grows_while_filled_and_cuts_on_overload_down_to_the_floor() {
        // Instant answers: the round trip does not space the cuts out.
        let limit = AdaptiveLimit::new("t", quick(4, 8));
        for _ in 0..200 {
            let permits: Vec<Permit> = futures_lite_join(&limit, limit.limit()).await;
            for p in permits {
                p.finish("c", Signal::Answered(Duration::ZERO));
            }
        }
        assert_eq!(limit.limit(), 8, "grows to the cap, never past it");
        limit.acquire().await.finish("c", Signal::Overloaded);
        assert_eq!(limit.limit(), 8, "one refusal among answers is no overload");
        // Refusals only, averaged over 50 answers (the limit is smaller): the majority of the
        // recent answers from the 35th (1 - 0.98^35 > 0.5).
        for _ in 0..33 {
            limit.acquire().await.finish("c", Signal::Overloaded);
        }
        assert_eq!(limit.limit(), 8);
        limit.acquire().await.finish("c", Signal::Overloaded);
        assert_eq!(limit.limit(), 6);
        for _ in 0..40 {
            limit.acquire().await.finish("c", Signal::Overloaded);
        }
        assert_eq!(limit.limit(), 1, "the floor");
    }

    #[tokio::test]
    async fn doubles_per_round_until_the_first_cut_then_grows_by_one_per_round() {
        let limit = AdaptiveLimit::new("t", quick(8, 1000));
        let round = |limit: Arc<AdaptiveLimit>| async move {
            let permits = futures_lite_join(&limit, limit.limit()).await;
            for p in permits {
                p.finish("c", Signal::Answered(Duration::ZERO));
            }
        };
        round(limit.clone()).await;
        // Answers count while at least half the limit is in flight: 8 of 8, 7 of 9, 6 of 10 (a
        // round that keeps the limit full, as a busy client does, doubles it).
        assert_eq!(limit.limit(), 8 + 3);
        while limit.limit() == 8 + 3 {
            limit.acquire().await.finish("c", Signal::Overloaded);
        }
        let cut = limit.limit();
        round(limit.clone()).await;
        assert!(limit.limit() <= cut + 1, "after a cut: about one per round, {cut} -> {}", limit.limit());
    }

    #[tokio::test]
    async fn does_not_grow_while_the_limit_is_not_used() {
        let limit = AdaptiveLimit::new("t", quick(10, 100));
        for _ in 0..500 {
            limit.acquire().await.finish("c", Signal::Answered(Duration::from_millis(10)));
        }
        assert_eq!(limit.limit(), 10);
    }

    #[tokio::test]
    async fn a_latency_rise_in_a_class_cuts_but_a_slow_class_of_its_own_does_not() {
        let limit = AdaptiveLimit::new("t", quick(10, 100));
        for _ in 0..30 {
            limit.acquire().await.finish("fast", Signal::Answered(Duration::from_millis(10)));
            limit.acquire().await.finish("slow", Signal::Answered(Duration::from_millis(900)));
        }
        assert_eq!(limit.limit(), 10, "steady latencies, however different per class, are no signal");
        for _ in 0..5 {
            limit.acquire().await.finish("fast", Signal::Answered(Duration::from_millis(80)));
        }
        assert!(limit.limit() < 10, "the fast class slowed eightfold: {}", limit.limit());
    }

    #[tokio::test]
    async fn cuts_at_most_once_per_interval() {
        let limit = AdaptiveLimit::new(
            "t",
            LimitSettings { cut_interval: Duration::from_secs(60), ..LimitSettings::adaptive(64) },
        );
        for _ in 0..50 {
            limit.acquire().await.finish("c", Signal::Overloaded);
        }
        // Averaged over the limit's 64 answers, the 45th refusal makes them the majority
        // (1 - (63/64)^45 > 0.5): a cut, then one slot per further refusal.
        assert_eq!(limit.limit(), 48 - 5, "one multiplicative cut a round, then one slot per failure");
    }

    #[tokio::test]
    async fn refusals_cut_only_as_the_majority_of_recent_answers() {
        // Transient faults at any load: one answer in four refused, in a steady mix. The limit
        // stays where it is (it used to fall to the floor within a few rounds).
        let limit = AdaptiveLimit::new("t", quick(16, 16));
        for i in 0..400 {
            let signal = if i % 4 == 0 { Signal::Overloaded } else { Signal::Answered(Duration::from_millis(5)) };
            limit.acquire().await.finish("c", signal);
        }
        assert_eq!(limit.limit(), 16, "a minority of refusals is no overload");
        // Past capacity: two refusals in three. Cut, round after round.
        for i in 0..120 {
            let signal = if i % 3 == 0 { Signal::Answered(Duration::from_millis(5)) } else { Signal::Overloaded };
            limit.acquire().await.finish("c", signal);
        }
        assert!(limit.limit() <= 4, "mostly refused: the limit comes down, to {}", limit.limit());
    }

    #[tokio::test]
    async fn transient_refusals_at_a_high_limit_never_cut_it_not_even_their_first_burst() {
        // 64 calls go out; the 30% refused come back at once, before any success (a start's burst),
        // then answers arrive in a random mix with 30% refusals. Over the last ten answers both
        // made a majority by chance (64 slots fell to one within 30 s of a 50-problem debate).
        let limit = AdaptiveLimit::new("t", quick(64, 64));
        for _ in 0..19 {
            limit.acquire().await.finish("c", Signal::Overloaded);
        }
        assert_eq!(limit.limit(), 64, "the first burst of fast refusals is no overload");
        let mut state = 7u64;
        for _ in 0..5000 {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let refused = (state >> 33) % 100 < 30;
            let signal = if refused { Signal::Overloaded } else { Signal::Answered(Duration::from_millis(5)) };
            limit.acquire().await.finish("c", signal);
        }
        assert_eq!(limit.limit(), 64, "30% of refusals in a random mix is no overload");
    }

    #[tokio::test]
    async fn a_dropped_waiter_leaves_the_queue() {
        let limit = AdaptiveLimit::new("t", LimitSettings::fixed(1));
        let held = limit.acquire().await;
        let gave_up = tokio::time::timeout(Duration::from_millis(10), limit.acquire()).await;
        assert!(gave_up.is_err());
        drop(held);
        let again = tokio::time::timeout(Duration::from_secs(5), limit.acquire()).await;
        assert!(again.is_ok(), "the slot was not lost to the waiter that left");
    }

    async fn futures_lite_join(limit: &Arc<AdaptiveLimit>, n: usize) -> Vec<Permit> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(limit.acquire().await);
        }
        out
    }
}
