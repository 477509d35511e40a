//! The imperative calls: deploy (`run`, `run_many`) and delete, and the
//! autoscaling decisions ApplicationActors send, each through the checkpoint
//! protocol: validate -> apply to a copy -> one commit -> swap in -> reply ->
//! command.

use flotilla_application::AppMsg;
use flotilla_core::{
    ApiType, AppName, AppRecord, ApplicationSpec, DeploymentName, DeploymentRecord, FaultPoint,
    ReplicaCount,
};
use flotilla_store::Batch;
use ractor::{ActorProcessingErr, ActorRef, RpcReplyPort};
use tracing::{info, warn};

use crate::{
    Controller, ControllerMsg, ServeError, checkpoint::crash_if, state::ControllerState,
    validate::validate_batch,
};

impl Controller {
    /// Validate -> apply to a copy -> one commit -> swap in -> reply -> command.
    pub(crate) async fn deploy(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
        apps: Vec<ApplicationSpec>,
        api_type: ApiType,
        reply: RpcReplyPort<Result<Vec<u64>, ServeError>>,
    ) -> Result<(), ActorProcessingErr> {
        if let Err(e) = validate_batch(&apps, &state.registry, &state.routes) {
            let _ = reply.send(Err(e));
            return Ok(());
        }
        let records: Vec<AppRecord> = apps
            .into_iter()
            .map(|spec| state.next_record(spec, api_type, None))
            .collect();
        // An imperative deploy takes its applications out of the config's hands.
        let released = state.config.without(records.iter().map(|r| &r.spec.name));
        let staged = state
            .stage_and_commit(|s, batch| {
                if let Some(config) = &released {
                    batch.put_config(config)?;
                }
                s.stage_targets(&records, batch)
            })
            .await?;
        let dropped = match staged {
            Ok(d) => d,
            Err(e) => {
                let _ = reply.send(Err(e));
                return Ok(());
            }
        };
        let generations = records.iter().map(|r| r.generation).collect();
        if let Some(config) = released {
            state.release_config(config);
        }
        let names = state.swap_targets(records, dropped);
        let _ = reply.send(Ok(generations));
        crash_if(&state.faults, FaultPoint::ControllerAfterReply)?;
        for name in &names {
            Self::command(myself, state, name).await;
        }
        // A config build parked behind a prefix this deploy took now fails.
        Self::settle_parked(myself, state).await
    }

    pub(crate) async fn delete(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
        names: Vec<AppName>,
        reply: RpcReplyPort<Result<Vec<Option<u64>>, ServeError>>,
    ) -> Result<(), ActorProcessingErr> {
        let result = names
            .iter()
            .map(|n| {
                state
                    .apps
                    .get(n)
                    .map(|e| e.record.generation + u64::from(!e.record.deleting))
            })
            .collect();
        // A delete takes its applications out of the config's hands.
        let released = state.config.without(names.iter());
        let staged = state
            .stage_and_commit(|s, batch| {
                if let Some(config) = &released {
                    batch.put_config(config)?;
                }
                s.stage_deletions(&names, batch)
            })
            .await?;
        let changed = match staged {
            Ok(c) => c,
            Err(e) => {
                let _ = reply.send(Err(e));
                return Ok(());
            }
        };
        if let Some(config) = released {
            state.release_config(config);
        }
        state.swap_deletions(&changed);
        let _ = reply.send(Ok(result));
        crash_if(&state.faults, FaultPoint::ControllerAfterReply)?;
        for r in &changed {
            Self::command(myself, state, &r.spec.name).await;
        }
        // The deletions released prefixes parked config builds may wait for.
        Self::settle_parked(myself, state).await
    }

    /// Make an autoscaling decision durable (one commit), then hand it to the
    /// application. Decisions for unknown, deleting or no longer autoscaled
    /// deployments are dropped.
    pub(crate) async fn autoscale(
        state: &mut ControllerState,
        app: AppName,
        deployment: DeploymentName,
        replicas: u32,
    ) -> Result<(), ActorProcessingErr> {
        let Some(entry) = state.apps.get(&app) else {
            return Ok(());
        };
        let Some(ReplicaCount::Auto(a)) = entry
            .record
            .spec
            .deployment(deployment.as_str())
            .map(|d| &d.config.num_replicas)
        else {
            return Ok(());
        };
        if entry.record.deleting {
            return Ok(());
        }
        let replicas = replicas.clamp(a.min_replicas, a.max_replicas);
        let current = state.autoscaled.get(&app).and_then(|m| m.get(&deployment));
        if current == Some(&replicas) {
            return Ok(());
        }
        let mut batch = Batch::new();
        batch.put_deployment(
            &app,
            &deployment,
            &DeploymentRecord {
                autoscaled_replicas: Some(replicas),
            },
        )?;
        if let Err(e) = state.checkpoint.commit(&state.faults, batch).await? {
            // Not durable, so not applied: the autoscaler decides again next tick.
            warn!(app = %app, deployment = %deployment, error = %e, "autoscaling decision not committed");
            return Ok(());
        }
        info!(app = %app, deployment = %deployment, replicas, "autoscaling decision committed");
        state
            .autoscaled
            .entry(app.clone())
            .or_default()
            .insert(deployment.clone(), replicas);
        if let Some(actor) = state.actors.actor(&app) {
            let _ = actor.cast(AppMsg::SetReplicas(deployment, replicas));
        }
        Ok(())
    }
}
