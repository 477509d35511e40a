//! flotilla-controller: see DESIGN.md.
