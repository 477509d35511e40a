//! Applying ServeConfigs, as a user would with `Serve::apply_config_file`, and
//! the model following each acknowledged one: the applications it names are
//! present at what it declares, the declared applications it no longer names
//! are deleted.
//!
//! A declared application has an index like every other (the next free one,
//! the first time its name appears), so traffic, fault windows and the
//! simulated code's random streams treat it alike.

use std::{collections::BTreeSet, sync::Arc};

use super::{
    model::{Declared, Slot, Target},
    operations::attempts_note,
    setup::Sim,
};
use crate::{
    Result,
    serve_config::{DeclaredApp, LoadedConfig},
};

impl Sim {
    /// The index of declared application `name`: the one it had, or the next
    /// free one.
    fn index_for(&mut self, name: &str) -> u32 {
        let names = self.shared.world.names().clone();
        if let Some(i) = names.declared(name) {
            return i;
        }
        let i = self.next_app;
        self.next_app += 1;
        names.declare(name, i);
        i
    }

    /// Apply `config` (its file, through `Serve::apply_config_file`) until
    /// acknowledged, then update the model (`now`: virtual seconds, for the
    /// window that excuses failed requests to the applications it drops).
    pub(super) async fn apply_config(&mut self, config: &LoadedConfig, now: f64) -> Result<String> {
        let named: Vec<(u32, Arc<DeclaredApp>)> = config
            .apps
            .iter()
            .map(|a| (self.index_for(&a.name), a.clone()))
            .collect();
        let keep: BTreeSet<u32> = named.iter().map(|(i, _)| *i).collect();
        let gone: Vec<u32> = self
            .shared
            .model()
            .present_declared()
            .into_iter()
            .map(|(i, _)| i)
            .filter(|i| !keep.contains(i))
            .collect();
        if !gone.is_empty() {
            self.deleting(&gone, now);
        }
        let path = config.path.clone();
        let what = format!("applying {}", path.display());
        let attempts = self
            .until_acked(&what, |serve| {
                let path = path.clone();
                async move { serve.apply_config_file(&path).await }
            })
            .await?;
        if attempts.is_some() {
            let mut m = self.shared.model();
            for i in &gone {
                m.set(*i, Slot::Deleted);
            }
            for (i, app) in &named {
                let before = m.target(*i).and_then(Target::declared).cloned();
                let target = Declared::after(app.clone(), before.as_ref());
                m.set(*i, Slot::Present(Target::Declared(target)));
            }
        }
        Ok(format!(
            "applied {}: {} apps ({} must fail), {} dropped{}",
            config
                .path
                .file_name()
                .unwrap_or(config.path.as_os_str())
                .to_string_lossy(),
            named.len(),
            config.failing(),
            gone.len(),
            attempts_note(attempts)
        ))
    }
}
