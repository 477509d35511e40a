//! flotilla-application: see DESIGN.md.
