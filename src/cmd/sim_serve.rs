//! `pruefstand sim-serve`: the simulated model as a standalone server with vLLM's
//! command-line shape, so a container runs it exactly like vLLM:
//!
//! ```text
//! pruefstand sim-serve [serve] MODEL_DIR --served-model-name NAME [--host 127.0.0.1]
//!     [--port 8000] [--api-key K] [--enable-lora] [--lora-modules name=path ...]
//! ```
//!
//! MODEL_DIR holds `sim.toml` (a `SimConfig`) and `truth.json`. The key may also come
//! from `VLLM_API_KEY`. Any other vLLM flag is accepted and ignored with a log line; a
//! flag's value is the next word unless that starts with `-` or the flag is a known
//! switch (`--enable-*`, `--disable-*`, `--no-*`, `--trust-remote-code`, …). A model
//! folder literally named `serve` must be given as `./serve`. Stops gracefully on
//! SIGTERM/SIGINT. For in-process use see `sim::Server`; this file is only the CLI.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};

use pruefstand_sim::{Server, SimConfig, SimSettings, Truth};

#[derive(clap::Args)]
pub(crate) struct Args {
    /// vLLM's arguments: [serve] MODEL_DIR --served-model-name NAME [--host H] [--port P]
    /// [--api-key K] [--enable-lora] [--lora-modules name=path ...]; other vLLM flags are
    /// ignored. MODEL_DIR holds sim.toml and truth.json.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0.., value_name = "VLLM_ARGS")]
    argv: Vec<String>,
}

#[derive(Debug, PartialEq)]
struct ServeArgs {
    model_dir: PathBuf,
    served_name: String,
    host: String,
    port: u16,
    api_key: Option<String>,
    /// (name, path); the simulator needs only the names.
    lora_modules: Vec<(String, String)>,
    ignored: Vec<String>,
}

/// vLLM switches that take no value but do not follow the enable/disable/no naming.
const SWITCHES: &[&str] = &[
    "--trust-remote-code",
    "--enforce-eager",
    "--skip-tokenizer-init",
    "--async-scheduling",
    "--fully-sharded-loras",
    "--return-tokens-as-token-ids",
    "--headless",
    "--api-server-count-auto",
];

fn is_switch(flag: &str) -> bool {
    SWITCHES.contains(&flag) || ["--enable-", "--disable-", "--no-"].iter().any(|p| flag.starts_with(p))
}

fn is_flag(word: &str) -> bool {
    word.starts_with('-') && word.len() > 1 && word.parse::<f64>().is_err()
}

/// Parses vLLM's command line (only what the simulator needs).
fn parse_vllm_args(argv: &[String], env_key: Option<String>) -> anyhow::Result<ServeArgs> {
    let mut said = Said::default();
    let mut i = 0;
    while i < argv.len() {
        let word = &argv[i];
        if is_flag(word) {
            said.flag(argv, &mut i)?;
        } else {
            said.positionals.push(word.clone());
        }
        i += 1;
    }
    said.into_serve_args(env_key)
}

/// The words of vLLM's command line read so far.
#[derive(Default)]
struct Said {
    positionals: Vec<String>,
    model: Option<String>,
    served: Option<String>,
    host: Option<String>,
    port: Option<u16>,
    key: Option<String>,
    lora_modules: Vec<(String, String)>,
    ignored: Vec<String>,
}

impl Said {
    /// Reads the flag at argv[i] and its values, leaving `i` on its last value.
    fn flag(&mut self, argv: &[String], i: &mut usize) -> anyhow::Result<()> {
        let word = &argv[*i];
        let (flag, inline) = match word.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v)),
            _ => (word.as_str(), None),
        };
        let one = |vals: Vec<String>| -> anyhow::Result<String> {
            vals.into_iter().next().with_context(|| format!("{flag} needs a value"))
        };
        match flag {
            "-h" | "--help" => bail!(
                "usage: pruefstand sim-serve [serve] MODEL_DIR --served-model-name NAME [--host H] [--port P] [--api-key K] [--enable-lora] [--lora-modules name=path ...]"
            ),
            "--model" => self.model = Some(one(flag_values(argv, i, inline, false))?),
            "--host" => self.host = Some(one(flag_values(argv, i, inline, false))?),
            "--api-key" => self.key = Some(one(flag_values(argv, i, inline, false))?),
            "--port" => {
                let v = one(flag_values(argv, i, inline, false))?;
                self.port = Some(v.parse::<u16>().with_context(|| format!("--port {v}: not a port number"))?);
            }
            "--served-model-name" => {
                let mut names = flag_values(argv, i, inline, true).into_iter();
                self.served = Some(names.next().context("--served-model-name needs a value")?);
                self.ignored.extend(names.map(|n| format!("--served-model-name alias {n}")));
            }
            "--lora-modules" => {
                for spec in flag_values(argv, i, inline, true) {
                    self.lora_modules.push(parse_lora_module(&spec)?);
                }
            }
            "--enable-lora" => {}
            _ if inline.is_some() || is_switch(flag) => self.ignored.push(word.clone()),
            _ => {
                let vals = flag_values(argv, i, None, false);
                self.ignored.push(std::iter::once(word.clone()).chain(vals).collect::<Vec<_>>().join(" "));
            }
        }
        Ok(())
    }

    /// The model folder (given once, as a positional or `--model`) and the defaults.
    fn into_serve_args(self, env_key: Option<String>) -> anyhow::Result<ServeArgs> {
        let mut positionals = self.positionals;
        if positionals.first().is_some_and(|p| p == "serve") {
            positionals.remove(0);
        }
        let mut positionals = positionals.into_iter();
        let model_dir = match (positionals.next(), self.model) {
            (Some(p), None) | (None, Some(p)) => p,
            (Some(p), Some(m)) if p == m => p,
            (Some(p), Some(m)) => bail!("two model folders given: {p} and --model {m}"),
            (None, None) => bail!("no model folder given (pruefstand sim-serve [serve] MODEL_DIR ...)"),
        };
        if let Some(extra) = positionals.next() {
            bail!("unexpected argument {extra:?} after the model folder {model_dir}");
        }
        Ok(ServeArgs {
            served_name: self.served.unwrap_or_else(|| model_dir.clone()),
            model_dir: PathBuf::from(model_dir),
            // vLLM binds every interface by default; a simulator started by hand should not
            // (the container path asks for 0.0.0.0 explicitly, inside its own network).
            host: self.host.unwrap_or_else(|| "127.0.0.1".into()),
            port: self.port.unwrap_or(8000),
            api_key: self.key.or(env_key).filter(|k| !k.is_empty()),
            lora_modules: self.lora_modules,
            ignored: self.ignored,
        })
    }
}

/// The values of the flag at argv[i]: inline `--f=v`, else the following non-flags (all
/// of them when `many`, else at most one); `i` moves past those it takes.
fn flag_values(argv: &[String], i: &mut usize, inline: Option<&str>, many: bool) -> Vec<String> {
    if let Some(v) = inline {
        return vec![v.to_string()];
    }
    let mut out = Vec::new();
    while *i + 1 < argv.len() && !is_flag(&argv[*i + 1]) && (many || out.is_empty()) {
        *i += 1;
        out.push(argv[*i].clone());
    }
    out
}

/// `name=path` or vLLM's JSON form `{"name": …, "path": …, "base_model_name": …}`.
fn parse_lora_module(spec: &str) -> anyhow::Result<(String, String)> {
    if spec.trim_start().starts_with('{') {
        let v: serde_json::Value =
            serde_json::from_str(spec).with_context(|| format!("--lora-modules {spec}: invalid JSON"))?;
        let field = |f: &str| v.get(f).and_then(|x| x.as_str()).map(str::to_string);
        let name = field("name").with_context(|| format!("--lora-modules {spec}: no \"name\""))?;
        return Ok((name, field("path").unwrap_or_default()));
    }
    match spec.split_once('=') {
        Some((name, path)) if !name.is_empty() => Ok((name.to_string(), path.to_string())),
        _ => bail!("--lora-modules {spec}: expected name=path"),
    }
}

fn load_settings(a: &ServeArgs) -> anyhow::Result<SimSettings> {
    let dir = &a.model_dir;
    anyhow::ensure!(
        dir.is_dir(),
        "model folder {} does not exist (it must hold sim.toml and truth.json)",
        dir.display()
    );
    let config = load_config(&dir.join("sim.toml"))?;
    let truth = Truth::load(&dir.join("truth.json"))?;
    Ok(SimSettings {
        config,
        truth: Arc::new(truth),
        served_name: a.served_name.clone(),
        adapters: a.lora_modules.iter().map(|(name, _)| name.clone()).collect(),
        api_key: a.api_key.clone(),
    })
}

fn load_config(path: &Path) -> anyhow::Result<SimConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the simulator's settings {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("parsing the simulator's settings {}", path.display()))
}

fn resolve(host: &str, port: u16) -> anyhow::Result<SocketAddr> {
    (host, port)
        .to_socket_addrs()
        .with_context(|| format!("resolving --host {host}"))?
        .next()
        .with_context(|| format!("--host {host} resolves to no address"))
}

async fn stop_signal() -> anyhow::Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    tokio::select! {
        _ = term.recv() => Ok("SIGTERM"),
        r = tokio::signal::ctrl_c() => r.map(|_| "SIGINT").context("waiting for SIGINT"),
    }
}

pub(crate) async fn main(args: Args) -> anyhow::Result<ExitCode> {
    let a = parse_vllm_args(&args.argv, std::env::var("VLLM_API_KEY").ok())?;
    for flag in &a.ignored {
        tracing::info!("ignoring vLLM option {flag} (simulated model)");
    }
    let settings = load_settings(&a)?;
    let addr = resolve(&a.host, a.port)?;
    if !addr.ip().is_loopback() && a.api_key.is_none() {
        tracing::warn!("serving on {addr} without an API key: anyone who can reach this address can use it");
    }
    {
        let server = Server::start(settings, addr).await?;
        tracing::info!(
            "simulated model {} (adapters {:?}) from {} listening on {}",
            a.served_name,
            a.lora_modules.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            a.model_dir.display(),
            server.local_addr()
        );
        let signal = stop_signal().await?;
        tracing::info!("{signal}: shutting down");
        server.shutdown().await?;
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn parses_the_vllm_shape() {
        let a = parse_vllm_args(
            &argv(
                "serve /m --served-model-name base alias --host 127.0.0.1 --port=9000 --max-model-len 32768 \
                   --gpu-memory-utilization 0.8 --enable-auto-tool-choice --tool-call-parser hermes --enable-lora \
                   --lora-modules a=/l/a b=/l/b --trust-remote-code",
            ),
            Some("envkey".into()),
        )
        .unwrap();
        assert_eq!(a.model_dir, PathBuf::from("/m"));
        assert_eq!((a.served_name.as_str(), a.host.as_str(), a.port), ("base", "127.0.0.1", 9000));
        assert_eq!(a.api_key.as_deref(), Some("envkey"));
        assert_eq!(a.lora_modules, [("a".into(), "/l/a".into()), ("b".into(), "/l/b".into())]);
        assert_eq!(a.ignored.len(), 6, "{:?}", a.ignored);
        assert!(a.ignored.contains(&"--gpu-memory-utilization 0.8".to_string()));
    }

    #[test]
    fn defaults_flag_first_and_json_lora() {
        let a = parse_vllm_args(&argv("--trust-remote-code /m --api-key k"), Some("env".into())).unwrap();
        assert_eq!((a.served_name.as_str(), a.port, a.host.as_str()), ("/m", 8000, "127.0.0.1"));
        assert_eq!(a.api_key.as_deref(), Some("k"), "the flag wins over VLLM_API_KEY");
        let a = parse_vllm_args(
            &["--model".into(), "/m".into(), "--lora-modules".into(), r#"{"name":"x","path":"/p"}"#.into()],
            None,
        )
        .unwrap();
        assert_eq!((a.model_dir, a.lora_modules), (PathBuf::from("/m"), vec![("x".into(), "/p".into())]));
    }

    #[test]
    fn rejects_what_it_cannot_use() {
        assert!(parse_vllm_args(&argv("serve"), None).is_err());
        assert!(parse_vllm_args(&argv("/m --port x"), None).is_err());
        assert!(parse_vllm_args(&argv("/m /n"), None).is_err());
        assert!(parse_vllm_args(&argv("/m --lora-modules nopath"), None).is_err());
    }

    #[test]
    fn missing_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let a = parse_vllm_args(&[dir.path().display().to_string()], None).unwrap();
        let err = format!("{:#}", load_settings(&a).unwrap_err());
        assert!(err.contains("sim.toml"), "{err}");
        std::fs::write(dir.path().join("sim.toml"), "seed = 3\n[models.base]\nsusceptibility = 0.5\n").unwrap();
        let err = format!("{:#}", load_settings(&a).unwrap_err());
        assert!(err.contains("truth.json"), "{err}");
        std::fs::write(dir.path().join("truth.json"), r#"{"suites":{}}"#).unwrap();
        let s = load_settings(&a).unwrap();
        assert_eq!((s.config.seed, s.config.models["base"].susceptibility), (3, 0.5));
        let gone = parse_vllm_args(&argv("/nonexistent/model"), None).unwrap();
        assert!(format!("{:#}", load_settings(&gone).unwrap_err()).contains("/nonexistent/model"));
    }
}
