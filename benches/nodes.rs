//! Nodes on loopback, side by side with one process (issue 17, `docs/nodes.md`):
//!
//! 1. a handle call to a replica in another process against one in this
//!    process: p50 and p99 of sequential calls from one caller, then p50, p99
//!    and req/s with 64 callers;
//! 2. bulk deploy of 10,000 applications x 1 replica spread over the head and
//!    two nodes, against all on a head without nodes (in a child process, so
//!    the two fleets never share memory or actors);
//! 3. node loss: 1,000 replicas on a node that is SIGKILLed, until every one
//!    runs again on the remaining node (in a child process, with its own head).
//!
//! Every node is a process of this binary. One JSON object per figure on
//! stdout. Run with `cargo bench --bench nodes` (flags after `--`: `--apps N`,
//! `--loss N`, `--seconds S`).

use std::{
    error::Error,
    io::{BufRead, BufReader, Write},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use flotilla::{
    ApplicationSpec, ApplicationStatus, Cookie, Deployment, DeploymentHandle, DeploymentSpec,
    HeadOptions, Registry, ReplicaState, Resources, RunManyOptions, Serve, ServeOptions, UserError,
};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

type BenchResult<T> = Result<T, Box<dyn Error + Send + Sync>>;

const COOKIE: &str = "flotilla-bench-cookie";
/// Set to make this process a node (`"{head} {name} {custom}"`) or a child
/// scenario (`local-bulk {apps}`, `loss {replicas}`).
const ROLE_ENV: &str = "FLOTILLA_BENCH_NODES_ROLE";
const NOOP: &str = "bench::Noop";

/// Answers its request unchanged: the cost measured is Flotilla's alone.
struct Noop;

impl Deployment for Noop {
    type Request = u64;
    type Response = u64;
    async fn handle(&self, request: u64) -> Result<u64, UserError> {
        Ok(request)
    }
}

fn registry() -> BenchResult<Registry> {
    Ok(Registry::new().register(NOOP, |_ctx| async { Ok(Noop) })?)
}

#[derive(Debug, Clone)]
struct Flags {
    apps: usize,
    loss: usize,
    seconds: u64,
}

fn flags() -> BenchResult<Flags> {
    let mut f = Flags {
        apps: 10_000,
        loss: 1_000,
        seconds: 3,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let value = || -> BenchResult<usize> {
            Ok(args
                .get(i + 1)
                .ok_or_else(|| format!("{} needs a value", args[i]))?
                .parse()?)
        };
        match args[i].as_str() {
            "--apps" => f.apps = value()?,
            "--loss" => f.loss = value()?,
            "--seconds" => f.seconds = value()? as u64,
            // cargo bench passes `--bench`; anything else is a filter: ignored.
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    Ok(f)
}

/// One figure as a JSON line.
fn figure(scenario: &str, metric: &str, value: f64, unit: &str, extra: &[(&str, f64)]) {
    let mut line = format!(
        "{{\"scenario\": \"{scenario}\", \"metric\": \"{metric}\", \"value\": {}, \"unit\": \"{unit}\"",
        num(value)
    );
    for (k, v) in extra {
        line.push_str(&format!(", \"{k}\": {}", num(*v)));
    }
    line.push('}');
    println!("{line}");
    let _ = std::io::stdout().flush();
}

fn num(v: f64) -> String {
    if !v.is_finite() {
        return "null".to_owned();
    }
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn main() -> BenchResult<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match std::env::var(ROLE_ENV) {
        Ok(role) => rt.block_on(child(&role)),
        Err(_) => rt.block_on(bench(flags()?)),
    }
}

/// A store directory removed on drop.
struct Store(PathBuf);

impl Store {
    fn new(what: &str) -> BenchResult<Store> {
        let dir = std::env::temp_dir().join(format!(
            "flotilla-bench-nodes-{}-{what}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir)?;
        Ok(Store(dir))
    }

    fn file(&self) -> PathBuf {
        self.0.join("flotilla.redb")
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn head(store: &Path, resources: Resources) -> BenchResult<Serve> {
    let options = HeadOptions::new(Cookie::new(COOKIE)?)
        .listen(SocketAddr::from(([127, 0, 0, 1], 0)))
        .resources(resources);
    Ok(Serve::start(
        ServeOptions::new(registry()?)
            .store_path(store.join("flotilla.redb"))
            .nodes(options),
    )
    .await?)
}

/// A node process of this binary; SIGKILLed when dropped.
struct NodeProc {
    child: Child,
    id: String,
}

impl NodeProc {
    /// Start one and wait until it joined (it prints its node id).
    fn start(head: SocketAddr, name: &str, custom: &str) -> BenchResult<NodeProc> {
        let mut child = Command::new(std::env::current_exe()?)
            .env(ROLE_ENV, format!("node {head} {name} {custom}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let out = child.stdout.take().ok_or("no stdout")?;
        let mut lines = BufReader::new(out).lines();
        let id = loop {
            match lines.next() {
                Some(line) => {
                    let line = line?;
                    if let Some(id) = line.strip_prefix("NODE_ID ") {
                        break id.to_owned();
                    }
                }
                None => return Err(format!("node {name} ended before joining").into()),
            }
        };
        // Keep draining its stdout so it never blocks.
        std::thread::spawn(move || for _ in lines {});
        Ok(NodeProc { child, id })
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        self.kill();
    }
}

fn resources(custom: &str) -> BenchResult<Resources> {
    let mut r = Resources::none();
    if custom != "-" {
        for kv in custom.split(',') {
            let (k, v) = kv.split_once('=').ok_or("custom resource without =")?;
            r = r.with_custom(k, v.parse()?);
        }
    }
    Ok(r)
}

async fn child(role: &str) -> BenchResult<()> {
    let parts: Vec<&str> = role.split(' ').collect();
    match parts.as_slice() {
        ["node", head, name, custom] => node(head.parse()?, name, custom).await,
        ["local-bulk", apps] => local_bulk(apps.parse()?).await,
        ["loss", n] => loss(n.parse()?).await,
        _ => Err(format!("unknown role {role}").into()),
    }
}

async fn node(head: SocketAddr, name: &str, custom: &str) -> BenchResult<()> {
    std::thread::spawn(|| {
        let mut buf = String::new();
        while std::io::stdin()
            .read_line(&mut buf)
            .map(|n| n > 0)
            .unwrap_or(false)
        {
            buf.clear();
        }
        std::process::exit(0);
    });
    let options = flotilla::node::NodeOptions::new(head, Cookie::new(COOKIE)?)
        .name(name)
        .resources(resources(custom)?.with_cpus(1_000_000.0));
    let node = flotilla::node::start(registry()?, options).await?;
    println!("NODE_ID {}", node.id());
    std::io::stdout().flush()?;
    node.wait().await?;
    Ok(())
}

fn app(
    name: &str,
    replicas: u32,
    need: Option<&str>,
    max_ongoing: u32,
) -> BenchResult<ApplicationSpec> {
    let mut r = Resources::none();
    if let Some(need) = need {
        r = r.with_custom(need, 1.0);
    }
    Ok(ApplicationSpec::builder(name)
        .route_prefix(format!("/{name}"))
        .deployment(
            DeploymentSpec::builder("noop", NOOP)
                .replicas(replicas)
                .with_config(|c| c.with_resources(r).with_max_ongoing_requests(max_ongoing)),
        )
        .build()?)
}

fn quantile(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

/// Sequential calls from one caller, then `callers` callers for `seconds`.
async fn calls(scenario: &str, h: &DeploymentHandle, seconds: u64) -> BenchResult<()> {
    for i in 0..2_000u64 {
        h.call::<_, u64>(&i).await?;
    }
    let n = 20_000;
    let mut lat = Vec::with_capacity(n);
    for i in 0..n as u64 {
        let t = Instant::now();
        let r: u64 = h.call(&i).await?;
        lat.push(t.elapsed());
        if r != i {
            return Err("wrong answer".into());
        }
    }
    lat.sort();
    let extra = [("callers", 1.0), ("calls", n as f64)];
    figure(scenario, "p50_us", quantile(&lat, 0.5), "us", &extra);
    figure(scenario, "p99_us", quantile(&lat, 0.99), "us", &extra);

    // Each caller watches the clock itself: an in-process call to a trivial
    // replica may never yield, so a timer task could starve.
    let callers = 64;
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for c in 0..callers {
        let h = h.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut failed = 0u64;
            let mut i = c as u64;
            while Instant::now() < deadline {
                let t = Instant::now();
                match h.call::<_, u64>(&i).await {
                    Ok(_) => lat.push(t.elapsed()),
                    Err(_) => failed += 1,
                }
                i += callers as u64;
            }
            (lat, failed)
        }));
    }
    let (mut all, mut failed) = (Vec::new(), 0);
    for t in tasks {
        let (l, f) = t.await?;
        all.extend(l);
        failed += f;
    }
    let wall = t0.elapsed().as_secs_f64();
    all.sort();
    let extra = [("callers", callers as f64), ("failed", failed as f64)];
    figure(
        scenario,
        "req_per_sec",
        all.len() as f64 / wall,
        "req/s",
        &extra,
    );
    figure(scenario, "p50_us_64", quantile(&all, 0.5), "us", &extra);
    figure(scenario, "p99_us_64", quantile(&all, 0.99), "us", &extra);
    Ok(())
}

/// Deploy `apps` applications of one replica in batches of 1,000 without
/// waiting, then wait (by subscription) until every one is RUNNING: apps/s.
async fn bulk(serve: &Serve, apps: usize) -> BenchResult<f64> {
    let names: Vec<String> = (0..apps).map(|i| format!("b{i}")).collect();
    let mut batches = Vec::new();
    for chunk in names.chunks(1_000) {
        batches.push(
            chunk
                .iter()
                .map(|n| app(n, 1, None, 5))
                .collect::<BenchResult<Vec<_>>>()?,
        );
    }
    let no_wait = RunManyOptions {
        wait_for_ingress_deployment_creation: false,
        wait_for_applications_running: false,
    };
    let t0 = Instant::now();
    for b in batches {
        serve.run_many(b, no_wait).await?;
    }
    for name in &names {
        let mut rx = serve.watch_status(name).ok_or("no such application")?;
        loop {
            let status = rx.borrow_and_update().status;
            match status {
                ApplicationStatus::Running => break,
                ApplicationStatus::DeployFailed => return Err(format!("{name} failed").into()),
                _ => {}
            }
            tokio::time::timeout(Duration::from_secs(600), rx.changed()).await??;
        }
    }
    Ok(apps as f64 / t0.elapsed().as_secs_f64())
}

async fn bench(f: Flags) -> BenchResult<()> {
    // 1. Calls: "local" on the head, "remote" on node a.
    let store = Store::new("main")?;
    let serve = head(
        &store.0,
        Resources::none()
            .with_cpus(1_000_000.0)
            .with_custom("here", 1.0),
    )
    .await?;
    let addr = serve.node_address().ok_or("the head does not listen")?;
    let a = NodeProc::start(addr, "a", "far=1")?;
    let b = NodeProc::start(addr, "b", "-")?;
    let local = serve.run(app("local", 1, Some("here"), 1_000)?).await?;
    let remote = serve.run(app("remote", 1, Some("far"), 1_000)?).await?;
    let on = serve
        .deployment_snapshot("remote", "noop")
        .await?
        .and_then(|s| s.replicas.first().map(|r| r.node.clone()))
        .unwrap_or_default();
    if on != a.id {
        return Err(format!("the remote replica runs on {on}, not on {}", a.id).into());
    }
    calls("call-in-process", &local, f.seconds).await?;
    calls("call-remote-loopback", &remote, f.seconds).await?;
    serve.delete_apps(["local", "remote"], true).await?;

    // 2. Bulk deploy over the head and both nodes, then all local (a child).
    let spread = bulk(&serve, f.apps).await?;
    let m = serve.metrics().await?;
    figure(
        "bulk-deploy-3-processes",
        "apps_per_sec",
        spread,
        "apps/s",
        &[
            ("apps", f.apps as f64),
            ("replicas_on_nodes", m.nodes.replicas_on_nodes as f64),
        ],
    );
    drop((a, b));
    let local_rate = scenario_child(&format!("local-bulk {}", f.apps))?;
    if let Some(l) = local_rate {
        figure(
            "bulk-deploy-3-processes",
            "ratio_to_local",
            spread / l,
            "ratio",
            &[("apps", f.apps as f64)],
        );
    }
    // 3. Node loss (a child with its own head).
    scenario_child(&format!("loss {}", f.loss))?;
    // Exit at once: tearing down 10,000 applications measures nothing.
    std::process::exit(0);
}

/// Run a child scenario; echo its figures, return its `RATE` line if any.
fn scenario_child(role: &str) -> BenchResult<Option<f64>> {
    let out = Command::new(std::env::current_exe()?)
        .env(ROLE_ENV, role)
        .stderr(Stdio::inherit())
        .output()?;
    let mut rate = None;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        match line.strip_prefix("RATE ") {
            Some(r) => rate = r.parse().ok(),
            None => println!("{line}"),
        }
    }
    if !out.status.success() {
        return Err(format!("child scenario {role} failed: {}", out.status).into());
    }
    Ok(rate)
}

async fn local_bulk(apps: usize) -> BenchResult<()> {
    let store = Store::new("local")?;
    let serve = Serve::start(ServeOptions::new(registry()?).store_path(store.file())).await?;
    let rate = bulk(&serve, apps).await?;
    figure(
        "bulk-deploy-1-process",
        "apps_per_sec",
        rate,
        "apps/s",
        &[("apps", apps as f64)],
    );
    println!("RATE {rate}");
    std::io::stdout().flush()?;
    std::process::exit(0);
}

/// Replicas of `apps` running on `node`, from their snapshots.
async fn running_on(serve: &Serve, apps: &[String], node: &str) -> BenchResult<usize> {
    let mut n = 0;
    for a in apps {
        if let Some(s) = serve.deployment_snapshot(a, "noop").await? {
            n += s
                .replicas
                .iter()
                .filter(|r| r.node == node && r.state == ReplicaState::Running)
                .count();
        }
    }
    Ok(n)
}

async fn loss(replicas: usize) -> BenchResult<()> {
    let store = Store::new("loss")?;
    let serve = head(&store.0, Resources::none()).await?;
    let addr = serve.node_address().ok_or("the head does not listen")?;
    let cap = format!("loss={replicas}");
    let mut c = NodeProc::start(addr, "c", &cap)?;
    // 10 applications of replicas/10 replicas each, all on c.
    let per = (replicas / 10).max(1) as u32;
    let names: Vec<String> = (0..10).map(|i| format!("l{i}")).collect();
    let specs = names
        .iter()
        .map(|n| app(n, per, Some("loss"), 5))
        .collect::<BenchResult<Vec<_>>>()?;
    serve.run_many(specs, RunManyOptions::default()).await?;
    let total = per as usize * names.len();
    if running_on(&serve, &names, &c.id).await? != total {
        return Err("not every replica runs on c".into());
    }
    let d = NodeProc::start(addr, "d", &cap)?;
    let t0 = Instant::now();
    while serve.metrics().await?.nodes.live != 2 {
        if t0.elapsed() > Duration::from_secs(30) {
            return Err("d did not join".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let killed = Instant::now();
    c.kill();
    let mut detected = None;
    loop {
        if detected.is_none() && serve.metrics().await?.nodes.lost == 1 {
            detected = Some(killed.elapsed());
        }
        if detected.is_some() && running_on(&serve, &names, &d.id).await? == total {
            break;
        }
        if killed.elapsed() > Duration::from_secs(120) {
            return Err("replicas not replaced in 120 s".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let replaced = killed.elapsed().as_secs_f64();
    let detected = detected.map(|d| d.as_secs_f64() * 1e3).unwrap_or(f64::NAN);
    let extra = [("replicas", total as f64), ("apps", names.len() as f64)];
    figure("node-loss", "detected_ms", detected, "ms", &extra);
    figure("node-loss", "all_replaced_s", replaced, "s", &extra);
    drop(d);
    std::process::exit(0);
}
