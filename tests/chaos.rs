//! Randomised schedules: from a seed, a random sequence of deploys, redeploys,
//! scale changes and deletes interleaved with random faults (controller crashes at
//! each point around the commit, application and deployment actors crashing in a
//! reconcile step or killed, replica constructor, handler and health-check faults,
//! commit failures, whole-process crashes), then the invariants once the system is quiet:
//! every acknowledged operation is reflected, nothing deleted comes back, replica
//! counts and versions equal the targets, and no actor is left orphaned.
//!
//! `FLOTILLA_SEEDS=N` runs N seeds (default 200); `FLOTILLA_SEED=S` replays one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use flotilla::{ApplicationStatus, FaultPoint, Serve, ServeError};
use support::{Switches, no_wait, tag};

const APPS: [&str; 5] = ["a", "b", "c", "d", "e"];
const TAGS: [&str; 3] = ["x", "y", "z"];
const OPS: usize = 24;

/// xorshift64*: small, seeded, the same on every machine.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }
}

/// What an application may be once quiet.
#[derive(Debug, Clone, PartialEq)]
enum Want {
    Absent,
    Present { replicas: u32, tag: String },
}

type Model = BTreeMap<&'static str, Vec<Want>>;

/// Record the outcome of a mutating call: applied, not applied, or unknown.
fn settle(model: &mut Model, names: &[&'static str], new: &[Want], result: Result<(), ServeError>) {
    for (name, want) in names.iter().zip(new) {
        let possible = model.entry(name).or_insert_with(|| vec![Want::Absent]);
        match &result {
            Ok(()) => *possible = vec![want.clone()],
            // The Controller crashed mid-call: it may or may not have been applied.
            Err(ServeError::ControllerCrashed) => {
                if !possible.contains(want) {
                    possible.push(want.clone());
                }
            }
            Err(ServeError::Store(_)) => {}
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
}

async fn start(dir: &tempfile::TempDir, sw: &Arc<Switches>) -> Serve {
    // Faults here come far faster than any real failure rate: do not escalate
    // (escalation has its own test in tests/recovery.rs).
    let restart = flotilla::RestartPolicy {
        max_restarts: 10_000,
        ..Default::default()
    };
    support::start_restarting(dir, sw, restart).await
}

async fn schedule(seed: u64) {
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let sw = Arc::new(Switches::default());
    let mut serve = start(&dir, &sw).await;
    let mut dead: Vec<Serve> = Vec::new();
    let mut model = Model::new();
    let trace = std::env::var("FLOTILLA_SEED").is_ok();
    for step in 0..OPS {
        let op = rng.below(100);
        if trace {
            eprintln!("step {step}: op {op} model {model:?}");
        }
        match op {
            0..40 => {
                let n = 1 + rng.below(3) as usize;
                let mut names: Vec<&'static str> = (0..n).map(|_| rng.pick(&APPS)).collect();
                names.sort_unstable();
                names.dedup();
                let wants: Vec<Want> = names
                    .iter()
                    .map(|_| Want::Present {
                        replicas: 1 + rng.below(2) as u32,
                        tag: rng.pick(&TAGS).to_owned(),
                    })
                    .collect();
                let specs = names
                    .iter()
                    .zip(&wants)
                    .map(|(name, w)| match w {
                        Want::Present { replicas, tag: t } => support::app(name, *replicas, tag(t)),
                        Want::Absent => unreachable!(),
                    })
                    .collect();
                let result = serve.run_many(specs, no_wait()).await.map(|_| ());
                settle(&mut model, &names, &wants, result);
            }
            40..60 => {
                let names = vec![rng.pick(&APPS)];
                let result = serve.delete_apps(&names, false).await;
                settle(&mut model, &names, &[Want::Absent], result);
            }
            60..70 => {
                let point = FaultPoint::ALL[rng.below(FaultPoint::ALL.len() as u64) as usize];
                // Three health-check failures in a row make a replica unhealthy.
                let times = if point == FaultPoint::ReplicaHealthCheck {
                    3
                } else {
                    1
                };
                serve.faults().arm(point, times);
            }
            70..75 => {
                serve.crash_application(rng.pick(&APPS));
            }
            75..80 => {
                serve.crash_deployment(rng.pick(&APPS), "probe");
            }
            80..85 => serve.fail_next_commit(),
            85..90 => serve.crash_controller(),
            90..93 => {
                serve.crash_process().await;
                dead.push(serve);
                serve = start(&dir, &sw).await;
            }
            _ => tokio::time::sleep(Duration::from_secs(rng.below(10))).await,
        }
        tokio::time::sleep(Duration::from_millis(rng.below(2_000))).await;
    }
    serve.faults().clear();
    check_quiet(&serve, &model).await;
    for d in &dead {
        assert_eq!(d.living_groups(), vec![], "actors outlived their process");
    }
    serve.shutdown().await.unwrap();
    assert_eq!(serve.living_groups(), vec![], "actors outlived shutdown");
}

/// Wait until every application settles into one of its possible states, then
/// check that exactly the right actors are alive.
async fn check_quiet(serve: &Serve, model: &Model) {
    // Let restarts in flight finish before judging.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let mut settled: BTreeMap<&str, Want> = BTreeMap::new();
    for (name, possible) in model {
        let mut last = String::new();
        let found = 'wait: {
            for _ in 0..600 {
                let s = serve.app_status(name);
                last = format!("{s:?}");
                for want in possible {
                    let ok = match want {
                        // Absent must be settled, not a restart in progress: no
                        // status and no actor of it left.
                        Want::Absent => {
                            s.status == ApplicationStatus::NotStarted
                                && !serve.living_groups().iter().any(|(g, _)| {
                                    g.ends_with(&format!("/deps:{name}"))
                                        || g.contains(&format!("/replicas:{name}/"))
                                })
                        }
                        Want::Present { replicas, tag } => {
                            s.status == ApplicationStatus::Running
                                && serve.app_handle(name).is_ok_and(|h| {
                                    let set = h.replicas();
                                    set.len() == *replicas as usize
                                })
                                && answers(serve, name, tag).await
                        }
                    };
                    if ok {
                        break 'wait Some(want.clone());
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            None
        };
        let want = found.unwrap_or_else(|| {
            panic!("{name} never reached any of {possible:?}; last status {last}")
        });
        settled.insert(name, want);
    }
    // Quiet: give stopping replicas time to finish, then count the living actors.
    tokio::time::sleep(Duration::from_secs(60)).await;
    let mut expected: Vec<(String, usize)> = Vec::new();
    for (name, want) in &settled {
        if let Want::Present { replicas, .. } = want {
            expected.push((format!("{}/deps:{name}", serve.namespace()), 1));
            expected.push((
                format!("{}/replicas:{name}/probe", serve.namespace()),
                *replicas as usize,
            ));
        }
    }
    expected.sort();
    assert_eq!(
        serve.living_groups(),
        expected,
        "orphaned or missing actors"
    );
}

async fn answers(serve: &Serve, app: &str, tag: &str) -> bool {
    let Ok(h) = serve.app_handle(app) else {
        return false;
    };
    let h = h.with_timeout(Duration::from_secs(1));
    for _ in 0..4 {
        match h.call::<_, String>("q").await {
            Ok(out) if out == format!("{tag}:q") => {}
            _ => return false,
        }
    }
    true
}

fn run_seed(seed: u64) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rt.block_on(schedule(seed));
    }));
    if let Err(p) = outcome {
        eprintln!(
            "chaos seed {seed} failed; replay with: FLOTILLA_SEED={seed} cargo test --test chaos"
        );
        std::panic::resume_unwind(p);
    }
}

/// Run this quarter of the seeds (`FLOTILLA_SEEDS`, 200 by default), or only
/// `FLOTILLA_SEED` (in the first quarter, with logs). Four tests, so the
/// harness runs the schedules on every core.
fn run_quarter(quarter: u64) {
    if let Some(seed) = std::env::var("FLOTILLA_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        if quarter == 0 {
            let subscriber = tracing_subscriber::fmt()
                .with_writer(std::io::stderr)
                .with_max_level(tracing::Level::INFO)
                .finish();
            let _guard = tracing::subscriber::set_default(subscriber);
            run_seed(seed);
        }
        return;
    }
    let seeds: u64 = std::env::var("FLOTILLA_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    for seed in (0..seeds).filter(|s| s % 4 == quarter) {
        run_seed(seed);
    }
}

#[test]
fn random_schedules_keep_every_invariant_0() {
    run_quarter(0);
}

#[test]
fn random_schedules_keep_every_invariant_1() {
    run_quarter(1);
}

#[test]
fn random_schedules_keep_every_invariant_2() {
    run_quarter(2);
}

#[test]
fn random_schedules_keep_every_invariant_3() {
    run_quarter(3);
}
