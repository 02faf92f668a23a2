// Package supervisor is the agent: the loop that asks for checkpoints and
// commits them, reacts to notices and supervises the trainer, and node
// mode. The wire protocol (types, the socket server, the Go client) is
// pkg/protocol; the trainer process and its group guard are
// internal/child.
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
// One goroutine, the loop, owns the agent's state; everything else it
// starts is owned by the agent's lifetime (Agent.life, Agent.bg) and ended
// and waited for before Run returns (agent_loop.go).
//
// Files:
//
//	agent.go                   Config, local directories, restore, cleanup
//	agent_loop.go              Run, the loop, the child's exit, the lifetime
//	agent_notice.go            trainer events (onEvent), notices and the stop sequence
//	agent_request.go           requests, settle, commit, results
//	agent_pipeline.go          `saved`: uploads that start before `done`
//	agent_job.go               part mode: one node of a multi-node job (join, parts)
//	agent_fence.go             the lease, fencing by a newer session (or copy of a node)
//	source.go                  the checkpoint source the loop drives: the protocol (default) or zero-code mode
//	agent_watch.go             zero-code mode (a watched directory), one checkpoint source
//	agent_status.go            the status reply
//	signal_bridge.go           the signal fallback for trainers without the protocol
//	node.go                    node mode: one socket, one agent per run (and node rank)
//	machine.go, metrics.go     the identity written to the store; the Metrics hook
package supervisor
