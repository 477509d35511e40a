//! The flags and deploy of a scenario that measures a deployed fleet at rest
//! (`idle`, `memory`).

use flotilla::Serve;
use flotilla_benches::{
    error::BenchResult,
    workload::{Shape, deploy_running, secs},
};

/// The flags of a scenario that measures a deployed fleet at rest.
#[derive(Debug, Clone, clap::Args)]
pub struct Fleet {
    /// Applications to deploy.
    #[arg(long, default_value_t = 10_000)]
    pub apps: usize,
    /// Batch size of the deploy.
    #[arg(long, default_value_t = 1_000)]
    pub batch: usize,
    /// Give up deploying after this many seconds.
    #[arg(long, default_value_t = 1_800)]
    pub timeout_s: u64,
}

impl Fleet {
    /// Deploy the fleet (applications `{prefix}{i}` of the default shape) and
    /// wait until every one is RUNNING.
    pub async fn deploy(&self, serve: &Serve, prefix: &str) -> BenchResult<()> {
        deploy_running(
            serve,
            prefix,
            self.apps,
            self.batch,
            Shape::default(),
            secs(self.timeout_s),
        )
        .await
        .map(drop)
    }
}
