//! `all`: every scenario but `wide-deployment`, at moderate sizes, each in its
//! own child process, so the figures compare side by side in one run.

use crate::{child, error::BenchResult};

/// Flags of `all`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Tiny sizes (a smoke test of every scenario in a few seconds).
    #[arg(long)]
    pub quick: bool,
}

/// Run it.
pub async fn run(args: &Args) -> BenchResult<()> {
    let plan: &[&[&str]] = if args.quick {
        &[
            &["bulk-deploy", "--apps=2000", "--batch=500"],
            &["serial-deploy", "--apps=50"],
            &["checkpoint-scaling", "--sizes=0,2000", "--runs=3"],
            &["recovery", "--apps=200"],
            &["idle", "--apps=1000", "--seconds=2"],
            &["memory", "--apps=2000"],
            &["handle", "--calls=10000", "--seconds=1"],
        ]
    } else {
        &[
            &["bulk-deploy", "--apps=20000", "--batch=1000"],
            &["serial-deploy", "--apps=1000"],
            &["checkpoint-scaling", "--sizes=0,1000,10000"],
            &["recovery", "--apps=1000"],
            &["idle", "--apps=10000", "--seconds=10"],
            &["memory", "--apps=10000"],
            &["handle", "--calls=100000", "--seconds=3"],
        ]
    };
    for argv in plan {
        child::run(argv.iter().map(|s| (*s).to_owned()).collect()).await?;
    }
    Ok(())
}
