//! A request or response type whose own serde code panics fails the request
//! it belongs to, wherever the encoding happens (a local caller's replica
//! decoding, a replica answering another process, a stream's items on their
//! way to one), and the task carrying it lives on to answer. A request's
//! panic is a bad request (the handler never ran: the replica serves on); a
//! response's is the deployment's own code panicking (`Panicked`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::{sync::Arc, time::Duration};

use flotilla_core::{AppName, DeploymentName, DeploymentSpec};
use flotilla_replica::{
    CallError, Deployment, Directory, OnExit, Registry, ReplicaActor, ReplicaEndpoint,
    ReplicaEvent, ReplicaMsg, UserError,
    remote::{self, Served},
};
use ractor::{Actor, ActorRef};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tokio::sync::mpsc;

/// Decodes from a number, but its `Deserialize` panics on 13.
struct Fussy(u32);

impl<'de> Deserialize<'de> for Fussy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = u32::deserialize(d)?;
        assert!(n != 13, "cannot decode 13");
        Ok(Fussy(n))
    }
}

/// Encodes as its number, but its `Serialize` panics on 997.
struct Touchy(u32);

impl Serialize for Touchy {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        assert!(self.0 != 997, "cannot encode 997");
        s.serialize_u32(self.0)
    }
}

struct Echo;

impl Deployment for Echo {
    type Request = Fussy;
    type Response = Touchy;

    async fn handle(&self, req: Fussy) -> Result<Touchy, UserError> {
        Ok(Touchy(req.0))
    }
}

struct Rig {
    directory: Directory,
    app: AppName,
    deployment: DeploymentName,
    endpoint: Arc<ReplicaEndpoint>,
    actor: ActorRef<ReplicaMsg>,
}

async fn start(ns: &str) -> Rig {
    let spec = Arc::new(DeploymentSpec::builder("d", "test::Echo").build().unwrap());
    let registry = Registry::new()
        .register("test::Echo", |_ctx| async { Ok(Echo) })
        .unwrap();
    let (tx, mut events) = mpsc::unbounded_channel();
    let directory = Directory::new();
    let args = support::args(ns, spec, registry, &directory, tx, OnExit::none());
    let (app, deployment) = (args.app.clone(), args.deployment.clone());
    let (actor, _) = Actor::spawn(None, ReplicaActor, args).await.unwrap();
    let event = tokio::time::timeout(Duration::from_secs(600), events.recv())
        .await
        .unwrap()
        .unwrap();
    let ReplicaEvent::Ready { endpoint, .. } = event else {
        panic!("not ready: {event:?}");
    };
    directory
        .route(&app, &deployment)
        .publish(vec![endpoint.clone()]);
    Rig {
        directory,
        app,
        deployment,
        endpoint,
        actor,
    }
}

/// A request's panic in its serde code, as the caller sees it.
fn request_panic(message: &str) -> CallError {
    CallError::BadRequest(format!("panicked: {message}"))
}

fn bytes(n: u32) -> Vec<u8> {
    rmp_serde::to_vec_named(&n).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_request_whose_type_panics_as_it_decodes_fails_as_a_bad_request() {
    let rig = start("serde-panics-local").await;
    let h = rig.directory.handle(&rig.app, &rig.deployment);
    let err = h.call::<_, u32>(&13u32).await.unwrap_err();
    assert_eq!(err, request_panic("cannot decode 13"));
    // A value handed over whose own `Serialize` panics as the replica takes
    // it (another type than the handler's): the caller's code, not the
    // replica's.
    let err = h.call_owned::<_, u32>(Touchy(997)).await.unwrap_err();
    assert_eq!(err, request_panic("cannot encode 997"));
    // Neither ran the handler: the replica was not condemned, and serves on.
    assert_eq!(h.call::<_, u32>(&7u32).await.unwrap(), 7);
    // Its mailbox holds any report sent before this question.
    let snapshot = ractor::call!(rig.actor, ReplicaMsg::Observe).unwrap();
    assert_eq!(snapshot.condemned, None);
    // A response of another type than the caller's is encoded on its way: the
    // panic there is the deployment's own code's.
    let err = h.call::<_, u32>(&997u32).await.unwrap_err();
    assert_eq!(err, CallError::Panicked("cannot encode 997".into()));
}

#[tokio::test(start_paused = true)]
async fn a_replica_answering_another_process_reports_a_serde_panic_as_its_outcome() {
    let rig = start("serde-panics-remote").await;
    for (n, error) in [
        (13, request_panic("cannot decode 13")),
        (997, CallError::Panicked("cannot encode 997".into())),
    ] {
        match remote::serve(&rig.endpoint, bytes(n), None).await {
            Served::Ran(Err(e)) => assert_eq!(e, error),
            other => panic!("{n}: {other:?}"),
        }
    }
    let (tx, _rx) = mpsc::channel(4);
    match remote::serve_stream(&rig.endpoint, bytes(997), None, tx).await {
        Served::Ran(Err(e)) => assert_eq!(e, CallError::Panicked("cannot encode 997".into())),
        other => panic!("stream: {other:?}"),
    }
}
