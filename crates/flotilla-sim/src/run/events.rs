//! Playing the event schedule: each event goes to its fault or operation, then
//! is recorded (summary record, timeline mark) and followed until the system
//! converged after it.

use super::{setup::Sim, shared::Follow, timeline::Mark};
use crate::{
    Result,
    faults::{Event, EventKind},
    summary::EventRecord,
};

/// A control-plane window stays open at least this long (seconds).
pub(super) const CONTROL_WINDOW: f64 = 30.0;
/// A data-plane window stays open at least this long (seconds).
pub(super) const DATA_WINDOW: f64 = 30.0;
/// An event that disturbs nothing for this long counts as absorbed (seconds).
const ABSORBED_AFTER: f64 = 15.0;

impl Sim {
    /// Apply event `e` and record what it did.
    pub(super) async fn inject(&mut self, e: Event) -> Result<()> {
        let now = self.shared.now();
        let effect = match e.kind.clone() {
            EventKind::Controller(None) => self.crash_controller(now).await?,
            EventKind::Controller(Some(point)) => self.arm_controller_crash(point, now)?,
            EventKind::Application(n) => self.kill_applications(n, now)?,
            EventKind::Deployment(n) => self.kill_deployments(n, now)?,
            EventKind::Replica(n) => self.kill_replicas(n, now)?,
            EventKind::NodeLoss(n) => self.lose_nodes(n, now),
            EventKind::NodeAdd(n) => self.add_nodes(n),
            EventKind::ConstructorFailures { rate, for_ } => {
                self.constructor_failures(rate, e.at, for_)
            }
            EventKind::Flap { apps, for_ } => self.flap(apps, e.at, for_, now),
            EventKind::CommitFailure => self.fail_next_commit(now)?,
            EventKind::Process => self.crash_process(now).await?,
            EventKind::Update(n) => self.update(n).await?,
            EventKind::Scale(n) => self.scale(n).await?,
            EventKind::Delete(n) => self.delete(n, now).await?,
            EventKind::Deploy(n) => self.deploy_new(n).await?,
            EventKind::Config(path) => {
                let config = self.configs.scheduled(&path)?;
                self.apply_config(&config, now).await?
            }
        };
        self.mark(&e, effect);
        Ok(())
    }

    /// `n` distinct members of `from`, drawn from the driver's stream.
    pub(super) fn pick(&mut self, from: &[u32], n: usize) -> Vec<u32> {
        self.rng
            .sample(from.len(), n)
            .into_iter()
            .map(|i| from[i])
            .collect()
    }

    /// Record event `e` and what it did, and follow it until the system
    /// converged after it.
    fn mark(&self, e: &Event, effect: String) {
        let t = self.shared.now();
        let mut o = self.shared.observed();
        let record = o.records.len();
        o.records.push(EventRecord {
            at_s: t,
            event: e.text.clone(),
            effect: effect.clone(),
            disturbed_apps: 0,
            converged_after_s: None,
        });
        let lasting = match e.kind {
            EventKind::Flap { for_, .. } | EventKind::ConstructorFailures { for_, .. } => {
                for_.as_secs_f64()
            }
            _ => 0.0,
        };
        o.follows.push(Follow {
            record,
            at: t,
            quiet_until: t + lasting + ABSORBED_AFTER,
            disturbed: false,
        });
        o.marks.push(Mark {
            t,
            label: e.label(),
            level: e.level(),
        });
        drop(o);
        self.shared.say(format!("{}: {effect}", e.text));
    }
}
