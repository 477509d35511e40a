//! What `status` and `config` print.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::{Format, client::ClientError};

fn yaml(v: &Value) -> Result<String, ClientError> {
    serde_saphyr::to_string(v).map_err(|e| ClientError::Decode(e.to_string()))
}

/// Ray's `ServeStatus` of the details (`ServeInstanceDetails._get_status`).
fn serve_status(details: &Value) -> Value {
    let apps: serde_json::Map<String, Value> = details["applications"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(name, a)| {
            let mut deployments: serde_json::Map<String, Value> = a["deployments"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(d, dd)| {
                    let mut states: BTreeMap<String, u64> = BTreeMap::new();
                    for r in dd["replicas"].as_array().into_iter().flatten() {
                        *states
                            .entry(r["state"].as_str().unwrap_or("UNKNOWN").to_owned())
                            .or_default() += 1;
                    }
                    (
                        d.clone(),
                        json!({"status": dd["status"], "status_trigger": dd["status_trigger"],
                            "replica_states": states, "message": dd["message"]}),
                    )
                })
                .collect();
            // A deployment the details leave out (its DeploymentActor not
            // started yet, restarting, or not answering in time) is still one
            // of the application's: listed, saying its details are unavailable.
            for d in a["deployment_topology"]["nodes"].as_object().into_iter().flatten().map(|(d, _)| d) {
                deployments.entry(d.clone()).or_insert_with(|| {
                    json!({"status": "UNKNOWN", "status_trigger": "UNKNOWN", "replica_states": {},
                        "message": "details unavailable: its DeploymentActor is starting, restarting or busy; try again"})
                });
            }
            (
                name.clone(),
                json!({"status": a["status"], "message": a["message"],
                    "last_deployed_time_s": a["last_deployed_time_s"], "deployments": deployments}),
            )
        })
        .collect();
    let proxies: serde_json::Map<String, Value> = details["proxies"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(n, p)| (n.clone(), p["status"].clone()))
        .collect();
    json!({"proxies": proxies, "applications": apps, "target_capacity": details["target_capacity"]})
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// `v` as one table cell: a message of several lines (a user's error with
/// its cause, a traceback) on one, its lines joined by ` | `, and tabs and
/// other control characters as spaces, so the columns stay aligned (the
/// YAML and JSON formats keep it as it is).
fn cell(v: &Value) -> String {
    text(v)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" | ")
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// A table: one row per deployment, under its application's row.
fn table(status: &Value, details: &Value) -> String {
    let mut rows = vec![
        [
            "APPLICATION",
            "STATUS",
            "ROUTE",
            "DEPLOYMENT",
            "STATUS",
            "REPLICAS",
            "MESSAGE",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for (name, a) in status["applications"].as_object().into_iter().flatten() {
        let route = text(&details["applications"][name]["route_prefix"]);
        rows.push(vec![
            name.clone(),
            text(&a["status"]),
            route,
            String::new(),
            String::new(),
            String::new(),
            cell(&a["message"]),
        ]);
        for (d, dd) in a["deployments"].as_object().into_iter().flatten() {
            let replicas = dd["replica_states"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(s, n)| format!("{n} {s}"))
                .collect::<Vec<_>>()
                .join(", ");
            rows.push(vec![
                String::new(),
                String::new(),
                String::new(),
                d.clone(),
                text(&dd["status"]),
                replicas,
                cell(&dd["message"]),
            ]);
        }
    }
    if rows.len() == 1 {
        return "No applications.\n".to_owned();
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// What `flotilla status` prints.
pub fn status(details: &Value, format: Format, name: Option<&str>) -> Result<String, ClientError> {
    let status = serve_status(details);
    if let Some(n) = name {
        let app = &status["applications"][n];
        if app.is_null() {
            return Ok(format!("Application \"{n}\" does not exist.\n"));
        }
        return match format {
            Format::Json => Ok(format!(
                "{}\n",
                serde_json::to_string_pretty(app).unwrap_or_default()
            )),
            Format::Yaml => yaml(app),
            Format::Table => {
                let only = json!({"applications": {n: app}});
                Ok(table(&only, details))
            }
        };
    }
    match format {
        Format::Json => Ok(format!(
            "{}\n",
            serde_json::to_string_pretty(&status).unwrap_or_default()
        )),
        Format::Yaml => yaml(&status),
        Format::Table => Ok(table(&status, details)),
    }
}

/// What `flotilla config` prints: each application's applied config as YAML,
/// separated by `---` (as `serve config`).
pub fn config(details: &Value, name: Option<&str>) -> Result<String, ClientError> {
    let mut docs = Vec::new();
    for (app, a) in details["applications"].as_object().into_iter().flatten() {
        if name.is_some_and(|n| n != app) {
            continue;
        }
        let cfg = &a["deployed_app_config"];
        if !cfg.is_null() {
            docs.push(yaml(cfg)?);
        }
    }
    if docs.is_empty() {
        return Ok(match name {
            Some(n) => format!("No config has been deployed for application \"{n}\".\n"),
            None => "No configuration was found.\n".to_owned(),
        });
    }
    Ok(docs.join("\n---\n\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_of_several_lines_keeps_the_table_aligned() {
        let details = json!({"applications": {"a": {
            "status": "DEPLOY_FAILED", "message": "Deploying app 'a' failed:\n  missing field\t`x`\r\n",
            "last_deployed_time_s": 1.0, "route_prefix": "/a",
            "deployments": {"d": {"status": "DEPLOY_FAILED", "status_trigger": "REPLICA_STARTUP_FAILED",
                "message": "one\ntwo", "replicas": []}},
        }}});
        let t = table(&serve_status(&details), &details);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3, "a header and one row each: {t}");
        assert!(
            lines[1].ends_with("Deploying app 'a' failed: | missing field `x`"),
            "{t}"
        );
        assert!(lines[2].ends_with("one | two"), "{t}");
    }

    #[test]
    fn a_deployment_the_details_leave_out_is_listed_as_unavailable() {
        let details = json!({"applications": {"a": {
            "status": "UNHEALTHY", "message": "", "last_deployed_time_s": 1.0,
            "deployments": {"front": {"status": "HEALTHY", "status_trigger": "CONFIG_UPDATE_COMPLETED",
                "message": "", "replicas": [{"state": "RUNNING"}]}},
            "deployment_topology": {"nodes": {"front": {}, "back": {}}},
        }}});
        let s = serve_status(&details);
        let deps = &s["applications"]["a"]["deployments"];
        assert_eq!(deps["front"]["status"], "HEALTHY");
        assert_eq!(deps["back"]["status"], "UNKNOWN");
        assert!(
            deps["back"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("details unavailable"),
            "{deps}"
        );
    }
}
