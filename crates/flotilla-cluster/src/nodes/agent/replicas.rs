//! The node's replicas: started as the head asks, their events reported to
//! the head.

use std::sync::Arc;

use flotilla_core::{Faults, actor_names};
use flotilla_replica::{
    OnExit, ReplicaActor, ReplicaArgs, ReplicaEvent, ReplicaId, ReplicaMsg, ReplicaReporter,
};
use ractor::ActorRef;
use tracing::{info, warn};

use super::{
    super::{
        account::Account,
        on_model_changes,
        wire::{Control, Start, WireEvent},
    },
    AgentMsg, AgentState, Local,
    routes::publish,
};

impl AgentState {
    pub(super) fn cast(&self, id: ReplicaId, msg: ReplicaMsg) {
        if let Some(a) = self.children.actor(&id) {
            let _ = a.cast(msg);
        }
    }
}

/// Tell the head that replica `replica`, which it placed here, ended at once
/// without starting: `crashed` counts it as a failed start (backed off),
/// else the head simply places it again.
fn refuse(state: &AgentState, replica: u64, crashed: bool, why: &str) {
    state.to_head(Control::Exited {
        replica,
        crashed,
        why: why.to_owned(),
    });
}

pub(super) async fn start_replica(myself: &ActorRef<AgentMsg>, state: &mut AgentState, s: Start) {
    let id = ReplicaId(s.replica);
    let Some(ns) = state.head.welcomed().map(str::to_owned) else {
        // The head welcomes a node before it places a replica there, so this
        // should not happen; if it does, the head hears that the replica
        // ended at once, as a failed start (counted and backed off), instead
        // of waiting for it.
        warn!(node = %state.args.id, app = %s.app, deployment = %s.spec.name, replica = %id,
            "start before the head's welcome: not started");
        refuse(state, s.replica, true, "start before the head's welcome");
        return;
    };
    if state.replicas.contains_key(&id) {
        return;
    }
    if state.course.shutting_down() {
        // Placed before the head heard `Leaving`: it ends at once, stopped
        // (not a failed start), and the head places it again elsewhere.
        info!(node = %state.args.id, app = %s.app, deployment = %s.spec.name, replica = %id,
            "start refused: the node is shutting down");
        refuse(
            state,
            s.replica,
            false,
            "not started: its node is shutting down",
        );
        return;
    }
    let spec = Arc::new(s.spec);
    let dep = spec.name.clone();
    // Its first requests may come before the route's first copy: take the
    // batching and model limit its spec was deployed with (later changes
    // come with the route). Not over a copy the node has: the head may have
    // sent a change after placing this replica and before this `Start`, and
    // the settings are the deployment's, not this replica's.
    let route = state.directory.route(&s.app, &dep);
    if !state.routes.contains_key(&(s.app.clone(), dep.clone())) {
        route.set_batching(spec.config.batching);
        route.set_max_models_per_replica(spec.config.max_num_models_per_replica);
    }
    let agent = myself.clone();
    let reporter: ReplicaReporter = Arc::new(move |id, event| {
        let _ = agent.cast(AgentMsg::Replica(id, event));
    });
    let args = ReplicaArgs {
        id,
        app: s.app.clone(),
        deployment: dep.clone(),
        spec: spec.clone(),
        version: s.version.clone(),
        registry: state.args.registry.clone(),
        directory: state.directory.clone(),
        route,
        reporter,
        group: actor_names::replica_group(&ns, &s.app, &dep),
        node: state.args.id.clone(),
        faults: Faults::new(),
        // Its place is reserved on the head, which its stand-in there gives back.
        on_exit: OnExit::none(),
    };
    let name = actor_names::replica(&ns, &s.app, &dep, id.0);
    let parent = myself.get_cell();
    match state
        .children
        .start(&parent, id, name, ReplicaActor, args)
        .await
    {
        Ok(_) => {
            info!(node = %state.args.id, app = %s.app, deployment = %dep, replica = %id,
                "replica started");
            state.replicas.insert(
                id,
                Local {
                    app: s.app,
                    spec,
                    account: Account::starting(s.version),
                    endpoint: None,
                    models: None,
                },
            );
            state.live_changed();
        }
        Err(e) => {
            warn!(node = %state.args.id, app = %s.app, deployment = %dep, replica = %id,
                error = %e, "replica not started");
            state.to_head(Control::Event {
                replica: id.0,
                event: WireEvent::StartFailed {
                    error: format!("the replica actor could not start on its node: {e}"),
                },
            });
        }
    }
}

pub(super) fn replica_event(
    myself: &ActorRef<AgentMsg>,
    state: &mut AgentState,
    id: ReplicaId,
    event: ReplicaEvent,
) {
    let wire = WireEvent::of(&event);
    let Some(r) = state.replicas.get_mut(&id) else {
        return;
    };
    r.account.apply(&wire);
    if let ReplicaEvent::Ready { endpoint, .. } = event {
        state.args.link.shared.serve(endpoint.clone());
        // The head's routers prefer the replica holding a request's model:
        // tell it what this one holds, now and after every change.
        if r.models.is_none() && endpoint.is_multiplexed() {
            let _ = myself.cast(AgentMsg::Models(id));
            let agent = myself.clone();
            let span = tracing::debug_span!("report_models", replica = %id);
            r.models = on_model_changes(&endpoint, span, move || {
                agent.cast(AgentMsg::Models(id)).is_ok()
            });
        }
        r.endpoint = Some(endpoint);
        let keys: Vec<_> = state
            .routes
            .iter()
            .filter(|(_, e)| e.replicas.iter().any(|x| x.id == id.0))
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            publish(state, &k);
        }
    }
    if !state.to_head(Control::Event {
        replica: id.0,
        event: wire,
    }) && let Some(r) = state.replicas.get(&id)
    {
        warn!(node = %state.args.id, app = %r.app, deployment = %r.spec.name, replica = %id,
            "replica event not sent: no head (it re-attaches with the replica's state)");
    }
}
