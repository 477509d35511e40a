//! flotilla-benches: the code Flotilla's benchmarks share, and nothing else.
//!
//! The benchmarks themselves are this package's bench targets, run by `cargo bench`
//! from the repository root:
//!
//! - `benches/scenarios.rs` (`cargo bench --bench scenarios -- SCENARIO [--flags]`):
//!   the scenario program, one JSON figure per line (bulk-deploy, serial-deploy,
//!   checkpoint-scaling, recovery, idle, memory, handle, all);
//! - `benches/micro.rs` (`cargo bench --bench micro`): criterion micro-benchmarks of
//!   the hot paths (a handle call, a checkpoint commit, `plan()`, status derivation);
//! - `benches/proxy.rs`, `benches/batch_multiplex.rs` and `benches/nodes.rs`
//!   (`cargo bench --bench proxy`, ...): the HTTP proxy, batching and
//!   multiplexing, and nodes on loopback, each against its baseline in one run,
//!   one JSON figure per line.
//!
//! This library holds what both use: the trivial deployments and a temporary store
//! ([`workload`]), the JSON figures ([`report`]), process figures from /proc ([`sys`]),
//! the error type ([`error`]), and the floor that bulk-deploy and recovery are
//! divided by ([`floor`]). It is no part of Flotilla: it is not published, and the
//! bench-only crates it pulls in (clap, mimalloc, criterion) are no dependency of
//! `flotilla`. How to read the figures: BENCHMARKS.md.

pub mod error;
pub mod floor;
pub mod report;
pub mod sys;
pub mod workload;
