//! A replica's background work (its batcher) runs on the runtime the replica
//! was made on, not on the runtime of the call that first needed it: a call
//! from a short-lived runtime does not take the batcher down with it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::{sync::Arc, time::Duration};

use flotilla_core::{BatchConfig, DeploymentSpec};
use flotilla_replica::{
    Deployment, Directory, OnExit, Registry, ReplicaActor, ReplicaEvent, UserError,
};
use ractor::Actor;
use tokio::sync::mpsc;

struct Double;

impl Deployment for Double {
    type Request = u32;
    type Response = u32;
    // Batched through the default handle_batch by a test.
    const BATCHED: bool = true;

    async fn handle(&self, x: u32) -> Result<u32, UserError> {
        Ok(2 * x)
    }
}

#[tokio::test(start_paused = true)]
async fn a_batcher_first_used_from_a_short_lived_runtime_outlives_it() {
    let spec = Arc::new(
        DeploymentSpec::builder("d", "test::Double")
            .with_config(|c| c.with_batching(BatchConfig::new(4, Duration::ZERO)))
            .build()
            .unwrap(),
    );
    let registry = Registry::new()
        .register("test::Double", |_ctx| async { Ok(Double) })
        .unwrap();
    let (tx, mut events) = mpsc::unbounded_channel();
    let directory = Directory::new();
    let args = support::args(
        "home-runtime",
        spec.clone(),
        registry.clone(),
        &directory,
        tx,
        OnExit::none(),
    );
    let (app, deployment) = (args.app.clone(), args.deployment.clone());
    Actor::spawn(None, ReplicaActor, args).await.unwrap();
    let Some(ReplicaEvent::Ready { endpoint, .. }) = events.recv().await else {
        panic!("not ready");
    };
    let route = directory.route(&app, &deployment);
    route.configure(&spec.config, &registry);
    route.publish(vec![endpoint]);
    let handle = directory.handle(&app, &deployment);

    // The first batched call comes from a runtime of its own, gone after it.
    let first = {
        let handle = handle.clone();
        tokio::task::spawn_blocking(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let out = rt.block_on(handle.call::<_, u32>(&3u32));
            drop(rt);
            out
        })
        .await
        .unwrap()
    };
    assert_eq!(first.unwrap(), 6);
    let next = tokio::time::timeout(Duration::from_secs(5), handle.call::<_, u32>(&4u32)).await;
    assert_eq!(next.expect("answered").unwrap(), 8);
}
