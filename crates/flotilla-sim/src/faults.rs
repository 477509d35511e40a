//! The event schedule: faults to inject and operations to run, at virtual times.
//!
//! Each event is written `kind@time[:arg[:arg]]`; a schedule is a comma-separated
//! list of them (`--faults "controller@60s,node@120s,process@300s"`) or a list in a
//! scenario file. `none` is the empty schedule. Every time must fall before the
//! end of the run (the scenario's `duration`): a scenario with a later event is
//! refused ([`SimError::EventAfterEnd`]).
//!
//! | event | effect |
//! | --- | --- |
//! | `controller@T` | crash the Controller (the Supervisor restarts it) |
//! | `controller@T:before-commit` (`after-commit`, `after-reply`) | arm a Controller crash at that point of the next mutating message |
//! | `controller@T:unsettled` | the next commit is written, then reported of unknown outcome: the Controller restarts and goes by the file |
//! | `app@T[:N]` | kill N ApplicationActors (default 1) |
//! | `deployment@T[:N]` | kill N DeploymentActors |
//! | `replica@T[:N]` | kill N replica actors |
//! | `node@T[:N]` | kill N live nodes (their replicas die with them) |
//! | `node-add@T[:N]` | add N nodes (group drawn from the seed) |
//! | `ctor@T:RATE[:FOR]` | constructors fail at RATE for FOR (default 60s) |
//! | `flap@T[:N[:FOR]]` | health checks of N applications flap for FOR (defaults 10, 60s) |
//! | `commit@T` | the next checkpoint commit fails |
//! | `process@T` | crash the whole process, then start again on the same store |
//! | `update@T[:N]` | redeploy N applications with new code (a rolling update) |
//! | `scale@T[:N]` | change N applications' replica counts (in place) |
//! | `delete@T[:N]` | delete N applications |
//! | `deploy@T[:N]` | deploy N new applications |
//! | `config@T:PATH` | apply the ServeConfig file at PATH (`Serve::apply_config_file`) |
//!
//! A `config@` path in a scenario file is relative to that file; on the command
//! line, to the working directory.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use flotilla::FaultPoint;
use serde::Serialize;

use crate::{Result, SimError, scenario::parse_duration};

/// What an event does.
#[derive(Debug, Clone, PartialEq)]
pub enum EventKind {
    /// Crash the Controller now (`None`) or at a fault point of the next message.
    Controller(Option<FaultPoint>),
    /// Kill this many ApplicationActors.
    Application(usize),
    /// Kill this many DeploymentActors.
    Deployment(usize),
    /// Kill this many replica actors.
    Replica(usize),
    /// Kill this many live nodes.
    NodeLoss(usize),
    /// Add this many nodes.
    NodeAdd(usize),
    /// Constructors fail at `rate` for `for_`.
    ConstructorFailures {
        /// Failure chance per constructor call.
        rate: f64,
        /// How long.
        for_: Duration,
    },
    /// Health checks of `apps` applications flap for `for_`.
    Flap {
        /// How many applications.
        apps: usize,
        /// How long.
        for_: Duration,
    },
    /// The next checkpoint commit fails.
    CommitFailure,
    /// Crash the process and start again on the same store.
    Process,
    /// Redeploy this many applications with new code.
    Update(usize),
    /// Change this many applications' replica counts.
    Scale(usize),
    /// Delete this many applications.
    Delete(usize),
    /// Deploy this many new applications.
    Deploy(usize),
    /// Apply the ServeConfig file at this path.
    Config(PathBuf),
}

/// Which part of the system an event hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// Controller, application or deployment actors, or the store: requests
    /// through handles must not fail.
    ControlPlane,
    /// Nodes, replicas, user code: requests may fail and are retried.
    DataPlane,
    /// The whole process.
    Process,
    /// A user operation, not a fault.
    Operation,
}

/// One scheduled event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// When (virtual time from the start).
    pub at: Duration,
    /// What.
    pub kind: EventKind,
    /// As written.
    pub text: String,
}

impl Event {
    /// A short label for the chart.
    pub fn label(&self) -> String {
        match &self.kind {
            EventKind::Controller(None) => "controller".into(),
            EventKind::Controller(Some(p)) => format!("controller {}", point_name(*p)),
            EventKind::Application(n) => format!("{n} app actors"),
            EventKind::Deployment(n) => format!("{n} dep actors"),
            EventKind::Replica(n) => format!("{n} replicas"),
            EventKind::NodeLoss(n) => format!("{n} node lost"),
            EventKind::NodeAdd(n) => format!("{n} node added"),
            EventKind::ConstructorFailures { rate, .. } => {
                format!("ctor fail {:.0}%", rate * 100.0)
            }
            EventKind::Flap { apps, .. } => format!("flap {apps} apps"),
            EventKind::CommitFailure => "commit fails".into(),
            EventKind::Process => "process crash".into(),
            EventKind::Update(n) => format!("update {n}"),
            EventKind::Scale(n) => format!("scale {n}"),
            EventKind::Delete(n) => format!("delete {n}"),
            EventKind::Deploy(n) => format!("deploy {n}"),
            EventKind::Config(path) => format!(
                "config {}",
                path.file_name()
                    .unwrap_or(path.as_os_str())
                    .to_string_lossy()
            ),
        }
    }

    /// Which part of the system it hits.
    pub fn level(&self) -> Level {
        match &self.kind {
            EventKind::Controller(_)
            | EventKind::Application(_)
            | EventKind::Deployment(_)
            | EventKind::CommitFailure => Level::ControlPlane,
            EventKind::Replica(_)
            | EventKind::NodeLoss(_)
            | EventKind::NodeAdd(_)
            | EventKind::ConstructorFailures { .. }
            | EventKind::Flap { .. } => Level::DataPlane,
            EventKind::Process => Level::Process,
            EventKind::Update(_)
            | EventKind::Scale(_)
            | EventKind::Delete(_)
            | EventKind::Deploy(_)
            | EventKind::Config(_) => Level::Operation,
        }
    }
}

fn point_name(p: FaultPoint) -> String {
    match p {
        FaultPoint::ControllerBeforeCommit => "before-commit".into(),
        FaultPoint::ControllerAfterCommit => "after-commit".into(),
        FaultPoint::ControllerAfterReply => "after-reply".into(),
        FaultPoint::CommitUnsettled => "unsettled".into(),
        other => format!("{other:?}"),
    }
}

/// `entry` with a relative `config@` path made relative to `dir` instead (a
/// scenario file's entries are relative to the file); every other entry as is.
pub fn rebase(entry: &str, dir: &Path) -> String {
    match parse(entry) {
        Ok(Event {
            kind: EventKind::Config(path),
            ..
        }) if path.is_relative() => {
            let time = entry
                .trim()
                .split_once('@')
                .and_then(|(_, rest)| rest.split_once(':'))
                .map_or("", |(t, _)| t);
            format!("config@{time}:{}", dir.join(path).display())
        }
        _ => entry.to_owned(),
    }
}

/// Split a comma-separated schedule into entries (`none` or blank: no entries).
pub fn split(list: &str) -> Vec<String> {
    let list = list.trim();
    if list.is_empty() || list == "none" {
        return Vec::new();
    }
    list.split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

/// Parse a comma-separated schedule.
pub fn parse_list(list: &str) -> Result<Vec<Event>> {
    split(list).iter().map(|e| parse(e)).collect()
}

/// Parse one `kind@time[:arg[:arg]]` entry.
pub fn parse(entry: &str) -> Result<Event> {
    let entry = entry.trim();
    let err = |why: String| SimError::Fault {
        entry: entry.to_owned(),
        why,
    };
    let time = |source| SimError::FaultTime {
        entry: entry.to_owned(),
        source,
    };
    let (kind, rest) = entry
        .split_once('@')
        .ok_or_else(|| err("expected kind@time, e.g. node@120s".into()))?;
    if kind == "config" {
        // The path is everything after the time (it may hold ':').
        let (at, path) = rest
            .split_once(':')
            .filter(|(_, p)| !p.trim().is_empty())
            .ok_or_else(|| err("config needs a file, e.g. config@300s:next.yaml".into()))?;
        return Ok(Event {
            at: parse_duration(at).map_err(time)?,
            kind: EventKind::Config(PathBuf::from(path.trim())),
            text: entry.to_owned(),
        });
    }
    let mut parts = rest.split(':');
    let at = parse_duration(parts.next().unwrap_or_default()).map_err(time)?;
    let args: Vec<&str> = parts.collect();
    let count = |i: usize, default: usize| -> Result<usize> {
        match args.get(i) {
            None => Ok(default),
            Some(a) => a
                .parse::<usize>()
                .map_err(|_| err(format!("'{a}' is not a count"))),
        }
    };
    let dur = |i: usize, default: Duration| -> Result<Duration> {
        match args.get(i) {
            None => Ok(default),
            Some(a) => parse_duration(a).map_err(time),
        }
    };
    let max_args = |n: usize| -> Result<()> {
        if args.len() > n {
            Err(err(format!("'{kind}' takes at most {n} argument(s)")))
        } else {
            Ok(())
        }
    };
    let minute = Duration::from_secs(60);
    let kind = match kind {
        "controller" => {
            max_args(1)?;
            EventKind::Controller(match args.first() {
                None => None,
                Some(&"before-commit") => Some(FaultPoint::ControllerBeforeCommit),
                Some(&"after-commit") => Some(FaultPoint::ControllerAfterCommit),
                Some(&"after-reply") => Some(FaultPoint::ControllerAfterReply),
                Some(&"unsettled") => Some(FaultPoint::CommitUnsettled),
                Some(other) => {
                    return Err(err(format!(
                        "unknown point '{other}' (before-commit, after-commit, after-reply, unsettled)"
                    )));
                }
            })
        }
        "app" => (max_args(1)?, EventKind::Application(count(0, 1)?)).1,
        "deployment" => (max_args(1)?, EventKind::Deployment(count(0, 1)?)).1,
        "replica" => (max_args(1)?, EventKind::Replica(count(0, 1)?)).1,
        "node" => (max_args(1)?, EventKind::NodeLoss(count(0, 1)?)).1,
        "node-add" => (max_args(1)?, EventKind::NodeAdd(count(0, 1)?)).1,
        "ctor" => {
            max_args(2)?;
            let rate: f64 = args
                .first()
                .ok_or_else(|| err("ctor needs a rate, e.g. ctor@60s:0.3".into()))?
                .parse()
                .map_err(|_| err("the rate is not a number".into()))?;
            if !(0.0..=1.0).contains(&rate) {
                return Err(err(format!("the rate must be within 0..=1, got {rate}")));
            }
            EventKind::ConstructorFailures {
                rate,
                for_: dur(1, minute)?,
            }
        }
        "flap" => {
            max_args(2)?;
            EventKind::Flap {
                apps: count(0, 10)?,
                for_: dur(1, minute)?,
            }
        }
        "commit" => (max_args(0)?, EventKind::CommitFailure).1,
        "process" => (max_args(0)?, EventKind::Process).1,
        "update" => (max_args(1)?, EventKind::Update(count(0, 1)?)).1,
        "scale" => (max_args(1)?, EventKind::Scale(count(0, 1)?)).1,
        "delete" => (max_args(1)?, EventKind::Delete(count(0, 1)?)).1,
        "deploy" => (max_args(1)?, EventKind::Deploy(count(0, 1)?)).1,
        other => {
            return Err(err(format!(
                "unknown kind '{other}' (controller, app, deployment, replica, node, node-add, \
                 ctor, flap, commit, process, update, scale, delete, deploy, config)"
            )));
        }
    };
    Ok(Event {
        at,
        kind,
        text: entry.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn parses_every_kind_and_rejects_nonsense() {
        let evs = parse_list(
            "controller@60s,node@2m:2,process@300s,controller@1s:after-commit,ctor@10s:0.5:30s,flap@5s,update@1m30s:20,controller@2s:unsettled",
        )
        .unwrap();
        assert_eq!(evs[0].at, Duration::from_secs(60));
        assert_eq!(evs[0].kind, EventKind::Controller(None));
        assert_eq!(evs[1].kind, EventKind::NodeLoss(2));
        assert_eq!(evs[1].at, Duration::from_secs(120));
        assert_eq!(evs[2].kind, EventKind::Process);
        assert_eq!(
            evs[3].kind,
            EventKind::Controller(Some(FaultPoint::ControllerAfterCommit))
        );
        assert_eq!(
            evs[4].kind,
            EventKind::ConstructorFailures {
                rate: 0.5,
                for_: Duration::from_secs(30)
            }
        );
        assert_eq!(
            evs[5].kind,
            EventKind::Flap {
                apps: 10,
                for_: Duration::from_secs(60)
            }
        );
        assert_eq!(evs[6].kind, EventKind::Update(20));
        assert_eq!(
            evs[7].kind,
            EventKind::Controller(Some(FaultPoint::CommitUnsettled))
        );
        assert!(parse_list("none").unwrap().is_empty());
        let c = parse("config@5m:dir/next:v2.yaml").unwrap();
        assert_eq!(c.kind, EventKind::Config("dir/next:v2.yaml".into()));
        assert_eq!(c.at, Duration::from_secs(300));
        assert_eq!(c.level(), Level::Operation);
        assert_eq!(
            rebase("config@10s:next.yaml", Path::new("scenarios")),
            "config@10s:scenarios/next.yaml"
        );
        assert_eq!(rebase("node@10s:2", Path::new("scenarios")), "node@10s:2");
        for bad in [
            "node",
            "node@",
            "meteor@10s",
            "node@10s:x",
            "ctor@1s",
            "ctor@1s:2",
            "commit@1s:3",
            "config@1s",
            "config@1s:",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.to_string().contains(bad), "{e}");
        }
        // A bad time keeps the duration's error as its source.
        for bad in [
            "node@10 parsecs",
            "flap@1s:3:forever",
            "config@soon:next.yaml",
        ] {
            let e = parse(bad).unwrap_err();
            let SimError::FaultTime { entry, source } = &e else {
                panic!("{bad}: {e:?}");
            };
            assert_eq!(entry, bad);
            let chained = std::error::Error::source(&e).map(ToString::to_string);
            assert_eq!(chained, Some(source.to_string()), "{e}");
            assert!(
                e.to_string()
                    .starts_with(&format!("fault '{bad}': duration '"))
            );
        }
    }
}
