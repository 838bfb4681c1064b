use std::time::Duration;

use super::*;

fn usage(tokens: u64, cost: f64, unpriced: u32) -> Usage {
    Usage { calls: 1, prompt_tokens: tokens, cost_usd: cost, unpriced_calls: unpriced, ..Usage::default() }
}

fn tokens(t: u64) -> Cost {
    Cost::new(t, 0)
}

#[test]
fn tokens_and_dollars_run_out_and_say_so() {
    let b = Budget::new(Limits { max_tokens: Some(100), max_cost_usd: Some(0.01) });
    b.charge(&usage(60, 0.004, 0));
    assert_eq!(b.exhausted(), None);
    assert_eq!(b.remaining().max_tokens, Some(40));
    assert!((b.remaining().max_cost_usd.unwrap() - 0.006).abs() < 1e-9);
    b.charge(&usage(50, 0.001, 0));
    assert_eq!(b.exhausted().unwrap(), "budget exhausted: 110 of 100 tokens used");
    assert_eq!(b.remaining().max_tokens, Some(0));
    let c = Budget::new(Limits { max_tokens: None, max_cost_usd: Some(0.01) });
    c.charge(&usage(10, 0.02, 0));
    assert!(c.exhausted().unwrap().contains("$0.0200 of $0.0100"));
}

#[test]
fn an_unpriced_call_stops_a_cost_budget_but_not_a_token_budget() {
    let cost = Budget::new(Limits { max_tokens: None, max_cost_usd: Some(1.0) });
    cost.charge(&usage(10, 0.0, 1));
    assert!(cost.exhausted().unwrap().contains("without a price"));
    assert_eq!(cost.exhaustion().unwrap().cause, Exhaustion::Unpriced);
    let tokens = Budget::new(Limits { max_tokens: Some(1000), max_cost_usd: None });
    tokens.charge(&usage(10, 0.0, 1));
    assert_eq!(tokens.exhausted(), None);
}

#[test]
fn headers_round_trip() {
    let l = Limits { max_tokens: Some(1234), max_cost_usd: Some(0.5) };
    let h = l.headers();
    let get = |k: &str| h.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
    assert_eq!(Limits::from_headers(get(TOKENS_HEADER), get(USD_HEADER)), l);
    assert_eq!(Limits::from_headers(None, Some("x")), Limits::default());
    assert_eq!(Limits::from_headers(None, Some("-1")).max_cost_usd, Some(0.0));
    assert_eq!(Cost::from_header(&Cost::new(12, 34).header_value()), Some(Cost::new(12, 34)));
    assert_eq!(Cost::from_header("12"), None);
}

#[test]
fn a_ceiling_caps_what_is_left_and_stops_the_work_with_its_reason() {
    let b = Budget::new(Limits { max_tokens: None, max_cost_usd: Some(1.0) });
    b.charge(&usage(10, 0.25, 0));
    b.set_ceiling(0.5, "backend openai reached its daily spend cap".into());
    assert!((b.remaining().max_cost_usd.unwrap() - 0.5).abs() < 1e-9, "{:?}", b.remaining());
    b.charge(&usage(10, 0.3, 0));
    assert!((b.remaining().max_cost_usd.unwrap() - 0.2).abs() < 1e-9, "own limit 0.45, ceiling 0.2");
    assert_eq!(b.exhausted(), None);
    b.charge(&usage(10, 0.2, 0));
    assert_eq!(b.exhausted().unwrap(), "budget exhausted: backend openai reached its daily spend cap");
    assert_eq!(b.remaining().max_cost_usd, Some(0.0));
    let c = Budget::new(Limits::default());
    assert_eq!(c.remaining().max_cost_usd, None);
    assert!(!c.is_limited());
    c.set_ceiling(0.0, "spent".into());
    assert!(c.exhausted().is_some());
    assert!(c.is_limited());
    c.set_ceiling(2.0, "cap".into());
    assert_eq!((c.exhausted(), c.remaining().max_cost_usd), (None, Some(2.0)));
}

#[tokio::test]
async fn a_reservation_that_can_never_fit_is_refused_and_says_what_it_needed() {
    let b = Budget::new(Limits { max_tokens: Some(1_000), max_cost_usd: None });
    b.charge(&usage(300, 0.0, 0));
    let e = b.reserve(tokens(800)).await.unwrap_err();
    assert_eq!(e.cause, Exhaustion::Spent);
    assert!(e.message.starts_with("budget exhausted: a call needs up to 800 tokens"), "{e}");
    assert!(e.message.contains("700 of 1000 tokens"), "{e}");
    assert_eq!(b.refused_need().map(|c| c.tokens), Some(1_100), "spent 300 + the call's 800");
    // Nothing was held by the refusal.
    assert_eq!(b.held(), Cost::default());
    let h = b.reserve(tokens(700)).await.unwrap();
    assert_eq!(b.remaining().max_tokens, Some(0));
    h.settle(&usage(500, 0.0, 0));
    assert_eq!((b.spent_tokens(), b.held().tokens, b.remaining().max_tokens), (800, 0, Some(200)));
}

#[tokio::test]
async fn a_reservation_waits_for_holds_to_give_money_back() {
    let b = Budget::new(Limits { max_tokens: Some(1_000), max_cost_usd: None });
    let first = b.reserve(tokens(800)).await.unwrap();
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.reserve(tokens(500)).await.map(|h| h.cost()) })
    };
    // The waiter cannot get its 500 while 800 are held.
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished());
    // The first call spent 300 of its 800: 700 are left, the waiter fits.
    first.settle(&usage(300, 0.0, 0));
    let got = tokio::time::timeout(Duration::from_secs(5), waiter).await.unwrap().unwrap().unwrap();
    assert_eq!(got, tokens(500));
}

#[tokio::test]
async fn a_waiting_reservation_is_refused_once_the_holds_were_spent() {
    let b = Budget::new(Limits { max_tokens: Some(1_000), max_cost_usd: None });
    let first = b.reserve(tokens(800)).await.unwrap();
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.reserve(tokens(500)).await.map(|h| h.cost()) })
    };
    tokio::task::yield_now().await;
    first.settle(&usage(800, 0.0, 0));
    let e = tokio::time::timeout(Duration::from_secs(5), waiter).await.unwrap().unwrap().unwrap_err();
    assert!(e.message.contains("needs up to 500 tokens, 200 of 1000 tokens left"), "{e}");
}

#[tokio::test]
async fn a_hundred_calls_cancelled_mid_flight_leave_the_budget_whole() {
    let b = Budget::new(Limits { max_tokens: Some(100_000), max_cost_usd: Some(10.0) });
    let calls: Vec<_> = (0..100)
        .map(|_| {
            let b = b.clone();
            tokio::spawn(async move {
                let _hold = b.reserve(Cost::new(1_000, nano_of(0.1))).await.unwrap();
                // The call "in flight": never answers.
                std::future::pending::<()>().await;
            })
        })
        .collect();
    // Every reservation is made: the budget is fully held.
    for _ in 0..100 {
        if b.held().tokens == 100_000 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(b.held(), Cost::new(100_000, nano_of(10.0)));
    assert_eq!(b.remaining().max_tokens, Some(0));
    for c in &calls {
        c.abort();
    }
    for c in calls {
        assert!(c.await.unwrap_err().is_cancelled());
    }
    assert_eq!(b.held(), Cost::default());
    assert_eq!(b.spent_tokens(), 0);
    assert_eq!(b.remaining(), Limits { max_tokens: Some(100_000), max_cost_usd: Some(10.0) });
    // And the whole budget can be reserved again.
    let again = b.reserve(Cost::new(100_000, nano_of(10.0))).await.unwrap();
    assert_eq!(again.cost().tokens, 100_000);
}

#[tokio::test]
async fn concurrent_reservations_never_commit_more_than_the_limit() {
    let b = Budget::new(Limits { max_tokens: None, max_cost_usd: Some(1.0) });
    // 200 calls of worst case $0.03 that each spend $0.02.
    let calls: Vec<_> = (0..200)
        .map(|_| {
            let b = b.clone();
            tokio::spawn(async move {
                let hold = b.reserve(Cost::new(0, nano_of(0.03))).await?;
                tokio::task::yield_now().await;
                hold.settle(&usage(10, 0.02, 0));
                Ok::<_, BudgetRefusal>(())
            })
        })
        .collect();
    let mut served = 0;
    for c in calls {
        if c.await.unwrap().is_ok() {
            served += 1;
        }
    }
    assert!(b.spent_usd() <= 1.0 + 1e-9, "{}", b.spent_usd());
    // Every call that could fit did: $1.00 at $0.02 leaves less than one worst case at the end.
    assert!(b.spent_usd() > 1.0 - 0.03 - 1e-9, "{} after {served} calls", b.spent_usd());
}

#[tokio::test]
async fn a_slice_takes_what_is_free_up_to_its_want_and_shrinks() {
    let b = Budget::new(Limits { max_tokens: Some(1_000), max_cost_usd: None });
    let mut a = b.reserve_up_to(tokens(1), tokens(600)).await.unwrap();
    assert_eq!(a.cost().tokens, 600);
    let c = b.reserve_up_to(tokens(1), tokens(600)).await.unwrap();
    assert_eq!(c.cost().tokens, 400, "what is free");
    assert_eq!(b.slice_limits(c.cost()), Limits { max_tokens: Some(400), max_cost_usd: None });
    a.shrink(tokens(100));
    assert_eq!(b.free().tokens, 500);
    drop(c);
    assert_eq!(b.free().tokens, 900);
}

#[tokio::test]
async fn an_unpriced_reservation_is_refused_under_a_dollar_limit_only() {
    let unpriced = Cost { tokens: 10, nano_usd: 0, unpriced: true };
    let dollars = Budget::new(Limits { max_tokens: None, max_cost_usd: Some(1.0) });
    let e = dollars.reserve(unpriced).await.unwrap_err();
    assert_eq!(e.cause, Exhaustion::Unpriced);
    assert!(e.message.contains("no price"), "{e}");
    let capped = Budget::new(Limits::default());
    capped.set_ceiling(5.0, "cap".into());
    assert_eq!(capped.reserve(unpriced).await.unwrap_err().cause, Exhaustion::Unpriced);
    let toks = Budget::new(Limits { max_tokens: Some(100), max_cost_usd: None });
    assert!(toks.reserve(unpriced).await.is_ok());
}

#[tokio::test]
async fn current_is_the_scoped_budget() {
    assert!(current().is_none());
    let b = Budget::new(Limits { max_tokens: Some(5), max_cost_usd: None });
    let seen = scope(b.clone(), async { current().map(|c| Arc::ptr_eq(&c, &b)) }).await;
    assert_eq!(seen, Some(true));
}

#[test]
fn a_stopped_budget_keeps_the_first_refusal_and_its_cause() {
    let b = Budget::new(Limits { max_tokens: Some(100), max_cost_usd: None });
    assert_eq!(b.exhaustion(), None);
    b.stop(unpriced_model(Some(("m", "openai"))));
    b.stop(BudgetRefusal::spent("budget exhausted: later"));
    let r = b.exhaustion().unwrap();
    assert_eq!(r.cause, Exhaustion::Unpriced);
    assert_eq!(
        r.message,
        "budget exhausted: model \"m\" of backend openai has no price, so the cost limit cannot be kept (configure \
         backends.openai.prices for it)"
    );
    assert_eq!(b.stopped(), Some(r.message.clone()));
    assert_eq!(b.exhausted(), Some(r.message));
}

#[test]
fn the_largest_need_of_any_kind_is_known_once_one_was_measured() {
    let b = Budget::new(Limits::default());
    assert_eq!(b.largest_learned(), None);
    b.learn("score", Cost::new(100, 7));
    b.learn("generate", Cost::new(40, 9));
    assert_eq!(b.largest_learned(), Some(Cost::new(100, 9)));
}
