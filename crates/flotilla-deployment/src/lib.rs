//! flotilla-deployment: see DESIGN.md.
