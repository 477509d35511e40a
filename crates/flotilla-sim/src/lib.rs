//! The cluster simulator: simulated nodes, resources, placement, faults and virtual
//! time, driving Flotilla at scale.
//!
//! Not built yet (see the cluster simulator issue). It will implement the
//! `Cluster` trait of `flotilla-deployment`; it must never be a dependency of the
//! control plane itself.
