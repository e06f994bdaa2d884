//! Serving one listener under the transport limits: a bounded number of connections, each
//! closed when its request headers are slow or it sits idle, all closed gracefully on stop.

use std::convert::Infallible;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::serve::Listener;
use axum::Router;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper::service::Service;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The bounds every connection on a listener is served under (`[listen]`).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// A request whose headers are not complete by then is dropped with its connection.
    pub header_timeout: Duration,
    /// A connection with no request in flight for this long is closed.
    pub idle_timeout: Duration,
    /// Connections served at once; beyond it, new ones wait in the kernel's backlog.
    pub max_connections: usize,
}

/// Serves `router` on `listener` until `stop` is cancelled, then stops accepting (the listener
/// is dropped, so new connections are refused), asks every open connection to finish its
/// request in flight and close, and returns once they all have. Dropping the returned future
/// drops every connection at once.
pub async fn serve<L: Listener>(
    mut listener: L,
    router: Router,
    limits: Limits,
    stop: CancellationToken,
    open: Gauge,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut connections = JoinSet::new();
    loop {
        // The slot is taken before accepting, so that a flood beyond the limit waits in the
        // backlog and costs this process nothing.
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot,
            () = stop.cancelled() => break,
        };
        // The semaphore is never closed; this only guards against that changing.
        let Ok(slot) = slot else { break };
        let io = tokio::select! {
            (io, _) = listener.accept() => io,
            () = stop.cancelled() => break,
        };
        while connections.try_join_next().is_some() {}
        let counted = Open::counted(&open);
        connections.spawn(serve_connection(
            io,
            router.clone(),
            limits,
            stop.clone(),
            (slot, counted),
        ));
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

/// Serves one connection until the client closes it, its header or idle bound runs out, or
/// `stop` asks it to finish. Its slot is given back, and its count taken back, when it ends.
async fn serve_connection<I>(
    io: I,
    router: Router,
    limits: Limits,
    stop: CancellationToken,
    _held: (OwnedSemaphorePermit, Open),
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let service = Tracked {
        router: TowerToHyperService::new(router),
        activity: activity.clone(),
    };
    // HTTP/1 only: hyper's header-read bound exists for HTTP/1 alone, and nothing speaks
    // HTTP/2 to the daemon.
    let mut builder = auto::Builder::new(TokioExecutor::new()).http1_only();
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let mut connection = pin!(builder.serve_connection(TokioIo::new(io), service));
    let mut closing = false;
    loop {
        // While a request is in flight (a stream may be quiet for minutes) nothing is idle;
        // look again one idle bound later.
        let look_at = activity
            .idle_until(limits.idle_timeout)
            .unwrap_or_else(|| Instant::now() + limits.idle_timeout);
        tokio::select! {
            served = connection.as_mut() => {
                if let Err(e) = served {
                    tracing::debug!(error = %e, "connection closed on an error");
                }
                return;
            }
            () = stop.cancelled(), if !closing => {
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
            () = tokio::time::sleep_until(look_at), if !closing => {
                if activity
                    .idle_until(limits.idle_timeout)
                    .is_some_and(|until| until <= Instant::now())
                {
                    connection.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
        }
    }
}

/// One open connection, counted in its listener's gauge while it lives.
struct Open(Gauge);

impl Open {
    fn counted(gauge: &Gauge) -> Open {
        gauge.inc();
        Open(gauge.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Whether a connection has a request in flight, and since when it has had none.
struct Activity {
    requests: AtomicUsize,
    idle_since: Mutex<Instant>,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            requests: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
        }
    }

    /// A request has begun; it lasts until the guard is dropped.
    fn begin(self: &Arc<Self>) -> Busy {
        self.requests.fetch_add(1, Ordering::SeqCst);
        Busy(self.clone())
    }

    /// When the connection has been idle for `bound`, or `None` while a request is in flight.
    fn idle_until(&self, bound: Duration) -> Option<Instant> {
        if self.requests.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let since = *self
            .idle_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Some(since + bound)
    }
}

/// One request in flight, from its headers to the last byte of its answer.
struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        // The time first, so that a look between the two never sees an old idle time with no
        // request in flight.
        *self
            .0
            .idle_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Instant::now();
        self.0.requests.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The router as a hyper service whose requests count as activity until their answer's body
/// has been sent (or dropped).
struct Tracked {
    router: TowerToHyperService<Router>,
    activity: Arc<Activity>,
}

type Answer = Pin<Box<dyn Future<Output = Result<Response<TrackedBody>, Infallible>> + Send>>;

impl Service<Request<Incoming>> for Tracked {
    type Response = Response<TrackedBody>;
    type Error = Infallible;
    type Future = Answer;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let busy = self.activity.begin();
        let answer = self.router.call(request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(response.map(|body| TrackedBody {
                body,
                busy: Some(busy),
            }))
        })
    }
}

/// An answer's body that ends its request's activity when it ends.
struct TrackedBody {
    body: Body,
    busy: Option<Busy>,
}

impl HttpBody for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let frame = ready!(Pin::new(&mut this.body).poll_frame(cx));
        if frame.is_none() {
            this.busy = None;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
