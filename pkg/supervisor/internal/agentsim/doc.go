// Package agentsim is the whole agent checked by deterministic
// simulation (issue 49 item 3): its agentsim_test.go runs
// supervisor.RunHosted inside testing/synctest bubbles, seed after seed,
// with simulated trainers over net.Pipe (protocol.NewPipes), notices,
// signals and a faulty in-memory store (internal/storesim), and
// checks the guarantees of docs/reliability.md at the end of each
// schedule. It holds no code but its test.
package agentsim
