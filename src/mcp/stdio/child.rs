//! The upstream as a child process: started, fed the queue, introduced again to the client's
//! session when it restarts, restarted after a pause that grows while it keeps exiting, and
//! stopped (its stdin closed, then SIGTERM, then SIGKILL).

use std::ffi::OsString;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{mpsc, oneshot, watch};

use super::{OWN_REQUEST_TIMEOUT, Pending, Router};
use crate::mcp::govern::Answer;
use crate::mcp::rpc;

/// The first pause before a restart, doubled while the upstream keeps exiting, up to
/// [`MAX_RESTART_PAUSE`].
const FIRST_RESTART_PAUSE: Duration = Duration::from_millis(200);
/// The longest pause before a restart.
const MAX_RESTART_PAUSE: Duration = Duration::from_secs(30);
/// An upstream that ran this long counts as healthy: its next restart starts the pauses over.
const HEALTHY_AFTER: Duration = Duration::from_secs(60);
/// How long a stopping upstream gets, after its stdin closed and again after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// Starts the upstream command, its stdin and stdout piped (its stderr is the gateway's).
pub(super) fn spawn_upstream(command: &[OsString]) -> Result<Child, String> {
    let Some((program, args)) = command.split_first() else {
        return Err("no upstream command: give it after --".to_string());
    };
    Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            format!(
                "cannot start the upstream {}: {e}",
                program.to_string_lossy()
            )
        })
}

/// Runs the upstream, one incarnation after another, until the gateway stops: each is
/// introduced to the client's session again (when it had one), then fed the queue, and when
/// it exits, what it left unanswered is answered and it is started again.
pub(super) async fn supervise(
    router: Arc<Router>,
    command: Vec<OsString>,
    first: Child,
    mut queue: mpsc::UnboundedReceiver<Value>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut child = Some(first);
    let mut pause = FIRST_RESTART_PAUSE;
    let mut restarted = false;
    loop {
        let Some(mut running) = child.take() else {
            return;
        };
        let started = tokio::time::Instant::now();
        let exit =
            run_incarnation(&router, &mut running, restarted, &mut queue, &mut stopped).await;
        restarted = true;
        if router.stopping.load(Ordering::SeqCst) {
            stop(running).await;
            router.upstream_gone("the gateway stopped");
            return;
        }
        let why = format!("the upstream exited ({exit}) before answering");
        tracing::warn!(status = %exit, "the upstream exited; starting it again");
        router.upstream_gone(&why);
        if started.elapsed() > HEALTHY_AFTER {
            pause = FIRST_RESTART_PAUSE;
        }
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            _ = stopped.wait_for(|s| *s) => return,
        }
        pause = (pause * 2).min(MAX_RESTART_PAUSE);
        match spawn_upstream(&command) {
            Ok(next) => child = Some(next),
            Err(e) => {
                tracing::error!(error = %e, "the upstream cannot be started again");
                // Kept trying: the queue still holds the client's messages.
                child = spawn_after_failures(&command, &mut stopped).await;
            }
        }
    }
}

/// Keeps trying to start the upstream (at the longest pause) until it starts or the gateway
/// stops.
async fn spawn_after_failures(
    command: &[OsString],
    stopped: &mut watch::Receiver<bool>,
) -> Option<Child> {
    loop {
        tokio::select! {
            () = tokio::time::sleep(MAX_RESTART_PAUSE) => {}
            _ = stopped.wait_for(|s| *s) => return None,
        }
        match spawn_upstream(command) {
            Ok(child) => return Some(child),
            Err(e) => tracing::error!(error = %e, "the upstream cannot be started again"),
        }
    }
}

/// One incarnation: reads its stdout, introduces it again, feeds it the queue; returns when it
/// exits (its stdout closed) or the gateway stops, with how it ended.
async fn run_incarnation(
    router: &Arc<Router>,
    child: &mut Child,
    restarted: bool,
    queue: &mut mpsc::UnboundedReceiver<Value>,
    stopped: &mut watch::Receiver<bool>,
) -> String {
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return "no pipes".to_string();
    };
    let reader_router = router.clone();
    let mut reader = tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<Value>(&line) {
                Ok(message) => reader_router.route_upstream(message),
                Err(e) => tracing::warn!(error = %e, "the upstream wrote a line that is not JSON"),
            }
        }
    });
    let mut stdin = stdin;
    // The first incarnation gets the client's own introduction from the queue.
    let introduced = !restarted || introduce(router, &mut stdin).await;
    let fed = async {
        if !introduced {
            return;
        }
        while let Some(message) = queue.recv().await {
            if write_message(&mut stdin, &message).await.is_err() {
                // Its stdin broke: it is exiting; the message's request is answered when its
                // stdout closes.
                return;
            }
        }
    };
    let output_closed = tokio::select! {
        () = fed => false,
        _ = &mut reader => true,
        _ = stopped.wait_for(|s| *s) => {
            drop(stdin);
            return "stopped".to_string();
        }
    };
    // The feeding ended (its stdin broke) or its stdout closed: wait for the exit itself (a
    // finished reader must not be awaited again).
    drop(stdin);
    if !output_closed {
        let _ = tokio::time::timeout(STOP_GRACE, &mut reader).await;
    }
    match tokio::time::timeout(STOP_GRACE, child.wait()).await {
        Ok(Ok(status)) => status.to_string(),
        Ok(Err(e)) => e.to_string(),
        Err(_) => "its output closed".to_string(),
    }
}

/// Introduces a restarted upstream to the client's session: the client's `initialize` again
/// (under the gateway's own id, its answer kept from the client) and its
/// `notifications/initialized`. Nothing to do for a client of the stateless revision. `false`
/// when the upstream did not take it.
async fn introduce(router: &Arc<Router>, stdin: &mut ChildStdin) -> bool {
    let introduction = router.lock_introduction().clone();
    let Some((initialize, initialized)) = introduction else {
        return true;
    };
    let n = router.own.fetch_add(1, Ordering::Relaxed);
    let mut again = initialize;
    if let Some(object) = again.as_object_mut() {
        object.insert("id".to_string(), rpc::own_id(n));
    }
    let (waiter, answer) = oneshot::channel();
    router.await_answer(&rpc::own_id(n), Pending::Waiting(waiter));
    if write_message(stdin, &again).await.is_err() {
        return false;
    }
    match tokio::time::timeout(OWN_REQUEST_TIMEOUT, answer).await {
        Ok(Ok(Answer::Response(response))) if response.get("result").is_some() => {}
        other => {
            tracing::warn!(answer = ?other.ok(), "the restarted upstream did not take the client's initialize");
            return false;
        }
    }
    if let Some(initialized) = initialized {
        return write_message(stdin, &initialized).await.is_ok();
    }
    true
}

async fn write_message(stdin: &mut ChildStdin, message: &Value) -> std::io::Result<()> {
    let mut line = message.to_string().into_bytes();
    line.push(b'\n');
    stdin.write_all(&line).await?;
    stdin.flush().await
}

/// Stops the upstream: its stdin is closed already; SIGTERM after a grace, SIGKILL after
/// another.
async fn stop(mut child: Child) {
    if tokio::time::timeout(STOP_GRACE, child.wait()).await.is_ok() {
        return;
    }
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        // SAFETY: kill(2) with a pid this process started and has not reaped yet.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
    if tokio::time::timeout(STOP_GRACE, child.wait()).await.is_ok() {
        return;
    }
    let _ = child.kill().await;
}
