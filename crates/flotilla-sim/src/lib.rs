//! flotilla-sim: see DESIGN.md.
