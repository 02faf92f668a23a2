// Package agentsim is the whole agent checked by deterministic
// simulation (issue 49 item 3): its agentsim_test.go runs
// supervisor.RunHosted inside testing/synctest bubbles, seed after seed,
// with simulated trainers over net.Pipe (protocol.NewPipes), notices,
// signals and a faulty in-memory store (internal/storesim), and checks
// the guarantees of docs/reliability.md at the end of each schedule,
// progress among them (progress_test.go: in a quiet stretch the agent
// asks at its interval and commits what was answered). Run mode
// (child_test.go) runs supervisor.RunHostedChild, whose trainer is a
// simulated process of the bubble that the agent starts through
// Config.Child (a childproc.Starter), and checks the agent's exit code
// against docs/protocol.md "Exit codes"; part mode (parts_test.go) runs
// a job of two or three RunHosted node agents (Config.Node) on one
// store, their ranks agreeing by join, and checks that every manifest is
// a job manifest naming every node's part and holding every rank's save;
// notice_test.go checks a notice's edges (the Azure acknowledgement after
// the commit, a periodic upload in flight at the notice); localtier_test.go
// this machine's copies across sessions (the local tier, forged copies);
// pipeline_test.go the pipelined save (`saved`, files changed after it);
// peers_test.go a job's machines' copies through the real peer tier over
// an in-memory network (internal/testutil/memnet): new machines, forged
// copies, the whole job lost at once.
// It holds no code but its tests.
package agentsim
