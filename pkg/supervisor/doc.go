// Package supervisor is the agent: the loop that asks for checkpoints and
// commits them, reacts to notices and supervises the trainer. Node mode,
// which hosts one agent per run (RunHosted), is pkg/supervisor/nodemode;
// the checkpoint sources' interface and zero-code mode are
// pkg/supervisor/source, the ranks' tracker and the heartbeats
// pkg/supervisor/internal/ranks, the notice checkpoint's promise
// pkg/supervisor/promise. Owners of the agent's state that need nothing of
// the others are packages below it too: Config (pkg/supervisor/internal/config),
// the local directories (pkg/supervisor/internal/localdirs), the child process
// (pkg/supervisor/internal/childproc), the session and its journal
// (pkg/supervisor/internal/session), the restore beside the trainers
// (pkg/supervisor/internal/bootrestore); so are the status types
// (pkg/supervisor/internal/status). The start-up's signals are restore.go's
// (startSignals) and stop.go's (signalNotice).
// The wire protocol (types, the socket server, the Go client) is
// pkg/protocol; the trainer process and its group guard are internal/child.
//
// A checkpoint goes request → settle → upload → committed or failed. The
// loop sends `checkpoint` to every trainer (request); once each has
// answered `done`, `failed` or gone away the request settles; a settled
// request is uploaded beside the loop (commit), and its result comes back
// to the loop as `committed` or `upload_failed`, which every trainer is
// told. A request nobody answers by its deadline expires.
//
// The stop sequence: a notice (cloud, lease fence, or the first SIGTERM)
// → an interruption (or shutdown) request, due early enough to leave the
// upload and Margin before the notice's deadline; periodic uploads are
// cancelled → its commit → `stop` to the
// trainers → the child exits (SIGTERM at the deadline, SIGKILL after
// KillAfter) → the agent exits 75 (ExitInterrupted: run me again), 76
// (exitFenced: a newer session owns the run) or the child's own code. A
// second signal, or cancelling Run's ctx, skips to the child's SIGTERM.
//
// One goroutine, the loop, owns the agent's state, grouped by owner: the
// child process, the trainers and their connections, the commits, the stop
// sequence, the start-up restore, the session and its journal, the ranks;
// Agent keeps the loop's select and one field per owner. Everything else
// it starts is owned by the agent's lifetime (Agent.life, Agent.bg) and
// ended and waited for before Run returns (agent_loop.go). The file map,
// file by file, is docs/architecture.md (the only one; a test keeps it
// complete).
package supervisor
