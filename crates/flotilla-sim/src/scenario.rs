//! What to simulate: the cluster, the applications, the traffic and the event
//! schedule, from defaults, a YAML scenario file, and flags on top.
//!
//! A scenario file holds any subset of the fields below; everything left out
//! keeps its default. Durations are text (`250ms`, `90s`, `15m`, `1h`, `1m30s`).
//!
//! ```yaml
//! seed: 7
//! duration: 10m
//! cluster:
//!   strategy: pack
//!   groups:
//!     - { name: std, count: 8, cpus: 16, memory_gib: 64 }
//!     - { name: big, count: 2, cpus: 64, memory_gib: 256 }
//! workload: { apps: 500, replicas: 3, constructor_failure_rate: 0.1 }
//! traffic: { rate: 100 }
//! faults: ["controller@30s", "node@60s", "process@120s"]
//! serve_config: serve_config.yaml   # also deploy this ServeConfig (see crate::serve_config)
//! ```
//!
//! Paths in a scenario file (`serve_config`, `config@T:PATH` events) are relative
//! to the file; [`Scenario::from_file`] makes them relative to the working
//! directory.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{Deserialize, Deserializer, Serialize};

use crate::{
    Result, SimError,
    cluster::{NodeGroup, Strategy},
    faults::{self, Event},
};

/// A duration that [`parse_duration`] cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("duration '{text}': {why} (write e.g. 90s, 15m, 1h, 250ms)")]
pub struct DurationError {
    /// The text as written.
    pub text: String,
    /// What is wrong with it.
    pub why: &'static str,
}

/// Parse a duration written as number-unit pairs: `250ms`, `90s`, `15m`, `1h`,
/// `1m30s`. A bare number is seconds.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let err = |why: &'static str| DurationError {
        text: text.to_owned(),
        why,
    };
    let t = text.trim();
    if t.is_empty() {
        return Err(err("empty"));
    }
    if let Ok(secs) = t.parse::<f64>() {
        return secs_to_duration(secs).ok_or_else(|| err("must be a finite, non-negative number"));
    }
    let mut total = 0.0;
    let mut rest = t;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| err("a number needs a unit (ms, s, m, h)"))?;
        if num_len == 0 {
            return Err(err("expected a number"));
        }
        let value: f64 = rest[..num_len].parse().map_err(|_| err("not a number"))?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ms" => 0.001,
            "s" => 1.0,
            "m" | "min" => 60.0,
            "h" => 3600.0,
            _ => return Err(err("unknown unit")),
        };
        total += value * scale;
        rest = &rest[unit_len..];
    }
    secs_to_duration(total).ok_or_else(|| err("out of range"))
}

fn secs_to_duration(secs: f64) -> Option<Duration> {
    (0.0..1e12)
        .contains(&secs)
        .then(|| Duration::from_secs_f64(secs))
}

/// Format a duration the way [`parse_duration`] reads it back.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if !ms.is_multiple_of(1000) {
        format!("{ms}ms")
    } else {
        format!("{}s", ms / 1000)
    }
}

fn de_duration<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Duration, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Text(String),
        Secs(f64),
    }
    match Raw::deserialize(d)? {
        Raw::Text(t) => parse_duration(&t).map_err(serde::de::Error::custom),
        Raw::Secs(s) => secs_to_duration(s)
            .ok_or_else(|| serde::de::Error::custom("a duration must be finite and >= 0")),
    }
}

fn ser_duration<S: serde::Serializer>(d: &Duration, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(&format_duration(*d))
}

/// The simulated cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSpec {
    /// Placement strategy.
    pub strategy: Strategy,
    /// Node groups.
    pub groups: Vec<NodeGroup>,
}

impl Default for ClusterSpec {
    fn default() -> Self {
        let g = |name: &str, count, cpus, memory_gib| NodeGroup {
            name: name.to_owned(),
            count,
            cpus,
            memory_gib,
            gpus: 0.0,
        };
        ClusterSpec {
            strategy: Strategy::Spread,
            groups: vec![
                g("standard", 12, 32.0, 128.0),
                g("large", 6, 64.0, 256.0),
                g("small", 2, 16.0, 64.0),
            ],
        }
    }
}

impl ClusterSpec {
    /// Nodes over all groups.
    pub fn nodes(&self) -> usize {
        self.groups
            .iter()
            .fold(0usize, |n, g| n.saturating_add(g.count))
    }

    /// CPUs over all nodes.
    pub fn cpus(&self) -> f64 {
        self.groups.iter().map(|g| g.count as f64 * g.cpus).sum()
    }

    /// Resize to `n` nodes, keeping the groups' proportions (largest remainder).
    pub fn scale_to(&mut self, n: usize) {
        let total = self.nodes().max(1) as f64;
        let shares: Vec<f64> = self
            .groups
            .iter()
            .map(|g| g.count as f64 * n as f64 / total)
            .collect();
        let mut counts: Vec<usize> = shares.iter().map(|s| s.floor() as usize).collect();
        let mut left = n.saturating_sub(counts.iter().sum());
        let mut order: Vec<usize> = (0..shares.len()).collect();
        order.sort_by(|a, b| {
            let ra = shares[*a] - shares[*a].floor();
            let rb = shares[*b] - shares[*b].floor();
            rb.total_cmp(&ra).then(a.cmp(b))
        });
        for i in order {
            if left == 0 {
                break;
            }
            counts[i] += 1;
            left -= 1;
        }
        for (g, c) in self.groups.iter_mut().zip(counts) {
            g.count = c;
        }
    }
}

/// A replica's start latency: log-normal, capped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LatencySpec {
    /// Median.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub median: Duration,
    /// Shape (log-space standard deviation); 0 makes it constant.
    pub sigma: f64,
    /// Cap.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub max: Duration,
}

/// The applications.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkloadSpec {
    /// Applications deployed at the start (0 is allowed when a ServeConfig
    /// declares the applications).
    pub apps: usize,
    /// Deployments per application (the ingress calls the next, in a chain).
    pub deployments: usize,
    /// Replicas per deployment.
    pub replicas: u32,
    /// Applications per `run_many` call (one commit each).
    pub batch: usize,
    /// Virtual time between two batches.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub batch_every: Duration,
    /// Applications whose code is broken (their constructor always fails): they
    /// must end DEPLOY_FAILED, and nothing else may.
    pub broken_apps: usize,
    /// CPUs each replica reserves.
    pub replica_cpus: f64,
    /// Memory each replica reserves, MiB.
    pub replica_memory_mib: u64,
    /// Constructor latency.
    pub start_latency: LatencySpec,
    /// Chance that a constructor call fails (on top of broken applications).
    pub constructor_failure_rate: f64,
    /// Health check period of every deployment.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub health_check_period: Duration,
    /// Chance that one health check fails while its application flaps.
    pub flap_failure_rate: f64,
}

impl Default for WorkloadSpec {
    fn default() -> Self {
        WorkloadSpec {
            apps: 2_000,
            deployments: 1,
            replicas: 2,
            batch: 200,
            batch_every: Duration::from_secs(1),
            broken_apps: 3,
            replica_cpus: 0.1,
            replica_memory_mib: 256,
            start_latency: LatencySpec {
                median: Duration::from_millis(1_500),
                sigma: 0.6,
                max: Duration::from_secs(20),
            },
            constructor_failure_rate: 0.05,
            health_check_period: Duration::from_secs(10),
            flap_failure_rate: 0.7,
        }
    }
}

/// One class of request latency in the traffic mix.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LatencyClass {
    /// Relative weight.
    pub weight: f64,
    /// How long the request runs in its replica.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub latency: Duration,
}

/// The traffic through handles.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrafficSpec {
    /// Requests per (virtual) second over all applications, round-robin.
    pub rate: f64,
    /// Per-attempt timeout (queueing included).
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub timeout: Duration,
    /// Attempts per request (1 = no retry).
    pub attempts: u32,
    /// Wait before a retry.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub retry_backoff: Duration,
    /// The latency mix.
    pub latencies: Vec<LatencyClass>,
}

impl Default for TrafficSpec {
    fn default() -> Self {
        let c = |weight, ms| LatencyClass {
            weight,
            latency: Duration::from_millis(ms),
        };
        TrafficSpec {
            rate: 200.0,
            timeout: Duration::from_secs(10),
            attempts: 3,
            retry_backoff: Duration::from_millis(500),
            latencies: vec![c(70.0, 2), c(20.0, 20), c(8.0, 200), c(2.0, 2_000)],
        }
    }
}

/// Most nodes a scenario may simulate.
pub const MAX_NODES: usize = 100_000;

/// Most requests per second a scenario may send (the traffic generator
/// starts each tick's requests in one go).
pub const MAX_RATE: f64 = 1_000_000.0;

/// The default event schedule (times from the start of the run).
pub const DEFAULT_FAULTS: &str = "controller@15s,node@60s,deployment@80s:40,app@100s:40,\
commit@120s,update@120s:200,controller@150s:after-commit,scale@150s:100,flap@180s:50:60s,\
node-add@200s,replica@240s:50,process@300s,controller@355s:unsettled,delete@360s:50,\
deploy@380s:50,controller@420s,\
ctor@440s:0.5:40s,node@450s,node-add@500s";

/// A whole simulation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Scenario {
    /// Everything random derives from this.
    pub seed: u64,
    /// How long traffic runs and events are injected (virtual time, from the start).
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub duration: Duration,
    /// How often the timeline is sampled (virtual time).
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub sample_every: Duration,
    /// How long to wait for convergence after the last event before judging.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub settle_timeout: Duration,
    /// The cluster.
    pub cluster: ClusterSpec,
    /// The applications.
    pub workload: WorkloadSpec,
    /// The traffic.
    pub traffic: TrafficSpec,
    /// The event schedule: faults and operations, each `kind@time[:args]`
    /// (see [`crate::faults`]), every time before `duration`.
    pub faults: Vec<String>,
    /// A ServeConfig file to apply at the start, next to the workload (see
    /// [`crate::serve_config`]).
    pub serve_config: Option<PathBuf>,
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario {
            seed: 1,
            duration: Duration::from_secs(600),
            sample_every: Duration::from_secs(1),
            settle_timeout: Duration::from_secs(900),
            cluster: ClusterSpec::default(),
            workload: WorkloadSpec::default(),
            traffic: TrafficSpec::default(),
            faults: faults::split(DEFAULT_FAULTS),
            serve_config: None,
        }
    }
}

/// Flags that override a scenario (each `None` keeps the scenario's value).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    /// Total nodes (groups keep their proportions).
    pub nodes: Option<usize>,
    /// Applications.
    pub apps: Option<usize>,
    /// Deployments per application.
    pub deployments: Option<usize>,
    /// Replicas per deployment.
    pub replicas: Option<u32>,
    /// Applications per batch.
    pub batch: Option<usize>,
    /// Run length (virtual).
    pub duration: Option<Duration>,
    /// Event schedule, comma-separated (`none` for no events).
    pub faults: Option<String>,
    /// Seed.
    pub seed: Option<u64>,
    /// Placement strategy.
    pub strategy: Option<Strategy>,
    /// Requests per second.
    pub rate: Option<f64>,
    /// Constructor failure rate.
    pub constructor_failure_rate: Option<f64>,
    /// A ServeConfig file to apply at the start (relative to the working directory).
    pub serve_config: Option<PathBuf>,
}

impl Scenario {
    /// Read a YAML scenario file (fields left out keep their defaults). Its
    /// relative paths are made relative to the working directory.
    pub fn from_file(path: &Path) -> Result<Scenario> {
        let text = std::fs::read_to_string(path).map_err(|source| SimError::ReadScenario {
            path: path.to_owned(),
            source,
        })?;
        let mut s = Scenario::from_yaml(&text).map_err(|e| SimError::ParseScenario {
            path: path.to_owned(),
            source: Box::new(e),
        })?;
        let dir = path.parent().unwrap_or(Path::new(""));
        s.rebase(dir);
        Ok(s)
    }

    /// Make the scenario's relative paths relative to `dir` instead.
    pub fn rebase(&mut self, dir: &Path) {
        if let Some(p) = &mut self.serve_config
            && p.is_relative()
        {
            *p = dir.join(&*p);
        }
        for f in &mut self.faults {
            *f = faults::rebase(f, dir);
        }
    }

    /// Parse a YAML scenario.
    pub fn from_yaml(text: &str) -> Result<Scenario> {
        let mut s: Scenario = serde_saphyr::from_str(text).map_err(SimError::ScenarioYaml)?;
        s.fit_default_faults();
        s.validate()?;
        Ok(s)
    }

    /// A run shorter than the default schedule keeps its events that fit:
    /// nobody wrote the others. (A schedule somebody wrote is held to the
    /// duration by `validate`; one written identical to the default is taken
    /// for it.)
    fn fit_default_faults(&mut self) {
        if self.faults == faults::split(DEFAULT_FAULTS) {
            let end = self.duration;
            self.faults
                .retain(|entry| faults::parse(entry).is_ok_and(|e| e.at < end));
        }
    }

    /// Apply flags on top.
    pub fn apply(&mut self, o: &Overrides) -> Result<()> {
        if let Some(n) = o.nodes {
            self.cluster.scale_to(n);
        }
        let w = &mut self.workload;
        if let Some(v) = o.apps {
            w.apps = v;
            w.broken_apps = w.broken_apps.min(v);
        }
        if let Some(v) = o.deployments {
            w.deployments = v;
        }
        if let Some(v) = o.replicas {
            w.replicas = v;
        }
        if let Some(v) = o.batch {
            w.batch = v;
        }
        if let Some(v) = o.constructor_failure_rate {
            w.constructor_failure_rate = v;
        }
        if let Some(v) = o.duration {
            self.duration = v;
        }
        if let Some(v) = &o.faults {
            self.faults = faults::split(v);
        } else {
            self.fit_default_faults();
        }
        if let Some(v) = o.seed {
            self.seed = v;
        }
        if let Some(v) = o.strategy {
            self.cluster.strategy = v;
        }
        if let Some(v) = o.rate {
            self.traffic.rate = v;
        }
        if let Some(v) = &o.serve_config {
            self.serve_config = Some(v.clone());
        }
        self.validate()
    }

    /// The parsed event schedule, in time order (stable for equal times).
    pub fn events(&self) -> Result<Vec<Event>> {
        let mut out = self
            .faults
            .iter()
            .map(|f| faults::parse(f))
            .collect::<Result<Vec<_>>>()?;
        out.sort_by_key(|e| e.at);
        Ok(out)
    }

    /// Check that the scenario makes sense; every event must parse and fall
    /// before the end of the run.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(SimError::Scenario(m));
        let w = &self.workload;
        if self.cluster.nodes() == 0 {
            return bad("the cluster needs at least one node".into());
        }
        if self.cluster.nodes() > MAX_NODES {
            return bad(format!(
                "the cluster has {} nodes; the simulator runs at most {MAX_NODES}",
                self.cluster.nodes()
            ));
        }
        let size = |x: f64| x.is_finite() && x >= 0.0;
        if let Some(g) = self
            .cluster
            .groups
            .iter()
            .find(|g| !(size(g.cpus) && size(g.memory_gib) && size(g.gpus)))
        {
            return bad(format!(
                "node group '{}' has a negative or invalid size",
                g.name
            ));
        }
        if w.deployments == 0 || w.replicas == 0 || w.batch == 0 {
            return bad("deployments, replicas and batch must each be at least 1".into());
        }
        if w.apps == 0 && self.serve_config.is_none() {
            return bad("apps must be at least 1 (or 0 with a serve_config)".into());
        }
        if w.broken_apps > w.apps {
            return bad(format!(
                "broken_apps ({}) exceeds apps ({})",
                w.broken_apps, w.apps
            ));
        }
        for (name, p) in [
            ("constructor_failure_rate", w.constructor_failure_rate),
            ("flap_failure_rate", w.flap_failure_rate),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return bad(format!("{name} must be within 0..=1, got {p}"));
            }
        }
        if !(w.replica_cpus.is_finite() && w.replica_cpus >= 0.0) {
            return bad("replica_cpus must be >= 0".into());
        }
        if !(w.start_latency.sigma.is_finite() && w.start_latency.sigma >= 0.0) {
            return bad("start_latency.sigma must be >= 0".into());
        }
        let t = &self.traffic;
        if !(t.rate.is_finite() && (0.0..=MAX_RATE).contains(&t.rate)) {
            return bad(format!(
                "traffic.rate must be within 0..={MAX_RATE} requests per second, got {}",
                t.rate
            ));
        }
        if t.attempts == 0 {
            return bad("traffic.attempts must be at least 1".into());
        }
        if t.latencies.is_empty()
            || t.latencies
                .iter()
                .any(|c| c.weight.is_nan() || c.weight <= 0.0)
        {
            return bad("traffic.latencies needs at least one class, every weight > 0".into());
        }
        if self.sample_every.is_zero() {
            return bad("sample_every must be above zero".into());
        }
        if w.health_check_period.is_zero() {
            return bad("health_check_period must be above zero".into());
        }
        for entry in &self.faults {
            let event = faults::parse(entry)?;
            if event.at >= self.duration {
                return Err(SimError::EventAfterEnd {
                    entry: entry.clone(),
                    at: event.at,
                    duration: self.duration,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_shorter_duration_keeps_the_default_events_that_fit_and_holds_written_ones() {
        let short = Duration::from_secs(90);
        let mut s = Scenario::default();
        s.apply(&Overrides {
            duration: Some(short),
            ..Overrides::default()
        })
        .unwrap();
        assert_eq!(
            s.faults,
            ["controller@15s", "node@60s", "deployment@80s:40"]
        );
        // Events somebody wrote are not dropped: one past the end is an error.
        let mut s = Scenario::default();
        let e = s.apply(&Overrides {
            duration: Some(short),
            faults: Some("node@100s".into()),
            ..Overrides::default()
        });
        assert!(matches!(e, Err(SimError::EventAfterEnd { .. })), "{e:?}");
        // A scenario file that sets a short duration and no schedule too.
        let s = Scenario::from_yaml("duration: 90s\n").unwrap();
        assert_eq!(
            s.faults,
            ["controller@15s", "node@60s", "deployment@80s:40"]
        );
    }

    #[test]
    fn durations_parse_and_print() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("2.5").unwrap(), Duration::from_millis(2500));
        let e = parse_duration("10 parsecs").unwrap_err();
        assert_eq!(e.why, "unknown unit");
        assert_eq!(
            e.to_string(),
            "duration '10 parsecs': unknown unit (write e.g. 90s, 15m, 1h, 250ms)"
        );
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("").is_err());
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(format_duration(Duration::from_secs(60)), "60s");
    }

    #[test]
    fn defaults_are_valid_and_nodes_scale_by_proportion() {
        let mut s = Scenario::default();
        s.validate().unwrap();
        assert_eq!(s.cluster.nodes(), 20);
        s.apply(&Overrides {
            nodes: Some(7),
            ..Default::default()
        })
        .unwrap();
        let counts: Vec<usize> = s.cluster.groups.iter().map(|g| g.count).collect();
        assert_eq!(counts, [4, 2, 1]);
    }

    #[test]
    fn a_yaml_scenario_overrides_only_what_it_names() {
        let s = Scenario::from_yaml(
            "seed: 9\nduration: 2m\ncluster:\n  strategy: pack\nworkload: { apps: 10, replicas: 3 }\nfaults: [\"node@30s\"]\n",
        )
        .unwrap();
        assert_eq!(s.seed, 9);
        assert_eq!(s.duration, Duration::from_secs(120));
        assert_eq!(s.cluster.strategy, Strategy::Pack);
        assert_eq!(s.cluster.nodes(), 20);
        assert_eq!((s.workload.apps, s.workload.replicas), (10, 3));
        assert_eq!(s.workload.batch, 200);
        assert_eq!(s.events().unwrap().len(), 1);
        let example = Scenario::from_yaml(include_str!("../scenarios/example.yaml")).unwrap();
        assert_eq!(example.workload.deployments, 2);
        assert_eq!(example.events().unwrap().len(), 18);
        let e = Scenario::from_yaml("workload: { apps: 0 }").unwrap_err();
        assert!(e.to_string().contains("at least 1"), "{e}");
        let only =
            Scenario::from_yaml("workload: { apps: 0, broken_apps: 0 }\nserve_config: c.yaml")
                .unwrap();
        assert_eq!(only.serve_config, Some(PathBuf::from("c.yaml")));
        let e = Scenario::from_yaml("workload: { appz: 3 }").unwrap_err();
        assert!(matches!(e, SimError::ScenarioYaml(_)), "{e:?}");
        assert!(e.to_string().contains("appz"), "{e}");
    }

    /// Sizes the simulator cannot run are refused, not run until memory runs
    /// out (a rate's requests start in one go each tick) or wrapped (a sum of
    /// node counts), and infinite node sizes are refused as negative ones are.
    #[test]
    fn unrunnable_sizes_are_refused_naming_them() {
        for (yaml, says) in [
            ("traffic: { rate: 1e20 }", "traffic.rate must be within"),
            ("traffic: { rate: -1 }", "traffic.rate must be within"),
            (
                "cluster:\n  groups:\n    - { name: a, count: 18446744073709551615, cpus: 1, memory_gib: 1 }\n    - { name: b, count: 1, cpus: 1, memory_gib: 1 }\n",
                "the simulator runs at most 100000",
            ),
            (
                "cluster:\n  groups:\n    - { name: a, count: 100001, cpus: 1, memory_gib: 1 }\n",
                "the simulator runs at most 100000",
            ),
            (
                "cluster:\n  groups:\n    - { name: a, count: 1, cpus: 1, memory_gib: .inf }\n",
                "node group 'a' has a negative or invalid size",
            ),
            (
                "cluster:\n  groups:\n    - { name: g, count: 1, cpus: 1, memory_gib: 1, gpus: .inf }\n",
                "node group 'g' has a negative or invalid size",
            ),
        ] {
            let e = Scenario::from_yaml(yaml).unwrap_err();
            assert!(
                matches!(e, SimError::Scenario(_)) && e.to_string().contains(says),
                "{yaml}: {e}"
            );
        }
        Scenario::from_yaml("traffic: { rate: 1000000 }").unwrap();
    }

    #[test]
    fn an_event_at_or_after_the_end_is_refused_naming_it() {
        let e = Scenario::from_yaml("duration: 2m\nfaults: [\"node@30s\", \"process@150s\"]\n")
            .unwrap_err();
        assert!(
            matches!(&e, SimError::EventAfterEnd { entry, at, duration }
                if entry == "process@150s"
                    && *at == Duration::from_secs(150)
                    && *duration == Duration::from_secs(120)),
            "{e:?}"
        );
        assert!(
            e.to_string().contains("'process@150s'") && e.to_string().contains("120s"),
            "{e}"
        );
        let e = Scenario::from_yaml("duration: 2m\nfaults: [\"node@2m\"]\n").unwrap_err();
        assert!(matches!(e, SimError::EventAfterEnd { .. }), "{e:?}");
        Scenario::from_yaml("duration: 2m\nfaults: [\"node@119s\"]\n").unwrap();
        // (Shortening the default run keeps the default events that fit:
        // `a_shorter_duration_keeps_the_default_events_that_fit_and_holds_written_ones`.)
    }

    #[test]
    fn a_scenario_files_paths_are_relative_to_it() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/serve_config_scenario.yaml");
        let s = Scenario::from_file(&path).unwrap();
        let dir = path.parent().unwrap();
        assert_eq!(s.serve_config, Some(dir.join("serve_config.yaml")));
        let config_events: Vec<String> = s
            .events()
            .unwrap()
            .into_iter()
            .filter_map(|e| match e.kind {
                faults::EventKind::Config(p) => Some(p.display().to_string()),
                _ => None,
            })
            .collect();
        assert_eq!(
            config_events,
            ["serve_config_next.yaml", "serve_config.yaml"]
                .map(|f| dir.join(f).display().to_string())
        );
    }

    #[test]
    fn a_bad_scenario_file_names_the_file_and_keeps_the_cause() {
        let dir = tempfile::tempdir().unwrap();
        let typo = dir.path().join("typo.yaml");
        std::fs::write(&typo, "workload: { appz: 3 }\n").unwrap();
        let e = Scenario::from_file(&typo).unwrap_err();
        let SimError::ParseScenario { path, source } = &e else {
            panic!("{e:?}");
        };
        assert_eq!(path, &typo);
        assert!(matches!(**source, SimError::ScenarioYaml(_)), "{e:?}");
        assert!(
            e.to_string().contains("typo.yaml") && e.to_string().contains("appz"),
            "{e}"
        );
        let zero = dir.path().join("zero.yaml");
        std::fs::write(&zero, "workload: { apps: 0 }\n").unwrap();
        let e = Scenario::from_file(&zero).unwrap_err();
        assert!(
            matches!(&e, SimError::ParseScenario { source, .. } if matches!(**source, SimError::Scenario(_))),
            "{e:?}"
        );
        let missing = dir.path().join("missing.yaml");
        let e = Scenario::from_file(&missing).unwrap_err();
        assert!(matches!(e, SimError::ReadScenario { .. }), "{e:?}");
    }
}
