//! Requests through the proxy keep succeeding while the Controller, an
//! ApplicationActor and a DeploymentActor crash under load: 0 failed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;

use flotilla::{ApplicationSpec, ApplicationStatus, DeploymentSpec};
use support::{send, start, wait_status};
use tokio::sync::watch;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_through_the_proxy_survive_control_plane_crashes() {
    let f = start().await;
    let app = ApplicationSpec::builder("steady")
        .route_prefix("/steady")
        .deployment(support::quick(
            DeploymentSpec::builder("ingress", "t::Echo")
                .init_args(&"s")
                .replicas(2),
        ))
        .build()
        .unwrap();
    f.serve.run(app).await.unwrap();
    let (done_tx, mut done) = watch::channel(0u64);
    let done_tx = Arc::new(done_tx);
    const WORKERS: u64 = 8;
    const EACH: u64 = 120;
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (c, url, tx) = (support::client(), f.url("/steady/x"), done_tx.clone());
            tokio::spawn(async move {
                let mut failures = Vec::new();
                for i in 0..EACH {
                    let r = send(&c, "POST", &url, &[], format!("{w}-{i}")).await;
                    if r.status != 200 || !r.body.contains(&format!("{w}-{i}")) {
                        failures.push((r.status, r.body));
                    }
                    tx.send_modify(|n| *n += 1);
                }
                failures
            })
        })
        .collect();
    let total = WORKERS * EACH;
    done.wait_for(|n| *n >= total / 8).await.unwrap();
    f.serve.crash_controller();
    done.wait_for(|n| *n >= total / 4).await.unwrap();
    assert!(
        f.serve.crash_application("steady"),
        "the ApplicationActor was alive"
    );
    done.wait_for(|n| *n >= total / 2).await.unwrap();
    // The ApplicationActor may still be coming back: kill its DeploymentActor
    // once it runs again.
    // (A count of tries would depend on the scheduler; `until` fails after
    // 10 s of wall time.)
    support::until(|| f.serve.crash_deployment("steady", "ingress")).await;
    let mut failures = Vec::new();
    for w in workers {
        failures.extend(w.await.unwrap());
    }
    assert_eq!(failures, Vec::<(u16, String)>::new(), "0 failed requests");
    assert_eq!(*done.borrow(), total);
    let m = f.serve.metrics().await.unwrap();
    assert!(m.controller_restarts >= 1, "{m:?}");
    wait_status(&f.serve, "steady", ApplicationStatus::Running).await;
    f.stop().await;
}
