//! The scheduler's decision cost per request (`cargo bench -p hangar`):
//! the state machine alone, with the host busy, so that the figure is what
//! admission adds to each request (the target is at most 5 µs).
//!
//! - `admit+release`: 16 models loaded, 64 requests in flight; one request
//!   arrives, is admitted and is released;
//! - `queue+pump`: at the concurrency limit with 64 waiting; one request
//!   finishes (the oldest waiter is admitted) and one arrives (it waits);
//! - `evict+load`: at `--max-loaded-models 16` cycling over 32 models;
//!   each request evicts the least recently used idle model and loads its
//!   own (request, loaded, release, stopped).

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use hangar::scheduler::machine::{Decision, Event, Limits, Policy, Scheduler, Ticket};

fn policy() -> Policy {
    Policy {
        need: 1 << 30,
        drain: 30_000,
        ..Policy::default()
    }
}

fn request(ticket: Ticket, model: &str) -> Event {
    Event::Request {
        ticket,
        model: model.to_string(),
        policy: policy(),
    }
}

fn models(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("org/model-{i}")).collect()
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("scheduler decision per request");
    let mut out: Vec<Decision> = Vec::with_capacity(16);

    group.bench_function("admit+release", |b| {
        let names = models(16);
        let mut s = Scheduler::new(Limits {
            max_concurrent: Some(128),
            max_loaded: Some(32),
            memory_limit: Some(64 << 30),
            ..Limits::default()
        });
        let mut ticket: Ticket = 0;
        for name in &names {
            for _ in 0..4 {
                ticket += 1;
                s.step(0, request(ticket, name), &mut out);
            }
            s.step(0, Event::Loaded(name.clone()), &mut out);
        }
        let mut now = 1;
        b.iter(|| {
            ticket += 1;
            now += 1;
            let name = &names[ticket as usize % names.len()];
            out.clear();
            s.step(now, request(ticket, name), &mut out);
            s.step(now, Event::Release(ticket), &mut out);
            black_box(&out);
        });
    });

    group.bench_function("queue+pump", |b| {
        let names = models(16);
        let mut s = Scheduler::new(Limits {
            max_concurrent: Some(64),
            max_queue: 1024,
            queue_timeout: u64::MAX / 4,
            ..Limits::default()
        });
        let mut ticket: Ticket = 0;
        for _ in 0..128 {
            ticket += 1;
            s.step(0, request(ticket, &names[ticket as usize % 16]), &mut out);
        }
        for name in &names {
            s.step(0, Event::Loaded(name.clone()), &mut out);
        }
        let mut oldest: Ticket = 0;
        let mut now = 1;
        b.iter(|| {
            oldest += 1;
            ticket += 1;
            now += 1;
            out.clear();
            s.step(now, Event::Release(oldest), &mut out);
            s.step(now, request(ticket, &names[ticket as usize % 16]), &mut out);
            black_box(&out);
        });
        assert_eq!((s.in_flight(), s.queued()), (64, 64));
    });

    group.bench_function("evict+load", |b| {
        let names = models(32);
        let mut s = Scheduler::new(Limits {
            max_loaded: Some(16),
            ..Limits::default()
        });
        let mut ticket: Ticket = 0;
        let mut now = 0;
        let cycle = |s: &mut Scheduler, out: &mut Vec<Decision>, ticket: Ticket, now: u64| {
            let name = &names[ticket as usize % names.len()];
            out.clear();
            s.step(now, request(ticket, name), out);
            s.step(now, Event::Loaded(name.clone()), out);
            s.step(now, Event::Release(ticket), out);
            for d in out.clone() {
                if let Decision::Stop(victim, _) = d {
                    s.step(now, Event::Stopped(victim), out);
                }
            }
        };
        for _ in 0..32 {
            ticket += 1;
            now += 1;
            cycle(&mut s, &mut out, ticket, now);
        }
        b.iter(|| {
            ticket += 1;
            now += 1;
            cycle(&mut s, &mut out, ticket, now);
            black_box(&out);
        });
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
