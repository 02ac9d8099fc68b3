//! `lb-agent server {drain|undrain|down|up|set|add|remove|reset}`: runtime changes via the API.

use std::process::ExitCode;

use hyper::Method;
use serde_json::json;

use super::http;

/// What to change on a server.
pub enum ServerAction {
    Drain,
    Undrain,
    Down,
    Up,
    Set {
        weight: Option<u32>,
        spare: Option<bool>,
    },
    Add {
        weight: u32,
        spare: bool,
        backup: u32,
    },
    Remove,
    Reset,
}

pub async fn server(
    api: &http::Target,
    service: &str,
    address: &str,
    action: ServerAction,
) -> anyhow::Result<ExitCode> {
    let one = format!(
        "/api/v1/services/{}/servers/{}",
        http::segment(service),
        http::segment(address)
    );
    let (method, path, body) = match action {
        ServerAction::Drain => (Method::PATCH, one, json!({"drain": true})),
        ServerAction::Undrain => (Method::PATCH, one, json!({"drain": false})),
        ServerAction::Down => (Method::PATCH, one, json!({"down": true})),
        ServerAction::Up => (Method::PATCH, one, json!({"down": false})),
        ServerAction::Set { weight, spare } => {
            let mut patch = serde_json::Map::new();
            if let Some(w) = weight {
                patch.insert("weight".into(), json!(w));
            }
            if let Some(s) = spare {
                patch.insert("spare".into(), json!(s));
            }
            if patch.is_empty() {
                anyhow::bail!("`server set` needs --weight and/or --spare");
            }
            (Method::PATCH, one, serde_json::Value::Object(patch))
        }
        ServerAction::Add {
            weight,
            spare,
            backup,
        } => (
            Method::POST,
            format!("/api/v1/services/{}/servers", http::segment(service)),
            json!({"address": address, "weight": weight, "spare": spare, "backup": backup}),
        ),
        ServerAction::Remove => (Method::DELETE, one, json!({})),
        ServerAction::Reset => (Method::PATCH, one, json!({"reset": true})),
    };
    http::request_ok(api, method, &path, Some(body.to_string())).await?;
    println!("ok");
    Ok(ExitCode::SUCCESS)
}
