package protocol

// The exit codes every side of the protocol agrees on: the agent's, the
// Python client's (spotagent._common.EXIT_INTERRUPTED) and a rank's exit
// file. The one definition; docs/usage.md "Exit codes" lists them with the
// rest (the trainer's own, 1, 2, 126, 127).
const (
	// ExitInterrupted (75, EX_TEMPFAIL in sysexits.h): interrupted, the
	// checkpoint is committed (or a best effort was made), run me again.
	// Orchestrators restart on it: a Kubernetes Job's podFailurePolicy
	// ignores it, systemd's Restart=on-failure restarts it.
	ExitInterrupted = 75
	// ExitFenced (76): a newer session of the run took it over. Not 75:
	// restarting a fenced agent would fence the newer session in turn.
	ExitFenced = 76
)
