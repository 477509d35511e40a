//! flotilla-replica: see DESIGN.md.
