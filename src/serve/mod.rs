//! `pruefstand serve`: a read-only local web view of one bench root — the live page
//! (`/`), the files under `reports/` (`/reports/…`), the daemon's state and the queue
//! as JSON (`/api/status` = `status --json`, `/api/queue` = `queue --json`) and the
//! live feed as server-sent events (`/events`). GET and HEAD only; no login, no
//! writes, nothing that changes the queue. Every answer carries
//! `X-Content-Type-Options: nosniff` and the Content-Security-Policy `serve::csp`
//! decides (never one a served file declares); on a loopback
//! address a request must name a loopback host (no DNS rebinding). Remote access is
//! the user's own proxy's job (docs/serve.md). Not the argument checks (`cmd::serve`).

mod csp;
mod files;
mod limit;
mod live;
mod page;

use std::convert::Infallible;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures_util::Stream;

use crate::daemon::state::Overview;
use files::Lookup;
use live::Feeds;
use pruefstand_core::queue::Queue;
use pruefstand_core::root::Root;

/// How long a shutdown waits for answers in flight before it leaves anyway.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// What one read of a served file holds in memory.
const CHUNK: usize = 16 * 1024;

#[derive(Clone)]
struct App {
    queue: Queue,
    /// Canonical: every file served must resolve below it.
    reports: Arc<PathBuf>,
    feeds: Feeds,
    /// Whether the Host header must name a loopback host.
    loopback_only: bool,
}

/// Serves the bench root on `listener`, at most `max_connections` at once, until `stop`
/// completes, then closes the event streams and waits up to [`SHUTDOWN_GRACE`] for
/// answers in flight.
pub(crate) async fn serve(
    root: &Root,
    listener: tokio::net::TcpListener,
    max_connections: usize,
    stop: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let queue = Queue::open(root)?;
    let reports = root.reports();
    std::fs::create_dir_all(&reports).with_context(|| format!("creating {}", reports.display()))?;
    let reports = reports.canonicalize().with_context(|| format!("resolving {}", reports.display()))?;
    let (live, feeds) = live::start(queue.clone(), reports.clone())?;
    let loopback_only = listener.local_addr()?.ip().is_loopback();
    let app = App { queue, reports: Arc::new(reports), feeds, loopback_only };
    let router = Router::new()
        .route("/", get(index))
        .route("/events", get(events))
        .route("/api/status", get(api_status))
        .route("/api/queue", get(api_queue))
        .route("/reports", get(report_file))
        .route("/reports/", get(report_file))
        .route("/reports/{*path}", get(report_file))
        .fallback(fallback)
        .layer(axum::middleware::from_fn_with_state(app.clone(), guard))
        .with_state(app);
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        stop.await;
        // The feed ends, and with it every open event stream.
        drop(live);
        let _ = closed_tx.send(());
    };
    let server = axum::serve(limit::Capped::new(listener, max_connections), router).with_graceful_shutdown(shutdown);
    let server = tokio::spawn(async move { server.await });
    let _ = closed_rx.await;
    match tokio::time::timeout(SHUTDOWN_GRACE, server).await {
        Ok(result) => result.context("the server task")?.context("serving"),
        Err(_) => {
            tracing::warn!("answers still in flight after {} s: leaving anyway", SHUTDOWN_GRACE.as_secs());
            Ok(())
        }
    }
}

/// Before every route: GET and HEAD only, a loopback Host on a loopback address; after
/// it, the headers every answer carries.
async fn guard(State(app): State<App>, request: Request, next: axum::middleware::Next) -> Response {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut response = (StatusCode::METHOD_NOT_ALLOWED, "read-only: GET only\n").into_response();
        response.headers_mut().insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return secured(response);
    }
    if app.loopback_only && !loopback_host(request.headers()) {
        return secured((StatusCode::MISDIRECTED_REQUEST, "this server answers to localhost only\n").into_response());
    }
    secured(next.run(request).await)
}

/// Whether the Host header names this machine's loopback: `localhost`, `127.x.x.x` or
/// `[::1]`, any port. A web page elsewhere that resolves its own name to 127.0.0.1
/// sends its own name and is refused.
fn loopback_host(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else { return false };
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn secured(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.entry(header::CONTENT_SECURITY_POLICY).or_insert(HeaderValue::from_static(csp::STRICT));
    headers.entry(header::CACHE_CONTROL).or_insert(HeaderValue::from_static("no-store"));
    response
}

async fn index() -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8")),
            (header::CONTENT_SECURITY_POLICY, HeaderValue::from_str(&csp::LIVE_PAGE).expect("a plain header")),
        ],
        page::PAGE.as_str(),
    )
        .into_response()
}

/// The feeds as server-sent events: each feed's current text at once (`status`, then
/// `jobs`), then every change; a comment every 15 s keeps proxies from closing it.
async fn events(State(app): State<App>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let mut feeds = app.feeds.clone();
    feeds.status.mark_changed();
    feeds.jobs.mark_changed();
    let stream = futures_util::stream::unfold(feeds, |mut feeds| async move {
        let (name, text) = tokio::select! {
            biased;
            changed = feeds.status.changed() => { changed.ok()?; ("status", feeds.status.borrow_and_update().clone()) }
            changed = feeds.jobs.changed() => { changed.ok()?; ("jobs", feeds.jobs.borrow_and_update().clone()) }
        };
        Some((Ok(Event::default().event(name).data(&*text)), feeds))
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

async fn api_status(State(app): State<App>) -> Response {
    blocking_json(move || Ok(Overview::read(&app.queue, &app.queue.list()?)?.to_json())).await
}

async fn api_queue(State(app): State<App>) -> Response {
    blocking_json(move || Ok(serde_json::to_value(app.queue.list()?)?)).await
}

async fn blocking_json(read: impl FnOnce() -> anyhow::Result<serde_json::Value> + Send + 'static) -> Response {
    match tokio::task::spawn_blocking(move || pruefstand_core::blocking::section(read)).await {
        Ok(Ok(value)) => axum::Json(value).into_response(),
        Ok(Err(err)) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{err:#}\n")).into_response(),
        Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{err}\n")).into_response(),
    }
}

async fn report_file(State(app): State<App>, uri: Uri) -> Response {
    let raw = uri.path().to_string();
    let reports = app.reports.clone();
    let found =
        tokio::task::spawn_blocking(move || pruefstand_core::blocking::section(move || files::find(&reports, &raw)))
            .await
            .unwrap_or(Lookup::NotFound);
    match found {
        Lookup::File { content, content_type, csp: policy } => {
            let policy = HeaderValue::from_str(policy).unwrap_or(HeaderValue::from_static(csp::STRICT));
            let body = match content {
                files::Content::Bytes(bytes) => Body::from(bytes),
                files::Content::Open(file) => Body::from_stream(chunks(tokio::fs::File::from_std(file))),
            };
            let response = ([(header::CONTENT_TYPE, HeaderValue::from_static(content_type))], body);
            let mut response = response.into_response();
            response.headers_mut().insert(header::CONTENT_SECURITY_POLICY, policy);
            response
        }
        Lookup::Redirect(to) => match HeaderValue::from_str(&to) {
            Ok(to) => (StatusCode::PERMANENT_REDIRECT, [(header::LOCATION, to)]).into_response(),
            Err(_) => StatusCode::BAD_REQUEST.into_response(),
        },
        Lookup::BadPath => (StatusCode::BAD_REQUEST, "not a path below reports/\n").into_response(),
        Lookup::NotFound => (StatusCode::NOT_FOUND, "not found\n").into_response(),
    }
}

/// A file's bytes in chunks of [`CHUNK`], each read only when the connection has sent
/// the one before.
fn chunks(file: tokio::fs::File) -> impl Stream<Item = std::io::Result<Vec<u8>>> {
    use tokio::io::AsyncReadExt;
    futures_util::stream::unfold(Some(file), |file| async move {
        let mut file = file?;
        let mut chunk = vec![0; CHUNK];
        match file.read(&mut chunk).await {
            Ok(0) => None,
            Ok(n) => {
                chunk.truncate(n);
                Some((Ok(chunk), Some(file)))
            }
            Err(err) => Some((Err(err), None)),
        }
    })
}

async fn fallback() -> Response {
    (StatusCode::NOT_FOUND, "not found\n").into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn only_loopback_hosts_pass_on_a_loopback_address() {
        for ok in ["localhost:8470", "127.0.0.1:8470", "127.0.0.1", "[::1]:8470", "LOCALHOST"] {
            assert!(loopback_host(&host(ok)), "{ok}");
        }
        for refused in ["evil.example:8470", "localhost.evil.example", "10.0.0.1:8470", "[fe80::1]:80", ""] {
            assert!(!loopback_host(&host(refused)), "{refused}");
        }
        assert!(!loopback_host(&HeaderMap::new()), "no Host header");
    }
}
