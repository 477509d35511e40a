//! Config deploy: register application builders, apply `examples/serve_config.yaml`
//! (or the config given), wait for every application it names, call those of
//! this example, print the status table, and shut down.
//!
//! Run: `cargo run --example config_deploy [-- path/to/config.yaml]`

use std::{collections::BTreeMap, sync::atomic::AtomicBool, sync::atomic::Ordering};

use flotilla::{
    ApplicationSpec, ApplicationStatus, Args, Deployment, DeploymentHandle, DeploymentSpec,
    Registry, Serve, ServeOptions, UserError,
};
use serde::Deserialize;

fn user_error(e: impl std::fmt::Display) -> UserError {
    UserError::new(e.to_string())
}

#[derive(Deserialize)]
struct GreeterArgs {
    greeting: String,
    punctuation: String,
}

struct Greeter {
    args: GreeterArgs,
    shout: AtomicBool,
}

impl Deployment for Greeter {
    type Request = String;
    type Response = String;
    async fn handle(&self, name: String) -> Result<String, UserError> {
        let text = format!("{}, {name}{}", self.args.greeting, self.args.punctuation);
        Ok(if self.shout.load(Ordering::Relaxed) {
            text.to_uppercase()
        } else {
            text
        })
    }
    async fn reconfigure(&self, user_config: Args) -> Result<(), UserError> {
        #[derive(Deserialize)]
        struct Config {
            shout: bool,
        }
        let c: Config = user_config.decode().map_err(user_error)?;
        self.shout.store(c.shout, Ordering::Relaxed);
        Ok(())
    }
}

#[derive(Deserialize)]
struct ShopArgs {
    currency: String,
    catalog: Vec<String>,
    discount: f64,
}

struct Front {
    pricing: DeploymentHandle,
    currency: String,
}

impl Deployment for Front {
    type Request = String;
    type Response = String;
    async fn handle(&self, item: String) -> Result<String, UserError> {
        let price: f64 = self.pricing.call(&item).await.map_err(user_error)?;
        Ok(format!("{item}: {price:.2} {}", self.currency))
    }
}

struct Pricing {
    catalog: Vec<String>,
    discount: f64,
}

impl Deployment for Pricing {
    type Request = String;
    type Response = f64;
    async fn handle(&self, item: String) -> Result<f64, UserError> {
        let index = self
            .catalog
            .iter()
            .position(|c| *c == item)
            .ok_or_else(|| UserError::new(format!("no such item: {item}")))?;
        Ok((1.0 + index as f64) * (1.0 - self.discount))
    }
}

struct Admin;

impl Deployment for Admin {
    type Request = String;
    type Response = String;
    async fn handle(&self, command: String) -> Result<String, UserError> {
        Ok(format!("admin ok: {command}"))
    }
}

fn registry() -> Result<Registry, Box<dyn std::error::Error>> {
    Ok(Registry::new()
        .register("examples::Greeter", |ctx| async move {
            Ok(Greeter {
                args: ctx.args()?,
                shout: AtomicBool::new(false),
            })
        })?
        .register("examples::Front", |ctx| async move {
            let args: ShopArgs = ctx.args()?;
            Ok(Front {
                pricing: ctx.handle("pricing")?,
                currency: args.currency,
            })
        })?
        .register("examples::Pricing", |ctx| async move {
            let args: ShopArgs = ctx.args()?;
            Ok(Pricing {
                catalog: args.catalog,
                discount: args.discount,
            })
        })?
        .register("examples::Admin", |_ctx| async { Ok(Admin) })?
        .register_app("examples.greeter:app", |args: Args| async move {
            let a: BTreeMap<String, String> = args.decode().map_err(user_error)?;
            ApplicationSpec::builder("greeter")
                .deployment(DeploymentSpec::builder("greeter", "examples::Greeter").init_args(&a))
                .build()
                .map_err(user_error)
        })?
        .register_app("examples.shop:app", |args: Args| async move {
            let raw: ShopArgs = args.decode().map_err(user_error)?;
            let shared = (raw.currency.clone(), raw.catalog.clone(), raw.discount);
            let init = |path: &str, name: &str| {
                DeploymentSpec::builder(name, path).init_args(&ShopInit::from(&shared))
            };
            ApplicationSpec::builder("shop")
                .deployment(init("examples::Front", "front"))
                .deployment(init("examples::Pricing", "pricing"))
                .ingress("front")
                .build()
                .map_err(user_error)
        })?
        .register_app("examples.admin:app", |_args: Args| async {
            ApplicationSpec::builder("admin")
                .deployment(DeploymentSpec::builder("admin", "examples::Admin"))
                .build()
                .map_err(user_error)
        })?)
}

#[derive(serde::Serialize)]
struct ShopInit {
    currency: String,
    catalog: Vec<String>,
    discount: f64,
}

impl From<&(String, Vec<String>, f64)> for ShopInit {
    fn from((currency, catalog, discount): &(String, Vec<String>, f64)) -> Self {
        ShopInit {
            currency: currency.clone(),
            catalog: catalog.clone(),
            discount: *discount,
        }
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let Err(e) = run().await else {
        return std::process::ExitCode::SUCCESS;
    };
    eprintln!("error: {}", flotilla::with_causes(e.as_ref()));
    std::process::ExitCode::FAILURE
}

/// What this example asks each of its own applications (any other
/// application a config names is waited for and shown, not called).
fn request_for(app: &str) -> Option<&'static str> {
    match app {
        "greeter" => Some("flotilla"),
        "shop" => Some("pears"),
        "admin" => Some("status"),
        _ => None,
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "examples/serve_config.yaml".to_owned());
    // Removed when dropped, on an error too.
    let dir = tempfile::tempdir()?;
    let serve =
        Serve::start(ServeOptions::new(registry()?).store_path(dir.path().join("f.redb"))).await?;
    if let Err(e) = serve.apply_config_file(&path).await {
        serve.shutdown().await?;
        return Err(e.into());
    }
    println!("applied {path}");
    let applied = serve.applied_config().await?;
    let apps = applied.iter().flat_map(|c| c.applications.iter());
    for app in apps.map(|a| a.name.as_str()) {
        let mut rx = serve
            .watch_status(app)
            .ok_or_else(|| format!("application {app} is not on the status board"))?;
        let status = rx
            .wait_for(|s| {
                matches!(
                    s.status,
                    ApplicationStatus::Running | ApplicationStatus::DeployFailed
                )
            })
            .await?
            .clone();
        match (status.status, request_for(app)) {
            (ApplicationStatus::Running, Some(request)) => {
                let out: String = serve.app_handle(app)?.call(request).await?;
                println!("{app} <- {request:?} -> {out:?}");
            }
            (s, _) => println!("{app}: {s} {}", status.message),
        }
    }
    println!();
    for (name, s) in serve.status() {
        let deps: Vec<String> = s
            .deployments
            .iter()
            .map(|(d, st)| format!("{d}={}", st.status))
            .collect();
        println!(
            "{:<8} {:<9} gen {}  {}",
            name.as_str(),
            s.status.to_string(),
            s.observed_generation,
            deps.join(" ")
        );
    }
    serve.shutdown().await?;
    Ok(())
}
