//! flotilla-store: see DESIGN.md.
