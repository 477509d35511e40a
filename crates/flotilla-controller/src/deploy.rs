//! The imperative calls: deploy (`run`, `run_many`) and delete, and the
//! autoscaling decisions ApplicationActors send, each through the checkpoint
//! protocol: validate -> apply to a copy -> one commit -> swap in -> reply ->
//! command.

use flotilla_application::AppMsg;
use flotilla_core::{
    ApiType, AppName, AppRecord, ApplicationSpec, DeploymentName, DeploymentRecord, MAX_REPLICAS,
    ReplicaCount,
};
use flotilla_store::Batch;
use ractor::{ActorProcessingErr, ActorRef, RpcReplyPort};
use tracing::{debug, info, warn};

use crate::{
    Controller, ControllerMsg, Deleting, Deployed, ServeError, state::ControllerState,
    validate::validate_batch,
};

impl Controller {
    /// Deploy (or redeploy) `apps`, all or nothing, in one commit.
    pub(crate) async fn deploy(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
        apps: Vec<ApplicationSpec>,
        api_type: ApiType,
        reply: RpcReplyPort<Result<Vec<Deployed>, ServeError>>,
    ) -> Result<(), ActorProcessingErr> {
        let stage = |s: &ControllerState, batch: &mut Batch| {
            validate_batch(&apps, &s.registry, &s.routes)?;
            let records: Vec<AppRecord> = apps
                .into_iter()
                .map(|spec| s.next_record(spec, api_type, None))
                .collect();
            // An imperative deploy takes its applications out of the config's hands.
            let released = s.config.without(records.iter().map(|r| &r.spec.name));
            if let Some(config) = &released {
                batch.put_config(config)?;
            }
            let dropped = s.stage_targets(&records, batch)?;
            Ok((records, released, dropped))
        };
        let swap = |s: &mut ControllerState,
                    (records, released, dropped): (Vec<AppRecord>, _, _)| {
            let generations: Vec<u64> = records.iter().map(|r| r.generation).collect();
            let names = s.swap_targets(records, dropped);
            // After the swap: an application the config was still building
            // keeps its board entry (and its watchers) as it changes hands.
            if let Some(config) = released {
                s.release_config(config);
            }
            // Subscribed in this turn: the caller watches the application it
            // deployed, never a later one of the same name.
            let deployed = names
                .iter()
                .zip(generations)
                .map(|(name, generation)| Deployed {
                    generation,
                    status: s.board.watch(name.as_str()),
                })
                .collect();
            (deployed, names)
        };
        if Self::transact(myself, state, reply, stage, swap).await? {
            // A config build parked behind a prefix this deploy took now fails.
            Self::settle_parked_next(myself, state);
        }
        Ok(())
    }

    /// Delete `names` (unknown ones are ignored) in one commit.
    pub(crate) async fn delete(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
        names: Vec<AppName>,
        reply: RpcReplyPort<Result<Vec<Option<Deleting>>, ServeError>>,
    ) -> Result<(), ActorProcessingErr> {
        let stage = |s: &ControllerState, batch: &mut Batch| {
            let generations: Vec<Option<u64>> = names
                .iter()
                .map(|n| {
                    s.apps
                        .get(n)
                        .map(|e| e.record.generation + u64::from(!e.record.deleting))
                })
                .collect();
            // A delete takes its applications out of the config's hands.
            let released = s.config.without(names.iter());
            if let Some(config) = &released {
                batch.put_config(config)?;
            }
            let changed = s.stage_deletions(&names, batch)?;
            Ok((generations, released, changed))
        };
        let swap = |s: &mut ControllerState,
                    (generations, released, changed): (_, _, Vec<AppRecord>)| {
            if let Some(config) = released {
                s.release_config(config);
            }
            s.swap_deletions(&changed);
            // Subscribed in this turn: an application created since the
            // caller sent the deletion is the one it waits for.
            let deletions = names
                .iter()
                .zip(generations)
                .map(|(name, generation)| {
                    Some(Deleting {
                        generation: generation?,
                        status: s.board.watch(name.as_str()),
                    })
                })
                .collect();
            (
                deletions,
                changed.into_iter().map(|r| r.spec.name).collect(),
            )
        };
        if Self::transact(myself, state, reply, stage, swap).await? {
            // The deletions released prefixes parked config builds may wait for.
            Self::settle_parked_next(myself, state);
        }
        Ok(())
    }

    /// Set a deployment's replica count from outside (an external scaler), in
    /// one commit.
    pub(crate) async fn scale(
        myself: &ActorRef<ControllerMsg>,
        state: &mut ControllerState,
        app: AppName,
        deployment: DeploymentName,
        replicas: u32,
        reply: RpcReplyPort<Result<(), ServeError>>,
    ) -> Result<(), ActorProcessingErr> {
        let stage = |s: &ControllerState, batch: &mut Batch| {
            let record =
                s.apps
                    .get(&app)
                    .map(|e| &e.record)
                    .ok_or_else(|| ServeError::NotFound {
                        app: app.to_string(),
                        deployment: None,
                    })?;
            if record.deleting {
                return Err(ServeError::BeingDeleted {
                    app: app.to_string(),
                });
            }
            if !record.spec.external_scaler_enabled {
                return Err(ServeError::ExternalScalerDisabled {
                    app: app.to_string(),
                });
            }
            if record.spec.deployment(deployment.as_str()).is_none() {
                return Err(ServeError::NotFound {
                    app: app.to_string(),
                    deployment: Some(deployment.to_string()),
                });
            }
            if replicas > MAX_REPLICAS {
                return Err(ServeError::Invalid(flotilla_core::Error::InvalidField {
                    at: flotilla_core::Location {
                        app: Some(app.to_string()),
                        deployment: Some(deployment.to_string()),
                    },
                    field: "num_replicas",
                    reason: format!("must be at most {MAX_REPLICAS}, got {replicas}"),
                }));
            }
            batch.put_deployment(
                &app,
                &deployment,
                &DeploymentRecord {
                    autoscaled_replicas: Some(replicas),
                },
            )?;
            Ok(())
        };
        let swap = |s: &mut ControllerState, ()| {
            info!(app = %app, deployment = %deployment, replicas, "external scaler's replica count committed");
            s.autoscaled
                .entry(app.clone())
                .or_default()
                .insert(deployment.clone(), replicas);
            ((), Vec::new())
        };
        // Commit, reply, then command (the protocol's order).
        if Self::transact(myself, state, reply, stage, swap).await?
            && let Some(actor) = state.actors.actor(&app)
        {
            let _ = actor.cast(AppMsg::SetReplicas(deployment, replicas));
        }
        Ok(())
    }

    /// Make an autoscaling decision durable (one commit), then hand it to the
    /// application. Decisions for unknown, deleting or no longer autoscaled
    /// deployments are dropped, and so are those decided under an earlier
    /// generation of the application (a redeploy may have started the
    /// deployment again from `initial_replicas`; the autoscaler decides again
    /// under the new target).
    pub(crate) async fn autoscale(
        state: &mut ControllerState,
        app: AppName,
        deployment: DeploymentName,
        replicas: u32,
        generation: u64,
    ) -> Result<(), ActorProcessingErr> {
        let Some(entry) = state.apps.get(&app) else {
            return Ok(());
        };
        if entry.record.generation != generation {
            debug!(app = %app, deployment = %deployment, replicas, generation,
                current = entry.record.generation, "autoscaling decision of an earlier target dropped");
            return Ok(());
        }
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
