//! Publishing an application's status without ever going back a generation,
//! and logging each transition where it is published.

use flotilla_core::{AppName, ApplicationStatusInfo};
use tokio::sync::watch;
use tracing::info;

/// Publish `app`'s status `info` unless the channel already holds a newer
/// generation; wakes watchers only on a real change, and logs a change of
/// status or message (`application status`, with `from` and `to`). Every
/// publisher goes through here (the Controller when it accepts, deletes or
/// fails to build a target; the ApplicationActor as its deployments report),
/// so every transition watchers see is logged once. Returns whether it
/// changed.
pub fn publish_status(
    tx: &watch::Sender<ApplicationStatusInfo>,
    app: &AppName,
    info: ApplicationStatusInfo,
) -> bool {
    let mut transition = None;
    let seen = &mut transition;
    let changed = tx.send_if_modified(move |cur| {
        if info.observed_generation >= cur.observed_generation && *cur != info {
            if cur.status != info.status || cur.message != info.message {
                let to = (info.observed_generation, info.status, info.message.clone());
                *seen = Some((cur.status, to));
            }
            *cur = info;
            true
        } else {
            false
        }
    });
    if let Some((from, (generation, to, detail))) = transition {
        info!(app = %app, generation, %from, %to, %detail, "application status");
    }
    changed
}
