//! Publishing an application's status without ever going back a generation.

use flotilla_core::ApplicationStatusInfo;
use tokio::sync::watch;

/// Publish `info` unless the channel already holds a newer generation; wakes
/// watchers only on a real change. Returns whether it changed.
pub fn publish_status(
    tx: &watch::Sender<ApplicationStatusInfo>,
    info: ApplicationStatusInfo,
) -> bool {
    tx.send_if_modified(|cur| {
        if info.observed_generation >= cur.observed_generation && *cur != info {
            *cur = info;
            true
        } else {
            false
        }
    })
}
