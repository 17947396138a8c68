//! The scheduler's decisions, scripted: each test is a script of events
//! and the decisions they produced, checked with one `check()`.
//!
//! Script lines:
//! - `limits max_concurrent=1 max_queue=2 queue_timeout=10s max_loaded=2 guard=safe memory_limit=8G`
//! - `model a need=4G pin ttl=60s max=1 drain=5s` (a model's policy)
//! - `@TIME EVENT` where TIME is `3s` or `250ms` and EVENT one of
//!   `request TICKET MODEL`, `release TICKET`, `load MODEL`,
//!   `unload MODEL`, `loaded MODEL`, `failed MODEL`, `stopped MODEL`,
//!   `ended MODEL`, `held MODEL BYTES`, `memory TOTAL AVAILABLE`, `tick`.

use std::collections::HashMap;
use std::fmt::Write as _;

use expect_test::{expect, Expect};

use super::guard::{Guard, Reading};
use super::machine::{Decision, Event, Limits, Policy, Scheduler};

fn size(s: &str) -> u64 {
    let (n, unit) = s.split_at(s.find(|c: char| c.is_alphabetic()).unwrap_or(s.len()));
    let n: u64 = n.parse().unwrap_or_else(|_| panic!("bad size {s}"));
    n * match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        other => panic!("bad unit {other}"),
    }
}

fn millis(s: &str) -> u64 {
    if s == "0" {
        0
    } else if let Some(ms) = s.strip_suffix("ms") {
        ms.parse().unwrap()
    } else {
        s.strip_suffix('s').unwrap().parse::<u64>().unwrap() * 1000
    }
}

fn render(d: &Decision) -> String {
    match d {
        Decision::Admit(t) => format!("admit #{t}"),
        Decision::Queue(t) => format!("queue #{t}"),
        Decision::Reject(t, r) => format!(
            "reject #{t} ({}{}): {r}",
            if r.is_rate_limit() { 429 } else { 503 },
            r.retry_after()
                .map(|s| format!(" retry-after {s}"))
                .unwrap_or_default()
        ),
        Decision::Load(m) => format!("load {m}"),
        Decision::RefuseLoad(m, r) => format!("refuse load {m}: {r}"),
        Decision::Stop(m, why) => format!("stop {m}: {why}"),
        Decision::Drain(m, until) => format!("drain {m} until {until}ms"),
        Decision::CancelLoad(m) => format!("cancel load {m}"),
        Decision::NotLoaded(m) => format!("not loaded: {m}"),
    }
}

fn check(script: &str, expect: Expect) {
    let mut limits = Limits::default();
    let mut policies: HashMap<String, Policy> = HashMap::new();
    let mut scheduler: Option<Scheduler> = None;
    let mut out = String::new();
    let mut decisions = Vec::new();
    for line in script.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words[0] {
            "limits" => {
                for w in &words[1..] {
                    let (k, v) = w.split_once('=').unwrap();
                    match k {
                        "max_concurrent" => limits.max_concurrent = Some(v.parse().unwrap()),
                        "max_queue" => limits.max_queue = v.parse().unwrap(),
                        "queue_timeout" => limits.queue_timeout = millis(v),
                        "max_loaded" => limits.max_loaded = Some(v.parse().unwrap()),
                        "guard" => limits.guard = v.parse::<Guard>().unwrap(),
                        "memory_limit" => limits.memory_limit = Some(size(v)),
                        other => panic!("unknown limit {other}"),
                    }
                }
                continue;
            }
            "model" => {
                let mut p = Policy::default();
                for w in &words[2..] {
                    match w.split_once('=') {
                        None if *w == "pin" => p.pin = true,
                        Some(("need", v)) => p.need = size(v),
                        Some(("ttl", v)) => p.ttl = Some(millis(v)),
                        Some(("max", v)) => p.max_concurrent = Some(v.parse().unwrap()),
                        Some(("drain", v)) => p.drain = millis(v),
                        _ => panic!("unknown policy {w}"),
                    }
                }
                policies.insert(words[1].to_string(), p);
                continue;
            }
            _ => {}
        }
        let scheduler = scheduler.get_or_insert_with(|| Scheduler::new(limits.clone()));
        let now = millis(
            words[0]
                .strip_prefix('@')
                .expect("an event line starts with @TIME"),
        );
        let policy = |m: &str| policies.get(m).cloned().unwrap_or_default();
        let event = match &words[1..] {
            ["request", t, m] => Event::Request {
                ticket: t.parse().unwrap(),
                model: m.to_string(),
                policy: policy(m),
            },
            ["release", t] => Event::Release(t.parse().unwrap()),
            ["load", m] => Event::Load {
                model: m.to_string(),
                policy: policy(m),
            },
            ["unload", m] => Event::Unload(m.to_string()),
            ["loaded", m] => Event::Loaded(m.to_string()),
            ["failed", m] => Event::LoadFailed(m.to_string()),
            ["stopped", m] => Event::Stopped(m.to_string()),
            ["ended", m] => Event::Ended(m.to_string()),
            ["held", m, b] => Event::Held(m.to_string(), size(b)),
            ["memory", total, available] => Event::Memory(Reading {
                total: size(total),
                available: size(available),
                device_free: None,
            }),
            ["tick"] => Event::Tick,
            other => panic!("unknown event {other:?}"),
        };
        decisions.clear();
        scheduler.step(now, event, &mut decisions);
        let rendered: Vec<String> = decisions.iter().map(render).collect();
        if rendered.is_empty() {
            writeln!(out, "{line}").unwrap();
        } else {
            writeln!(out, "{line} => {}", rendered.join("; ")).unwrap();
        }
    }
    expect.assert_eq(&out);
}

#[test]
fn without_limits_every_request_is_admitted_and_the_first_loads() {
    check(
        "
        @0 request 1 a
        @0 request 2 a
        @1s loaded a
        @2s release 1
        @2s release 2
        @1000s tick
        ",
        expect![[r#"
            @0 request 1 a => admit #1; load a
            @0 request 2 a => admit #2
            @1s loaded a
            @2s release 1
            @2s release 2
            @1000s tick
        "#]],
    );
}

#[test]
fn past_the_host_limit_requests_queue_in_order_then_get_429() {
    check(
        "
        limits max_concurrent=1 max_queue=2 queue_timeout=10s
        @0 request 1 a
        @0 loaded a
        @1s request 2 a
        @2s request 3 b
        @3s request 4 a
        @4s release 1
        @5s release 2
        @13s tick
        ",
        expect![[r#"
            @0 request 1 a => admit #1; load a
            @0 loaded a
            @1s request 2 a => queue #2
            @2s request 3 b => queue #3
            @3s request 4 a => reject #4 (429 retry-after 10): the host is at its concurrency limit and its queue of 2 is full; retry after 10 s
            @4s release 1 => admit #2
            @5s release 2 => admit #3; load b
            @13s tick
        "#]],
    );
}

#[test]
fn a_waiter_past_the_queue_timeout_gets_429_and_a_client_that_left_frees_its_place() {
    check(
        "
        limits max_concurrent=1 max_queue=1 queue_timeout=10s
        @0 request 1 a
        @1s request 2 a
        @2s request 3 a
        @3s release 2
        @4s request 3 a
        @13s tick
        @14s tick
        ",
        expect![[r#"
            @0 request 1 a => admit #1; load a
            @1s request 2 a => queue #2
            @2s request 3 a => reject #3 (429 retry-after 10): the host is at its concurrency limit and its queue of 1 is full; retry after 10 s
            @3s release 2
            @4s request 3 a => queue #3
            @13s tick
            @14s tick => reject #3 (429 retry-after 10): the request waited 10.0 s in the queue (--queue-timeout) without a free slot; retry after 10 s
        "#]],
    );
}

#[test]
fn a_model_limit_holds_its_requests_without_blocking_other_models() {
    check(
        "
        model a max=1
        @0 request 1 a
        @0 request 2 a
        @0 request 3 b
        @1s release 1
        ",
        expect![[r#"
            @0 request 1 a => admit #1; load a
            @0 request 2 a => queue #2
            @0 request 3 b => admit #3; load b
            @1s release 1 => admit #2
        "#]],
    );
}

#[test]
fn at_max_loaded_models_the_least_recently_used_idle_one_is_evicted() {
    check(
        "
        limits max_loaded=2
        @0 request 1 a
        @0 loaded a
        @1s request 2 b
        @1s loaded b
        @2s release 2
        @3s release 1
        @4s request 3 c
        @5s stopped b
        @6s loaded c
        ",
        expect![[r#"
            @0 request 1 a => admit #1; load a
            @0 loaded a
            @1s request 2 b => admit #2; load b
            @1s loaded b
            @2s release 2
            @3s release 1
            @4s request 3 c => stop b: evicted (least recently used) to make room for 'c'; admit #3; load c
            @5s stopped b
            @6s loaded c
        "#]],
    );
}

#[test]
fn busy_models_are_not_evicted_the_request_waits_for_one_to_go_idle() {
    check(
        "
        limits max_loaded=1
        @0 request 1 a
        @0 loaded a
        @1s request 2 b
        @2s release 1
        @3s stopped a
        ",
        expect![[r#"
            @0 request 1 a => admit #1; load a
            @0 loaded a
            @1s request 2 b => queue #2
            @2s release 1 => stop a: evicted (least recently used) to make room for 'b'; admit #2; load b
            @3s stopped a
        "#]],
    );
}

#[test]
fn pinned_models_are_never_evicted_nor_unloaded_when_idle() {
    check(
        "
        limits max_loaded=1
        model p pin ttl=1s
        @0 load p
        @0 loaded p
        @10s tick
        @11s request 1 q
        @12s load q
        ",
        expect![[r#"
            @0 load p => load p
            @0 loaded p
            @10s tick
            @11s request 1 q => reject #1 (503): --max-loaded-models 1 is taken by pinned models (p); unpin one or raise the limit
            @12s load q => refuse load q: --max-loaded-models 1 is taken by pinned models (p); unpin one or raise the limit
        "#]],
    );
}

#[test]
fn an_idle_model_is_unloaded_after_its_ttl_and_loads_again_on_use() {
    check(
        "
        model a ttl=30s
        @0 request 1 a
        @1s loaded a
        @5s release 1
        @34s tick
        @35s tick
        @36s request 2 a
        @37s stopped a
        ",
        expect![[r#"
            @0 request 1 a => admit #1; load a
            @1s loaded a
            @5s release 1
            @34s tick
            @35s tick => stop a: unloaded after 30 s idle (ttl_seconds)
            @36s request 2 a => queue #2
            @37s stopped a => admit #2; load a
        "#]],
    );
}

#[test]
fn an_unload_drains_in_flight_requests_then_stops_or_cuts_them_off_at_the_deadline() {
    check(
        "
        model a drain=5s
        model b drain=5s
        @0 request 1 a
        @0 request 2 b
        @0 loaded a
        @0 loaded b
        @1s unload a
        @1s unload b
        @2s request 3 a
        @3s release 1
        @4s stopped a
        @6s tick
        ",
        expect![[r#"
            @0 request 1 a => admit #1; load a
            @0 request 2 b => admit #2; load b
            @0 loaded a
            @0 loaded b
            @1s unload a => drain a until 6000ms
            @1s unload b => drain b until 6000ms
            @2s request 3 a => queue #3
            @3s release 1 => stop a: unloaded on request
            @4s stopped a => admit #3; load a
            @6s tick => stop b: unloaded on request; requests still running after the drain period were cut off
        "#]],
    );
}

#[test]
fn an_unload_while_loading_cancels_the_load() {
    check(
        "
        @0 request 1 a
        @1s unload a
        @1s failed a
        @2s release 1
        @3s unload a
        @4s unload nope
        ",
        expect![[r#"
            @0 request 1 a => admit #1; load a
            @1s unload a => cancel load a
            @1s failed a
            @2s release 1
            @3s unload a => not loaded: a
            @4s unload nope => not loaded: nope
        "#]],
    );
}

#[test]
fn a_model_that_does_not_fit_evicts_idle_models_first_then_is_refused_naming_need_free_and_pinned()
{
    check(
        "
        limits memory_limit=10G
        model p need=4G pin
        model a need=3G
        model b need=5G
        model huge need=7G
        @0 load p
        @0 loaded p
        @1s request 1 a
        @1s loaded a
        @2s release 1
        @3s request 2 b
        @4s request 3 huge
        ",
        expect![[r#"
            @0 load p => load p
            @0 loaded p
            @1s request 1 a => admit #1; load a
            @1s loaded a
            @2s release 1
            @3s request 2 b => stop a: evicted (least recently used) to make room for 'b'; admit #2; load b
            @4s request 3 huge => reject #3 (503): model 'huge' needs 7.0 GiB but only 1.0 GiB is free under the memory ceiling of 10.0 GiB even after evicting every unpinned idle model; pinned: p. Unpin or unload a model, or raise --memory-limit / lower --memory-guard
        "#]],
    );
}

#[test]
fn the_guard_keeps_its_reserves_and_measured_memory_counts_over_estimates() {
    // safe: min(32G - 12G, held + available - 2G).
    check(
        "
        limits guard=safe
        model a need=2G
        model b need=8G
        @0 memory 32G 12G
        @0 request 1 a
        @1s loaded a
        @1s held a 6G
        @2s release 1
        @3s memory 32G 6G
        @4s request 2 b
        ",
        expect![[r#"
            @0 memory 32G 12G
            @0 request 1 a => admit #1; load a
            @1s loaded a
            @1s held a 6G
            @2s release 1
            @3s memory 32G 6G
            @4s request 2 b => stop a: evicted (least recently used) to make room for 'b'; admit #2; load b
        "#]],
    );
}

#[test]
fn under_memory_pressure_new_requests_are_refused_and_idle_models_evicted() {
    check(
        "
        limits guard=balanced
        model a need=1G
        model b need=1G
        @0 memory 32G 20G
        @0 request 1 a
        @0 request 2 b
        @0 loaded a
        @0 loaded b
        @1s release 1
        @2s memory 32G 512M
        @3s request 3 b
        @4s memory 32G 4G
        @5s request 4 b
        ",
        expect![[r#"
            @0 memory 32G 20G
            @0 request 1 a => admit #1; load a
            @0 request 2 b => admit #2; load b
            @0 loaded a
            @0 loaded b
            @1s release 1
            @2s memory 32G 512M => stop a: evicted (least recently used): the machine is short of memory
            @3s request 3 b => reject #3 (503 retry-after 5): the machine is short of memory (512.0 MiB available, the memory guard keeps 1.0 GiB): new requests are refused until it recovers
            @4s memory 32G 4G
            @5s request 4 b => admit #4
        "#]],
    );
}

#[test]
fn a_crashed_or_failed_model_loads_again_on_the_next_request() {
    check(
        "
        @0 request 1 a
        @1s failed a
        @1s release 1
        @2s request 2 a
        @3s loaded a
        @4s ended a
        @5s request 3 a
        ",
        expect![[r#"
            @0 request 1 a => admit #1; load a
            @1s failed a
            @1s release 1
            @2s request 2 a => admit #2; load a
            @3s loaded a
            @4s ended a
            @5s request 3 a => admit #3; load a
        "#]],
    );
}
