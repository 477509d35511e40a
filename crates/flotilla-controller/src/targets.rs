//! Staging and swapping in new targets: the two halves around a commit.
//!
//! `stage_*` only read the state and fill a batch; `swap_*` change the state after
//! the commit succeeded. A failed commit therefore leaves memory unchanged.

use flotilla_application::publish_status;
use std::collections::BTreeMap;

use flotilla_core::{
    ApiType, AppName, AppRecord, AppStatusInputs, ApplicationSpec, ApplicationStatusInfo,
    ConfigSource, DeploymentName, DeploymentRecord, ReplicaCount, RoutePrefix,
};
use flotilla_store::{Batch, StoreError};
use tracing::info;

use crate::state::{AppEntry, ControllerState};

/// The replica decisions a new target changes, staged with it and taken in
/// after its commit.
pub(crate) struct StagedDecisions {
    /// Decisions that no longer stand.
    dropped: Vec<(AppName, DeploymentName)>,
    /// First decisions: a fixed count kept as a deployment turns autoscaled.
    seeded: Vec<(AppName, DeploymentName, u32)>,
}

impl ControllerState {
    /// `app` no longer holds `prefix` (if it did).
    fn release_route(&mut self, prefix: &RoutePrefix, app: &AppName) {
        if self.routes.get(prefix) == Some(app) {
            self.routes.remove(prefix);
            self.route_table.remove(prefix, app);
        }
    }

    /// The record of a new target for `spec`: the next generation of its name,
    /// accepted now (by the wall clock).
    pub(crate) fn next_record(
        &self,
        spec: ApplicationSpec,
        api_type: ApiType,
        config: Option<Box<ConfigSource>>,
    ) -> AppRecord {
        AppRecord {
            generation: self
                .apps
                .get(&spec.name)
                .map_or(1, |e| e.record.generation + 1),
            spec,
            deleting: false,
            api_type,
            config,
            deployed_at: Some((self.clock)()),
        }
    }

    /// Put `records` in `batch`, with the removal of the replica decisions that
    /// no longer stand:
    /// - every decision of an application deployed again while it is being
    ///   deleted: it starts afresh, as it would once its deletion ended (Ray's
    ///   `deploy` over a deleting target starts a fixed count from the
    ///   declaration, and an autoscaled one from its current target, 0,
    ///   clamped into its bounds, where Flotilla starts it from
    ///   `initial_replicas` if set);
    /// - an autoscaler's for a deployment no longer autoscaled, or whose
    ///   settings or code changed while it has `initial_replicas` (Ray's
    ///   `register` starts it again from them);
    /// - an external scaler's for one whose declared count changed (the newer
    ///   declaration wins) or whose application no longer has an external
    ///   scaler.
    ///
    /// A running deployment that turns autoscaled without `initial_replicas`
    /// keeps its count, clamped into its bounds, as its first decision (Ray's
    /// `register`: the current target, not `min_replicas`); one that stays
    /// autoscaled, without `initial_replicas` or unchanged, has its decision
    /// clamped into its new bounds (Ray's `deploy`).
    pub(crate) fn stage_targets(
        &self,
        records: &[AppRecord],
        batch: &mut Batch,
    ) -> Result<StagedDecisions, StoreError> {
        let mut dropped = Vec::new();
        let mut seeded = Vec::new();
        // A decision written with this target: durable, and told to the actor.
        let mut seed = |batch: &mut Batch, app: &AppName, dep: &DeploymentName, replicas| {
            batch.put_deployment(
                app,
                dep,
                &DeploymentRecord {
                    autoscaled_replicas: Some(replicas),
                },
            )?;
            seeded.push((app.clone(), dep.clone(), replicas));
            Ok::<_, StoreError>(())
        };
        for r in records {
            batch.put_app(r)?;
            let was_deleting = self
                .apps
                .get(&r.spec.name)
                .is_some_and(|e| e.record.deleting);
            for (dep, replicas) in self.kept_counts(r) {
                seed(batch, &r.spec.name, &dep, replicas)?;
            }
            for (dep, &decided) in self
                .autoscaled
                .get(&r.spec.name)
                .into_iter()
                .flat_map(|m| m.iter())
            {
                let declared = |r: &AppRecord| {
                    r.spec
                        .deployment(dep.as_str())
                        .map(|d| d.config.num_replicas.clone())
                };
                let redeployed = || {
                    self.apps
                        .get(&r.spec.name)
                        .and_then(|e| e.record.spec.deployment(dep.as_str()))
                        != r.spec.deployment(dep.as_str())
                };
                let still = match declared(r) {
                    _ if was_deleting => false,
                    // Ray's `register`: a deployment whose settings or code
                    // changed starts again from `initial_replicas`, which its
                    // target is without a decision.
                    Some(ReplicaCount::Auto(a)) if a.initial_replicas.is_some() && redeployed() => {
                        false
                    }
                    Some(ReplicaCount::Auto(a)) => {
                        // Ray's `deploy`: the current target clamped into the
                        // new bounds is the target (and durable), so a later
                        // widening does not bring the old count back.
                        let clamped = decided.clamp(a.min_replicas, a.max_replicas);
                        if clamped != decided {
                            seed(batch, &r.spec.name, dep, clamped)?;
                        }
                        true
                    }
                    Some(count) => {
                        r.spec.external_scaler_enabled
                            && self
                                .apps
                                .get(&r.spec.name)
                                .is_some_and(|e| declared(&e.record) == Some(count))
                    }
                    None => false,
                };
                if !still {
                    batch.delete_deployment(&r.spec.name, dep);
                    dropped.push((r.spec.name.clone(), dep.clone()));
                }
            }
        }
        Ok(StagedDecisions { dropped, seeded })
    }

    /// The deployments of `r` that turn autoscaled, without `initial_replicas`,
    /// from a fixed count that runs now, with that count clamped into their
    /// bounds.
    fn kept_counts(&self, r: &AppRecord) -> Vec<(DeploymentName, u32)> {
        let Some(old) = self
            .apps
            .get(&r.spec.name)
            .map(|e| &e.record)
            .filter(|old| !old.deleting)
        else {
            return Vec::new();
        };
        let decided = self.autoscaled.get(&r.spec.name);
        r.spec
            .deployments
            .iter()
            .filter_map(|d| {
                let ReplicaCount::Auto(a) = &d.config.num_replicas else {
                    return None;
                };
                if a.initial_replicas.is_some() || decided.is_some_and(|m| m.contains_key(&d.name))
                {
                    return None;
                }
                match old.spec.deployment(d.name.as_str())?.config.num_replicas {
                    ReplicaCount::Fixed(n) => {
                        Some((d.name.clone(), n.clamp(a.min_replicas, a.max_replicas)))
                    }
                    ReplicaCount::Auto(_) => None,
                }
            })
            .collect()
    }

    /// After the commit: take `records` in, keep the route index, publish
    /// DEPLOYING at each new generation. Returns the names, in order.
    pub(crate) fn swap_targets(
        &mut self,
        records: Vec<AppRecord>,
        decisions: StagedDecisions,
    ) -> Vec<AppName> {
        for (app, dep) in decisions.dropped {
            if let Some(m) = self.autoscaled.get_mut(&app) {
                m.remove(&dep);
            }
        }
        for (app, dep, replicas) in decisions.seeded {
            self.autoscaled
                .entry(app)
                .or_default()
                .insert(dep, replicas);
        }
        let mut names = Vec::with_capacity(records.len());
        for r in records {
            let name = r.spec.name.clone();
            if let Some(old) = self
                .apps
                .get(&name)
                .and_then(|e| e.record.spec.route_prefix.clone())
            {
                self.release_route(&old, &name);
            }
            self.logging.set_target(&r.spec);
            // On the board before its route: the proxy reads a route whose
            // application is not on the board as one being deleted.
            self.board
                .publish(&name, Some(&r.spec.ingress), accepted_status(&r));
            if let Some(p) = &r.spec.route_prefix {
                self.routes.insert(p.clone(), name.clone());
                self.route_table
                    .insert(p.clone(), name.clone(), r.spec.ingress.clone());
            }
            info!(app = %name, generation = r.generation, "application target accepted");
            match self.apps.get_mut(&name) {
                Some(e) => e.record = r,
                None => {
                    self.apps.insert(name.clone(), AppEntry { record: r });
                }
            }
            names.push(name);
        }
        names
    }

    /// Put the deletion of every live application in `names` in `batch` (unknown
    /// and already deleting ones are skipped). Returns the new records.
    pub(crate) fn stage_deletions(
        &self,
        names: &[AppName],
        batch: &mut Batch,
    ) -> Result<Vec<AppRecord>, StoreError> {
        let mut changed = Vec::new();
        for name in names {
            if let Some(e) = self.apps.get(name)
                && !e.record.deleting
            {
                let mut r = e.record.clone();
                r.deleting = true;
                r.generation += 1;
                batch.put_app(&r)?;
                changed.push(r);
            }
        }
        Ok(changed)
    }

    /// After the commit: release their route prefixes and publish DELETING.
    pub(crate) fn swap_deletions(&mut self, changed: &[AppRecord]) {
        for r in changed {
            let name = &r.spec.name;
            if let Some(p) = &r.spec.route_prefix {
                self.release_route(p, name);
            }
            let tx = self
                .board
                .sender(name, Some(&r.spec.ingress), || accepted_status(r));
            // What the deployments last said stays shown while they are removed.
            let reported = tx.borrow().deployments.clone();
            let deleting = ApplicationStatusInfo::derive(AppStatusInputs {
                record: Some(r),
                reported: &reported,
                build_failure: None,
            });
            publish_status(&tx, name, deleting);
            info!(app = %name, generation = r.generation, "application deletion accepted");
            if let Some(e) = self.apps.get_mut(name) {
                e.record = r.clone();
            }
        }
    }
}

/// The status of a target just accepted (or recovered): nothing reported yet,
/// so every deployment is UPDATING and the application DEPLOYING (DELETING if
/// the target is its deletion).
pub(crate) fn accepted_status(record: &AppRecord) -> ApplicationStatusInfo {
    ApplicationStatusInfo::derive(AppStatusInputs {
        record: Some(record),
        reported: &BTreeMap::new(),
        build_failure: None,
    })
}
