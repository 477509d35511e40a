//! Flotilla: placeholder facade.
