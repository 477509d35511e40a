//! ServeConfig deploys in the simulation: the application builders a config can
//! name, and the configs a run applies, loaded and checked before anything runs.
//!
//! A scenario may name a ServeConfig file (Ray Serve's `serve deploy` format, the
//! file `Serve::apply_config_file` applies) with `serve_config:` or
//! `--serve-config`, and schedule more with `config@T:PATH` events. The run
//! applies each through `Serve::apply_config_file`, next to (or instead of) the
//! imperative workload, so its applications live on the simulated nodes, take
//! traffic, and go through every fault like the others; after a process crash
//! the applied config comes back from Flotilla's checkpoint, never from the
//! simulator applying it again.
//!
//! The simulator registers two application builders ([`builders`]):
//! `sim.chain:app` builds a chain of simulated workers (its `args` choose the
//! chain's length, replicas, code tag, and broken code), and `sim.failing:app`
//! always fails, so its application must end DEPLOY_FAILED. [`load`] reads a
//! config and predicts what each of its applications must become: the
//! builder's spec with the config's overrides laid over it (Flotilla's own
//! `apply_overrides`, as the Controller does), or DEPLOY_FAILED and why.

pub mod builders;
pub mod load;

pub use builders::{
    BUILDERS, BuilderError, CHAIN_APP, ChainArgs, FAILING_APP, FailingArgs, register_builders,
};
pub use load::{
    Build, BuildFailure, ConfigAppError, Configs, DeclaredApp, LoadedConfig, Unplaceable,
};
