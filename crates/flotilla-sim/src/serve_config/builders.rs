//! The application builders a ServeConfig can name in the simulation.
//!
//! ```yaml
//! applications:
//!   - name: search
//!     import_path: sim.chain:app
//!     args: {deployments: 2, replicas: 3, tag: v1, broken: false}  # all optional
//!   - name: legacy
//!     import_path: sim.failing:app
//!     args: {why: "the model store is unreachable"}                # optional
//! ```

use flotilla::{ApplicationSpec, Args, Registry, SpecError, UserError};
use serde::{Deserialize, Serialize};

use crate::{
    Result, SetupError,
    scenario::WorkloadSpec,
    workload::{DECLARED_WORKER, DeclaredWorkerArgs, deployment_name, worker_deployment},
};

/// The builder of a chain of simulated workers ([`ChainArgs`]).
pub const CHAIN_APP: &str = "sim.chain:app";

/// The builder that always fails ([`FailingArgs`]): its application must end
/// DEPLOY_FAILED.
pub const FAILING_APP: &str = "sim.failing:app";

/// Every builder the simulator registers.
pub const BUILDERS: [&str; 2] = [CHAIN_APP, FAILING_APP];

/// `args` of [`CHAIN_APP`]: every field optional. The deployments are `d0` (the
/// ingress, called by requests) to `d{n-1}`, each calling the next; they reserve
/// the workload's CPUs and memory per replica and use its health check period
/// (a config's overrides may change all of that).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ChainArgs {
    /// Deployments in the chain (default: the workload's).
    pub deployments: Option<u32>,
    /// Replicas per deployment (default: the workload's).
    pub replicas: Option<u32>,
    /// Code tag: another tag is a code change, so replicas roll (default `v1`).
    pub tag: Option<String>,
    /// Broken code: every constructor fails, so the application must end
    /// DEPLOY_FAILED.
    pub broken: bool,
}

/// `args` of [`FAILING_APP`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FailingArgs {
    /// What the builder says when it fails.
    pub why: Option<String>,
}

/// Why a builder cannot make its application from a config's `args`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuilderError {
    /// The `args` are not the builder's (an unknown field, a wrong type).
    #[error("args for {builder}: {source}")]
    Args {
        /// The builder ([`CHAIN_APP`] or [`FAILING_APP`]).
        builder: &'static str,
        /// Why they do not decode.
        source: Box<SpecError>,
    },
    /// [`ChainArgs::deployments`] is 0.
    #[error("args for {}: deployments must be at least 1", CHAIN_APP)]
    NoDeployments,
    /// The chain's spec is invalid (Flotilla's validation).
    #[error("{}: {}", CHAIN_APP, .0)]
    Spec(#[source] Box<SpecError>),
}

impl ChainArgs {
    /// Decode a config's `args`.
    pub fn decode(args: &Args) -> Result<ChainArgs, BuilderError> {
        args.decode().map_err(|source| BuilderError::Args {
            builder: CHAIN_APP,
            source: Box::new(source),
        })
    }

    /// The application this builds under `workload`'s defaults (named `chain`:
    /// a config entry renames it).
    pub fn spec(&self, workload: &WorkloadSpec) -> Result<ApplicationSpec, BuilderError> {
        let chain = self.deployments.unwrap_or(workload.deployments as u32);
        if chain == 0 {
            return Err(BuilderError::NoDeployments);
        }
        let replicas = self.replicas.unwrap_or(workload.replicas);
        let tag = self.tag.clone().unwrap_or_else(|| "v1".to_owned());
        let mut b = ApplicationSpec::builder("chain");
        for d in 0..chain {
            let args = DeclaredWorkerArgs {
                deployment: d,
                chain,
                tag: tag.clone(),
                broken: self.broken,
            };
            b = b.deployment(worker_deployment(
                workload,
                d,
                DECLARED_WORKER,
                &args,
                replicas,
            ));
        }
        b.ingress(deployment_name(0))
            .build()
            .map_err(|e| BuilderError::Spec(Box::new(e)))
    }
}

impl FailingArgs {
    /// Decode a config's `args`.
    pub fn decode(args: &Args) -> Result<FailingArgs, BuilderError> {
        args.decode().map_err(|source| BuilderError::Args {
            builder: FAILING_APP,
            source: Box::new(source),
        })
    }

    /// The builder's error message.
    pub fn message(&self) -> String {
        format!(
            "simulated builder failure: {}",
            self.why
                .as_deref()
                .unwrap_or("the application's model store is unreachable")
        )
    }
}

/// `registry` with the simulator's application builders, building under
/// `workload`'s defaults.
pub fn register_builders(registry: Registry, workload: &WorkloadSpec) -> Result<Registry> {
    let w = workload.clone();
    registry
        .register_app(CHAIN_APP, move |args: Args| {
            let built = ChainArgs::decode(&args).and_then(|a| a.spec(&w));
            async move { built.map_err(|e| UserError::new(e.to_string())) }
        })
        .and_then(|r| {
            r.register_app(FAILING_APP, |args: Args| {
                let why =
                    FailingArgs::decode(&args).map_or_else(|e| e.to_string(), |a| a.message());
                async move { Err::<ApplicationSpec, _>(UserError::new(why)) }
            })
        })
        .map_err(|source| {
            SetupError::Register {
                what: "the application builders",
                source: Box::new(source),
            }
            .into()
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn chain_args_default_to_the_workload_and_build_a_chain() {
        let w = WorkloadSpec {
            deployments: 2,
            replicas: 3,
            ..Default::default()
        };
        let spec = ChainArgs::default().spec(&w).unwrap();
        assert_eq!(spec.deployments.len(), 2);
        assert_eq!(spec.ingress.as_str(), "d0");
        let four = ChainArgs {
            deployments: Some(4),
            replicas: Some(1),
            ..Default::default()
        };
        assert_eq!(four.spec(&w).unwrap().deployments.len(), 4);
        let none = ChainArgs {
            deployments: Some(0),
            ..Default::default()
        };
        let e = none.spec(&w).unwrap_err();
        assert_eq!(e, BuilderError::NoDeployments);
        assert_eq!(
            e.to_string(),
            "args for sim.chain:app: deployments must be at least 1"
        );
        let typo = Args::encode(&serde_json::json!({"replica": 2})).unwrap();
        let e = ChainArgs::decode(&typo).unwrap_err();
        assert!(
            matches!(&e, BuilderError::Args { builder: CHAIN_APP, source } if source.to_string().contains("replica")),
            "{e:?}"
        );
        assert!(e.to_string().starts_with("args for sim.chain:app: "), "{e}");
        let e = FailingArgs::decode(&typo).unwrap_err();
        assert!(
            e.to_string().starts_with("args for sim.failing:app: "),
            "{e}"
        );
        assert!(
            FailingArgs::default()
                .message()
                .contains("simulated builder failure")
        );
    }
}
