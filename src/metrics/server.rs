//! [`MetricsServer`]: a small HTTP server (`tiny_http`) on its own threads answering
//! `GET /metrics` with the totals of every [`MetricsSources`] entry.
//!
//! Routes: `GET /metrics` (`OpenMetrics` text), `GET /` (a one-line pointer to `/metrics`),
//! anything else 404 (405 for other methods on `/metrics`). The server stops when the
//! value is dropped or [`MetricsServer::stop`] is called.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::thread::JoinHandle;

use tiny_http::{Header, Method, Request, Response, Server};

use super::{exposition, MetricsError, MetricsSources, COLLECT_TIMEOUT};

/// The running metrics endpoint.
pub struct MetricsServer {
    local_addr: SocketAddr,
    server: Arc<Server>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for MetricsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsServer")
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

impl MetricsServer {
    /// Binds `addr` (port 0 picks a free port) and serves `sources` on a new thread.
    ///
    /// # Errors
    ///
    /// [`MetricsError::Bind`] when the address cannot be bound, [`MetricsError::Server`] or
    /// [`MetricsError::Thread`] when the server cannot start.
    pub fn start(addr: SocketAddr, sources: Arc<MetricsSources>) -> Result<Self, MetricsError> {
        let listener =
            TcpListener::bind(addr).map_err(|source| MetricsError::Bind { addr, source })?;
        let local_addr = listener
            .local_addr()
            .map_err(|source| MetricsError::Bind { addr, source })?;
        let server = Arc::new(Server::from_listener(listener, None).map_err(|source| {
            MetricsError::Server {
                addr: local_addr,
                source,
            }
        })?);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .map_err(MetricsError::Thread)?;
        let serving = Arc::clone(&server);
        let thread = std::thread::Builder::new()
            .name("kvc-metrics".into())
            .spawn(move || {
                tracing::info!(target: crate::logging::ANNOUNCE, addr = %local_addr, "metrics endpoint listening");
                for request in serving.incoming_requests() {
                    answer(request, &sources, &runtime);
                }
            })
            .map_err(MetricsError::Thread)?;
        Ok(Self {
            local_addr,
            server,
            thread: Some(thread),
        })
    }

    /// The bound address (with the port the system picked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops serving and joins the server thread.
    pub fn stop(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        if let Some(thread) = self.thread.take() {
            self.server.unblock();
            if thread.join().is_err() {
                tracing::error!(addr = %self.local_addr, "the metrics server thread panicked");
            }
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// Answers one request; a client that hung up is only logged.
fn answer(request: Request, sources: &MetricsSources, runtime: &tokio::runtime::Runtime) {
    let path = request.url().split('?').next().unwrap_or("");
    let response = match (request.method(), path) {
        (Method::Get, "/metrics") => scrape(sources, runtime),
        (_, "/metrics") => text(405, "only GET is served\n"),
        (Method::Get, "/") => text(200, "kv-connector metrics: GET /metrics\n"),
        _ => text(404, "not found; GET /metrics\n"),
    };
    if let Err(err) = request.respond(response) {
        tracing::debug!(error = %err, "metrics client went away");
    }
}

fn scrape(
    sources: &MetricsSources,
    runtime: &tokio::runtime::Runtime,
) -> Response<std::io::Cursor<Vec<u8>>> {
    match exposition::encode(sources.snapshot(runtime, COLLECT_TIMEOUT)) {
        Ok(body) => with_type(
            Response::from_string(body),
            exposition::CONTENT_TYPE.as_bytes(),
        ),
        Err(_) => text(500, "encoding the metrics failed\n"),
    }
}

fn text(status: u16, body: &str) -> Response<std::io::Cursor<Vec<u8>>> {
    with_type(Response::from_string(body), b"text/plain; charset=utf-8").with_status_code(status)
}

fn with_type(
    response: Response<std::io::Cursor<Vec<u8>>>,
    content_type: &[u8],
) -> Response<std::io::Cursor<Vec<u8>>> {
    match Header::from_bytes(&b"Content-Type"[..], content_type) {
        Ok(header) => response.with_header(header),
        Err(()) => response,
    }
}
